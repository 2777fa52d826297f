"""Floor 6, the front end: callsat's tinygrad-style Tensor, its indexing, RNG, function tracing and the demo models."""
