"""Lowering, rendering: kernel IR -> source text. base: what every renderer shares; llvm/: LLVM IR for the host CPU;
cuda/: CUDA C."""
