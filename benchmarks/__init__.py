"""Benchmarks of pipeline_opt (run them with ``python -m benchmarks.<name>``; see README.md)."""
