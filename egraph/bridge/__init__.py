"""Floor 6, the tinygrad bridge: callsat's callify inside tinygrad 0.14 (install: the pass and the pytest plugin, public
as egraph.tinygrad), the UOp conversion both ways, the structural cache, the cost-mode shadow and corpus capture."""
