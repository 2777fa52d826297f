"""Floor 3, fusion by cost: which intermediates get a buffer, chosen under a calibrated kernel time model (solve: the
candidates, kernels and the MILP; greedy: its local search; timemodel: the calibrated model)."""
