"""The engine's error, defined with every other one in :mod:`metricvault.errors` (issue 12)."""

from __future__ import annotations

from metricvault.errors import PromQLError as PromQLError  # moved: issue 12
