"""Ingest: wire-protocol decoders (pure ``bytes -> Arrow``) and the gateway that feeds the store."""
