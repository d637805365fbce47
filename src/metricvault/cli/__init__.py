"""The ``metricvault`` command line: a thin layer over the Python API."""

from metricvault.cli.main import app, main

__all__ = ["app", "main"]
