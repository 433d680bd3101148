"""temper's benchmarks, each run from the repository's root as `python -m benchmarks.NAME` (README.md)."""
