"""Benchmarks for metricvault, run side by side with peers on the same data (see README.md)."""
