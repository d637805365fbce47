"""Unit tests: in-process, no servers."""
