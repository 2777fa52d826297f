"""Kernel IR -> CUDA C: the renderer and launch plan (render) and how values and ops are spelled (ops)."""
