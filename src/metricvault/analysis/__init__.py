"""Analyses over the vault's history: what normal looks like (baselines) and how far from it
new data is. A layer above the store: it reads through the store's public read API (rollup
buckets, PromQL) and writes its results back as ordinary series through ``vault.write``."""
