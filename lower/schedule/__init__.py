"""Lowering, scheduling: the kernel IR, CALL -> kernels (kernelize, builder, inline, finalize), storage ranges and the
work each kernel does. Renderer-independent."""
