"""``select``: filter experiment records, at the import path docs/archive.md shows users.

The record and its filters live in :mod:`metricvault.experiment`, the file registry in
:mod:`metricvault.store.experiments`; this module is documented API, not a shim, so the
example in the guide keeps working.
"""

from __future__ import annotations

from metricvault.experiment import select

__all__ = ["select"]
