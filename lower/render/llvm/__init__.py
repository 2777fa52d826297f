"""Kernel IR -> LLVM IR text: the module, one function per kernel, instruction selection, streaming stores and the
packed matmul."""
