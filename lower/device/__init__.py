"""Lowering, devices: compiling and running kernels. The LLVM JIT and its compiler, the kernel cache, native launches and
thread pools (CPU), and the CUDA driver (or its CPU emulator)."""
