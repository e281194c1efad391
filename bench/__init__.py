"""Benchmarks: python -m bench [--quick] (docs/benchmarking.md, docs/benchmarks.md)."""
