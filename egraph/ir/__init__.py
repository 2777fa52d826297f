"""Floor 1, the IR: nodes and the op table (ops), dtypes, symbolic dimensions, strided views, storage, errors, the graph
corpus format and the package faces. Imports nothing above it (no egglog, no lowering)."""
