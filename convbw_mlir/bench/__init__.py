"""Benchmarks: the ISA matrix (compile-only, every AMD/NVIDIA target) and the GPU runs."""
