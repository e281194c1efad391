"""Benchmarks: python -m bench [--quick] (README.md, docs/benchmarks.md)."""
