"""Kernel micro-benchmarks and check_all (run from the repository root: ``python -m bench.kernels.NAME``)."""
