"""Floor 3, the e-graph engine: encode a graph as egglog rows, saturate (runner), extract, build the CALL, and the driver
that runs them (callify)."""
