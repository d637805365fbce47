"""``metricvault influx setup``: the database, retention policies and continuous query.

Names and durations come from the same tier settings as the embedded store:

- ``rp_raw_<retention_raw>`` (default ``rp_raw_30d``, 30 d, the DEFAULT policy): raw samples;
- ``rp_longterm_<retention_1m>`` (default ``rp_longterm_3y``, 1095 d): 1-minute rollups;
- ``rp_metricvault_meta`` (INF): the experiment registry, metric kinds and the late-write
  markers that ``maintain`` consumes. A policy of its own keeps them out of the continuous
  query (which reads every measurement of the raw policy) and away from raw retention.

The continuous query ``cq_metricvault_1m`` writes ``mean``, ``min``, ``max``, ``count`` and
``last`` of every measurement per minute into the long-term policy, keeping all tags. Durations
are written in days (``1095d``); a suffix is in years when the days are whole years (``3y``).

Setup is idempotent: what exists as wanted is left alone, a policy with another duration (or
a raw policy that is not the default) is ALTERed, a continuous query with other text is dropped
and created again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from metricvault.config import Settings
from metricvault.durations import DAY_MS, format_duration_ms
from metricvault.errors import ConfigError
from metricvault.store.backends.influx_client import InfluxClient, ident, parse_uri

YEAR_MS = 365 * DAY_MS
META_RP = "rp_metricvault_meta"
CQ_NAME = "cq_metricvault_1m"
ROLLUP_AGGREGATES = ("mean", "min", "max", "count", "last")


@dataclass(frozen=True)
class Policies:
    raw: str
    raw_ms: int | None  # None: forever (INF)
    longterm: str
    longterm_ms: int | None
    meta: str = META_RP

    def wanted(self) -> dict[str, tuple[int | None, bool]]:
        """name -> (duration ms or None for INF, is default)."""
        return {
            self.raw: (self.raw_ms, True),
            self.longterm: (self.longterm_ms, False),
            self.meta: (None, False),
        }


def policies(settings: Settings) -> Policies:
    raw_ms, long_ms = settings.retention_ms("raw"), settings.retention_ms("1m")
    for name, ms in (("retention_raw", raw_ms), ("retention_1m", long_ms)):
        if ms is not None and (ms % 60_000 or ms < 3_600_000):
            raise ConfigError(
                f"{name}={format_duration_ms(ms)} cannot be an InfluxDB retention policy: "
                "InfluxDB needs whole minutes and at least 1h; use e.g. 30d"
            )
    return Policies(
        raw=f"rp_raw_{rp_suffix(raw_ms)}",
        raw_ms=raw_ms,
        longterm=f"rp_longterm_{rp_suffix(long_ms)}",
        longterm_ms=long_ms,
    )


def rp_suffix(ms: int | None) -> str:
    if ms is None:
        return "forever"
    if ms % YEAR_MS == 0:
        return f"{ms // YEAR_MS}y"
    return format_duration_ms(ms)


def influx_duration(ms: int | None) -> str:
    if ms is None:
        return "INF"
    return f"{ms // DAY_MS}d" if ms % DAY_MS == 0 else format_duration_ms(ms)


# --------------------------------------------------------------------------- statements
def create_database(db: str, pol: Policies) -> str:
    # created with the raw policy as its default, so no 'autogen' policy appears
    return (
        f"CREATE DATABASE {ident(db)} WITH DURATION {influx_duration(pol.raw_ms)} "
        f"REPLICATION 1 NAME {ident(pol.raw)}"
    )


def create_policy(db: str, name: str, ms: int | None, default: bool) -> str:
    suffix = " DEFAULT" if default else ""
    return (
        f"CREATE RETENTION POLICY {ident(name)} ON {ident(db)} DURATION {influx_duration(ms)} "
        f"REPLICATION 1{suffix}"
    )


def alter_policy(db: str, name: str, ms: int | None, default: bool) -> str:
    suffix = " DEFAULT" if default else ""
    return (
        f"ALTER RETENTION POLICY {ident(name)} ON {ident(db)} DURATION {influx_duration(ms)}"
        f"{suffix}"
    )


def continuous_query(db: str, pol: Policies) -> str:
    aggregates = ", ".join(f"{a}(*)" for a in ROLLUP_AGGREGATES)
    return (
        f"CREATE CONTINUOUS QUERY {ident(CQ_NAME)} ON {ident(db)} BEGIN SELECT {aggregates} "
        f"INTO {ident(db)}.{ident(pol.longterm)}.:MEASUREMENT "
        f"FROM {ident(db)}.{ident(pol.raw)}./.*/ GROUP BY time(1m), * END"
    )


def rollup_into(db: str, pol: Policies, measurement: str, start: int, end: int) -> str:
    """The continuous query's SELECT for one measurement and time range, plus ``sum(*)``
    (``maintain``): the stored sum lets queries add minutes up inside InfluxDB."""
    aggregates = ", ".join(f"{a}(*)" for a in (*ROLLUP_AGGREGATES, "sum"))
    return (
        f"SELECT {aggregates} INTO {ident(db)}.{ident(pol.longterm)}.:MEASUREMENT "
        f"FROM {ident(db)}.{ident(pol.raw)}.{ident(measurement)} "
        f"WHERE time >= {start}ms AND time < {end}ms GROUP BY time(1m), *"
    )


def setup_statements(db: str, settings: Settings) -> list[str]:
    """Everything setup runs on a server where nothing exists yet (what ``--dry-run`` prints)."""
    pol = policies(settings)
    return [
        create_database(db, pol),
        create_policy(db, pol.longterm, pol.longterm_ms, False),
        create_policy(db, pol.meta, None, False),
        continuous_query(db, pol),
    ]


def setup(
    uri: str,
    settings: Settings,
    dry_run: bool = False,
    echo: Callable[[str], None] | None = None,
) -> list[str]:
    """Bring the server to the wanted state; returns (and ``echo``es) the statements run.

    ``dry_run`` contacts nothing and returns :func:`setup_statements`."""
    target = parse_uri(uri)
    if dry_run:
        statements = setup_statements(target.database, settings)
        for statement in statements:
            (echo or _noop)(statement)
        return statements
    client = InfluxClient(target)
    try:
        return _converge(client, target.database, policies(settings), echo or _noop)
    finally:
        client.close()


def _converge(
    client: InfluxClient, db: str, pol: Policies, echo: Callable[[str], None]
) -> list[str]:
    ran: list[str] = []

    def run(statement: str) -> None:
        echo(statement)
        client.query(statement, database=False)
        ran.append(statement)

    if db not in show_databases(client):
        run(create_database(db, pol))
    existing = show_policies(client, db)
    for name, (ms, default) in pol.wanted().items():
        have = existing.get(name)
        if have is None:
            run(create_policy(db, name, ms, default))
        elif have[0] != ms or (default and not have[1]):
            run(alter_policy(db, name, ms, default))
    wanted_cq = continuous_query(db, pol)
    have_cq = show_continuous_queries(client, db).get(CQ_NAME)
    if have_cq is not None and normalise_cq(have_cq) != normalise_cq(wanted_cq):
        run(f"DROP CONTINUOUS QUERY {ident(CQ_NAME)} ON {ident(db)}")
        have_cq = None
    if have_cq is None:
        run(wanted_cq)
    return ran


def _noop(_: str) -> None:
    return None


# --------------------------------------------------------------------------- inspection
def show_databases(client: InfluxClient) -> set[str]:
    results = client.query("SHOW DATABASES", database=False)
    return {row[0] for s in results[0].get("series", []) for row in s.get("values", [])}


def show_policies(client: InfluxClient, db: str) -> dict[str, tuple[int | None, bool]]:
    """name -> (duration ms or None for INF, is default)."""
    results = client.query(f"SHOW RETENTION POLICIES ON {ident(db)}", database=False)
    found: dict[str, tuple[int | None, bool]] = {}
    for series in results[0].get("series", []):
        cols = series["columns"]
        for row in series.get("values", []):
            rec = dict(zip(cols, row, strict=True))
            ms = go_duration_ms(str(rec["duration"]))
            found[str(rec["name"])] = (ms or None, bool(rec["default"]))
    return found


def show_continuous_queries(client: InfluxClient, db: str) -> dict[str, str]:
    results = client.query("SHOW CONTINUOUS QUERIES", database=False)
    return {
        str(row[0]): str(row[1])
        for s in results[0].get("series", [])
        if s.get("name") == db
        for row in s.get("values", [])
    }


def normalise_cq(text: str) -> str:
    """InfluxDB prints a stored query without the quotes we send; compare without them."""
    return " ".join(text.replace('"', "").split())


_GO_UNITS_MS = {"h": 3_600_000.0, "m": 60_000.0, "s": 1000.0, "ms": 1.0, "us": 1e-3, "µs": 1e-3}
_GO_UNITS_MS["ns"] = 1e-6


def go_duration_ms(text: str) -> int:
    """``720h0m0s`` (Go's format, as SHOW RETENTION POLICIES prints it) -> ms; ``0s`` -> 0."""
    parts = re.findall(r"([\d.]+)(ns|us|µs|ms|h|m|s)", text)
    return round(sum(float(n) * _GO_UNITS_MS[u] for n, u in parts))
