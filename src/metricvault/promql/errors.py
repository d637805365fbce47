"""The engine's error. It lives here until the store interface settles; it then moves to
:mod:`metricvault.errors` (issue 13). Messages are worded as Prometheus words them, so clients
that match on them (Grafana, promtool) behave the same."""

from __future__ import annotations

from metricvault.errors import MetricVaultError


class PromQLError(MetricVaultError):
    """``kind`` is the Prometheus API error type: ``bad_data`` (the query can never succeed:
    syntax, types, bad parameters; HTTP 400) or ``execution`` (it failed on the data, e.g.
    many-to-many matching, duplicate label sets; HTTP 422)."""

    def __init__(self, message: str, kind: str = "execution") -> None:
        super().__init__(message)
        self.kind = kind
        self.status = 400 if kind == "bad_data" else 422
