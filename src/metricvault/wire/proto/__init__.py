"""Prometheus remote-write schemas: readable ``.proto`` files and the classes built from them."""
