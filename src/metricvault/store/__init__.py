"""The embedded tiered store: ingest buffer, catalog, Parquet files, rollups, retention, query."""
