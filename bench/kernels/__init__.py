"""Kernel micro-benchmarks, check_all (the kernels against their twins on a GPU) and compile_all (their GPU
launches compiled, no GPU needed); run from the repository root: ``python -m bench.kernels.NAME``."""
