"""Experiments and their frozen metric snapshots (Parquet, DVC, git tags)."""
