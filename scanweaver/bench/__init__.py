"""Benchmarks: ScanWeaver against NumPy, numba, PyTorch, JAX, mambapy (and GPU peers).

`python -m scanweaver.bench.harness [--full]`; see `harness.py`.  Peer libraries are
optional (the `bench` extra); missing ones are skipped with the reason.
"""

from scanweaver.bench.harness import main, run_benchmark

__all__ = ["main", "run_benchmark"]
