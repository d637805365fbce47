"""What metricvault keeps inside the InfluxDB database besides samples (policy
``rp_metricvault_meta``, duration INF). The measurement names contain a '.', which no metric
name can, so they never collide with data and are skipped when series are listed:

- ``metricvault.experiments``: one point per experiment, tag ``id``, string field ``record``
  (the JSON record, as the embedded store's ``experiments/<id>.json``), at time 0 — a write of
  the same id and time replaces it, so the latest write wins;
- ``metricvault.kinds``: one point per metric whose kind was given (``write(kinds=...)`` or
  exposition metadata), tag ``metric``, string field ``kind``, at time 0;
- ``metricvault.dirty``: late-write markers. After its samples are acknowledged, every write
  adds one point per measurement, tag ``m``, integer fields ``lo``/``hi`` (the first and last
  minute it touched), stamped with the send time in nanoseconds. ``maintain`` recomputes the
  1-minute rollups of those minutes and then deletes exactly the markers it read, so a marker
  written meanwhile survives until the next run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from metricvault.errors import InputError
from metricvault.experiment import Experiment, RegistryBase
from metricvault.model import TIER_RESOLUTION_MS
from metricvault.store.backends.influx_client import InfluxClient, ident, literal
from metricvault.store.backends.influx_lines import escape_tag, string_field

EXPERIMENTS = "metricvault.experiments"
KINDS = "metricvault.kinds"
DIRTY = "metricvault.dirty"
MAX_STRING_BYTES = 64 * 1024  # InfluxDB 1.x's limit for a string field value
MINUTE_MS = TIER_RESOLUTION_MS["1m"]  # the 1m tier's bucket width (model.py owns the tiers)


class InfluxExperiments(RegistryBase):
    """The experiment registry of an InfluxDB-backed vault; the same methods, checks and
    errors as every registry (:class:`metricvault.experiment.RegistryBase`).

    InfluxDB has no conditional write, so two processes creating the same id at the same
    moment can both succeed (the later record wins); a single process gets ConflictError."""

    def __init__(self, client: InfluxClient, rp: str) -> None:
        self.client = client
        self.rp = rp
        self.where = client.target.uri

    def _load(self, experiment_id: str) -> Experiment | None:
        return self._records(experiment_id).get(experiment_id)

    def _all(self) -> list[Experiment]:
        return list(self._records().values())

    def _store(self, exp: Experiment, *, new: bool) -> bool:
        if new and exp.id in self:
            return False
        self._put(exp)
        return True

    # ------------------------------------------------------------------ storage
    def _put(self, exp: Experiment) -> None:
        record = json.dumps(exp.to_record(), sort_keys=True, separators=(",", ":"))
        size = len(record.encode())
        if size > MAX_STRING_BYTES:
            raise InputError(
                f"experiment {exp.id!r} is {size} bytes as JSON; InfluxDB 1.x stores at most "
                f"{MAX_STRING_BYTES} bytes in a string field: shorten its notes or params"
            )
        line = f"{EXPERIMENTS},id={escape_tag(exp.id)} record={string_field(record)} 0\n"
        self.client.write(line.encode(), self.rp)

    def _records(self, experiment_id: str | None = None) -> dict[str, Experiment]:
        where = f' WHERE "id" = {literal(experiment_id)}' if experiment_id else ""
        rows = self.client.series(
            f'SELECT "record" FROM {ident(self.rp)}.{ident(EXPERIMENTS)}{where} GROUP BY "id"'
        )
        found = {}
        for series in rows:
            for _, record in series["values"][-1:]:  # one point per id; the latest if more
                exp = Experiment.from_record(json.loads(record))
                found[exp.id] = exp
        return found


# --------------------------------------------------------------------------- metric kinds
def load_kinds(client: InfluxClient, rp: str) -> dict[str, str]:
    rows = client.series(f'SELECT "kind" FROM {ident(rp)}.{ident(KINDS)} GROUP BY "metric"')
    return {s["tags"]["metric"]: str(s["values"][-1][1]) for s in rows if s.get("values")}


def store_kinds(client: InfluxClient, rp: str, kinds: dict[str, str]) -> None:
    lines = [
        f"{KINDS},metric={escape_tag(m)} kind={string_field(k)} 0" for m, k in sorted(kinds.items())
    ]
    if lines:
        client.write(("\n".join(lines) + "\n").encode(), rp)


# --------------------------------------------------------------------------- late writes
@dataclass(frozen=True)
class Marker:
    measurement: str
    time_ns: int  # when it was sent: its identity for the exact delete
    lo: int  # first minute touched (ms)
    hi: int  # last minute touched (ms)


def marker_body(touched: dict[str, tuple[int, int]]) -> Callable[[], bytes]:
    """Markers for ``{measurement: (first ts, last ts)}``, stamped when sent (each attempt)."""

    def body() -> bytes:
        now = time.time_ns()
        lines = [
            f"{DIRTY},m={escape_tag(m)} lo={lo // MINUTE_MS * MINUTE_MS}i,"
            f"hi={hi // MINUTE_MS * MINUTE_MS}i {now + i}"
            for i, (m, (lo, hi)) in enumerate(sorted(touched.items()))
        ]
        return ("\n".join(lines) + "\n").encode()

    return body


def read_markers(client: InfluxClient, rp: str) -> list[Marker]:
    rows = client.series(
        f'SELECT "lo", "hi" FROM {ident(rp)}.{ident(DIRTY)} GROUP BY "m"', epoch="ns"
    )
    return [
        Marker(s["tags"]["m"], int(t), int(lo), int(hi))
        for s in rows
        for t, lo, hi in s["values"]
        if lo is not None and hi is not None
    ]


def pending_since(client: InfluxClient, rp: str) -> dict[str, int]:
    """measurement -> its earliest minute with writes not yet rolled up (the rollups of that
    measurement are complete before it)."""
    rows = client.series(f'SELECT min("lo") FROM {ident(rp)}.{ident(DIRTY)} GROUP BY "m"')
    return {s["tags"]["m"]: int(s["values"][0][1]) for s in rows if s.get("values")}


def delete_markers(client: InfluxClient, markers: list[Marker], per_request: int = 200) -> None:
    """Delete exactly these markers (their tag and nanosecond time)."""
    statements = [
        f'DELETE FROM {ident(DIRTY)} WHERE "m" = {literal(m.measurement)} '
        f"AND time >= {m.time_ns} AND time <= {m.time_ns}"
        for m in markers
    ]
    for start in range(0, len(statements), per_request):
        client.query("; ".join(statements[start : start + per_request]))
