"""Floor 5, the research kit's rule testing: the property checker, soundness on the saturated e-graph, and hypothesis
strategies for random graphs."""
