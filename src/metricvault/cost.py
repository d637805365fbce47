"""``metricvault cost``: GPU-hours, idle GPU-hours and energy per team, experiment, namespace or
any label over a period, from the 1h rollup tier (a quarter of a cluster in milliseconds).

What is counted, per GPU and UTC hour of ``[start, end)`` (both moved down to whole hours):

- **GPU-hours**: an hour in which the GPU reported ``DCGM_FI_DEV_GPU_UTIL`` counts as one
  GPU-hour. A GPU whose series changed within the hour (a new pod's labels) shares that hour
  among its series by their samples, so a GPU never counts more than once per hour.
- **idle GPU-hours**: those of the hours whose mean utilisation (the 1h row's sum / count) is
  below ``idle_below`` percent (5 by default).
- **kWh**: the reset-corrected increase of ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ) in
  the hour, as the 1h rows keep it (their increase reaches back to the sample before the hour).

Groups: ``by="experiment"`` puts a GPU-hour into every registered experiment whose selector
matches the GPU's series and whose window overlaps the hour (windows are taken to whole hours:
from the hour of the start up to the end); ``by="team"`` takes the series' ``team_label``
(``team`` by default) and, where a series has none, the owner of the experiment it belongs to;
any other ``by`` is a label of the GPU series (``namespace``, ``Hostname``, ...). What belongs
to no group is reported as ``(none)``.

The report reads through the vault's public API: ``buckets(selector, start, end, 1h)`` (the 1h
rollup rows; raw samples only for hours not rolled up yet, which its warnings then say),
and the experiment registry (selectors matched against the GPU series' labels).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from metricvault.durations import HOUR_MS, ms_to_datetime, now_ms
from metricvault.errors import InputError, UnsupportedError
from metricvault.experiment import Experiment
from metricvault.model import is_label_name
from metricvault.selector import parse_selectors
from metricvault.store.vault import Vault

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GPU_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
MJ_PER_KWH = 3.6e9
NONE = "(none)"
COLUMNS = ("gpus", "gpu_hours", "idle_gpu_hours", "idle_share", "gpu_util_mean", "energy_kwh")


@dataclass(frozen=True)
class CostReport:
    """One row per group (``table``), the period, and what the caller should know."""

    by: str
    start_ms: int
    end_ms: int
    table: pd.DataFrame
    warnings: tuple[str, ...] = field(default_factory=tuple)
    tiers: tuple[str, ...] = ()  # the tiers that answered, coarsest first

    def totals(self) -> dict[str, float]:
        """The period's totals (a GPU-hour in two experiments counts once here)."""
        return dict(self.table.attrs.get("totals", {}))


def cost_report(
    vault: Any,
    start_ms: int,
    end_ms: int,
    by: str = "team",
    *,
    idle_below: float = 5.0,
    team_label: str = "team",
    now: int | None = None,
) -> CostReport:
    """GPU-hours, idle GPU-hours and kWh per group over ``[start_ms, end_ms)`` (see the
    module doc). Refuses a label name that is not one, an empty or inverted period."""
    _check(by, team_label, idle_below)
    if not isinstance(vault, Vault):
        raise UnsupportedError(
            f"{type(vault).__name__} keeps no 1h rollup rows to count GPU-hours from: the cost "
            "report runs on the embedded vault (a directory or s3:// URI; --data)"
        )
    start, end = start_ms // HOUR_MS * HOUR_MS, end_ms // HOUR_MS * HOUR_MS
    if end <= start:
        raise InputError(
            f"the period {_utc(start_ms)} .. {_utc(end_ms)} holds no whole UTC hour: the cost "
            "report counts whole hours from the 1h tier; give --end at least an hour after "
            "--start"
        )
    hours = _hourly_rows(vault, start, end)
    # shares first: an hour that two experiments cover is one row per experiment afterwards
    hours = dataclasses.replace(hours, rows=_with_shares(hours.rows, idle_below))
    experiments = vault.experiments.list() if by in ("experiment", "team") else []
    grouped = _assign(hours, by, team_label, experiments, now)
    table = _summarise(grouped, by)
    table.attrs["totals"] = _totals(hours.rows)
    notes = _warnings(start, end, hours)
    return CostReport(by, start, end, table, notes, hours.tiers)


def _check(by: str, team_label: str, idle_below: float) -> None:
    if by not in ("experiment", "team") and not is_label_name(by):
        raise InputError(
            f"--by {by!r} is neither team, experiment nor a label name: give e.g. --by team, "
            "--by experiment, --by namespace or --by Hostname"
        )
    if not is_label_name(team_label):
        raise InputError(f"team label {team_label!r} is not a label name (e.g. team)")
    if not 0.0 <= idle_below <= 100.0:
        raise InputError(f"--idle-below {idle_below:g} must be a utilisation in 0..100 percent")


# --------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class _Hours:
    rows: pd.DataFrame  # series_id, ts, count, sum, energy_mj, gpu: one per (GPU series, hour)
    labels: dict[int, dict[str, str]]  # series_id -> labels (without __name__)
    metrics: dict[int, str]  # series_id -> metric name
    tiers: tuple[str, ...]  # what answered: "1h", and "raw" for hours not rolled up yet


def _hourly_rows(vault: Any, start: int, end: int) -> _Hours:
    """One row per (GPU series, hour): util count and sum, the GPU's energy increase (mJ),
    from ``vault.buckets`` (the 1h tier; raw samples for hours not rolled up yet)."""
    selector = f'{{__name__=~"{GPU_UTIL}|{GPU_ENERGY}"}}'
    found = vault.buckets(selector, start, end, HOUR_MS)
    columns = found.table.select(["series_id", "ts", "count", "sum", "increase"])
    rows = columns.to_pandas()
    labels = {int(i): dict(d) for i, d in found.labels.items()}
    metrics = {i: d.pop("__name__", "") for i, d in labels.items()}
    is_util = {i for i, name in metrics.items() if name == GPU_UTIL}
    codes: dict[str, int] = {}  # a GPU's key as a small int: cheaper to group by and join
    gpu = {i: codes.setdefault(_gpu_key(d), len(codes)) for i, d in labels.items()}
    rows = rows.assign(gpu=rows["series_id"].map(gpu).astype("int64"))
    util_rows = rows["series_id"].isin(is_util)
    util = rows[util_rows].drop(columns="increase")
    energy = rows[~util_rows].groupby(["gpu", "ts"])["increase"].sum(min_count=1)
    out = util.merge(energy.rename("energy_mj").reset_index(), on=["gpu", "ts"], how="outer")
    orphans = out["series_id"].isna()  # energy in an hour without a util row of that GPU
    if orphans.any():
        energy_series = {g: i for i, g in gpu.items() if i not in is_util}
        out.loc[orphans, "series_id"] = out.loc[orphans, "gpu"].map(energy_series)
        out.loc[orphans, ["count", "sum"]] = 0
    out = out.astype({"series_id": "int64", "count": "int64", "ts": "int64"})
    return _Hours(out, labels, metrics, tuple(found.tiers))


def _gpu_key(labels: dict[str, str]) -> str:
    """A physical GPU's key: its UUID (with the host), else its label set (so a GPU's util
    and energy series meet)."""
    if "UUID" in labels:
        return f"{labels.get('Hostname', '')}/{labels['UUID']}"
    return json.dumps(labels, sort_keys=True)


# --------------------------------------------------------------------------- grouping
def _assign(
    hours: _Hours,
    by: str,
    team_label: str,
    experiments: Sequence[Experiment],
    now: int | None,
) -> pd.DataFrame:
    """The rows with a ``group`` column (one row per group an hour belongs to)."""
    rows = hours.rows
    if by not in ("experiment", "team"):
        values = {i: d.get(by, NONE) for i, d in hours.labels.items()}
        return rows.assign(group=rows["series_id"].map(values))
    member = _experiment_rows(hours, experiments, now)
    if by == "experiment":
        numbered = rows.rename_axis("row").reset_index()
        grouped = numbered.merge(member, on="row", how="left")
        return grouped.assign(group=grouped["experiment"].fillna(NONE)).drop(
            columns=["row", "experiment", "owner"]
        )
    own = rows["series_id"].map({i: d.get(team_label) for i, d in hours.labels.items()})
    owners = member.drop_duplicates("row").set_index("row")["owner"]
    team = own.where(own.notna(), rows.index.to_series().map(owners))
    return rows.assign(group=team.where(team.notna() & (team != ""), NONE))


def _experiment_rows(
    hours: _Hours, experiments: Sequence[Experiment], now: int | None
) -> pd.DataFrame:
    """(row, experiment id, owner) for every row an experiment covers, earliest first."""
    rows = hours.rows
    found = [pd.DataFrame({"row": pd.Series([], dtype="int64"), "experiment": [], "owner": []})]
    for exp in sorted(experiments, key=lambda e: (e.start_ms, e.id)):
        start, end = exp.window(now if now is not None else now_ms())
        selector = parse_selectors(exp.selector)
        ids = [i for i, d in hours.labels.items() if selector.matches(hours.metrics[i], d)]
        covered = (
            rows["series_id"].isin(ids)
            & (rows["ts"] >= start // HOUR_MS * HOUR_MS)
            & (rows["ts"] < end)
        )
        index = rows.index[covered]
        found.append(pd.DataFrame({"row": index, "experiment": exp.id, "owner": exp.owner}))
    return pd.concat(found, ignore_index=True).astype({"row": "int64"})


# --------------------------------------------------------------------------- figures
def _with_shares(rows: pd.DataFrame, idle_below: float) -> pd.DataFrame:
    """Each row's share of its GPU's hour (by samples; equal shares where the GPU has no
    util samples that hour), its energy share and whether that hour was idle."""
    count = rows["count"].astype("float64")
    gpu_hour = rows.groupby(["gpu", "ts"])["count"]
    per_gpu_hour = gpu_hour.transform("sum").astype("float64")
    share = (count / per_gpu_hour).where(per_gpu_hour > 0, 0.0)
    split = share.where(per_gpu_hour > 0, 1.0 / gpu_hour.transform("size"))
    energy = (rows["energy_mj"] * split).where(rows["energy_mj"].notna())
    mean = rows["sum"] / count.where(count > 0)
    return rows.assign(share=share, idle=share.where(mean < idle_below, 0.0), energy=energy)


def _summarise(rows: pd.DataFrame, by: str) -> pd.DataFrame:
    grouped = rows.groupby("group", sort=False)
    table = pd.DataFrame(
        {
            "gpus": grouped["gpu"].nunique(),
            "gpu_hours": grouped["share"].sum(),
            "idle_gpu_hours": grouped["idle"].sum(),
            "util_sum": grouped["sum"].sum(),
            "util_count": grouped["count"].sum(),
            "energy_kwh": grouped["energy"].sum(min_count=1) / MJ_PER_KWH,
        }
    )
    table["idle_share"] = table["idle_gpu_hours"] / table["gpu_hours"].where(table["gpu_hours"] > 0)
    table["gpu_util_mean"] = table["util_sum"] / table["util_count"].where(table["util_count"] > 0)
    table = table.reset_index().rename(columns={"group": by})
    table = table.sort_values(["gpu_hours", by], ascending=[False, True], ignore_index=True)
    return table[[by, *COLUMNS]]


def _totals(rows: pd.DataFrame) -> dict[str, float]:
    return {
        "gpus": float(rows["gpu"].nunique()),
        "gpu_hours": float(rows["share"].sum()),
        "idle_gpu_hours": float(rows["idle"].sum()),
        "energy_kwh": float(rows["energy"].sum()) / MJ_PER_KWH,
    }


def _warnings(start: int, end: int, hours: _Hours) -> tuple[str, ...]:
    if hours.rows.empty:
        return (f"no {GPU_UTIL} or {GPU_ENERGY} samples between {_utc(start)} and {_utc(end)} UTC",)
    if "raw" in hours.tiers:
        return (
            "some hours are not rolled up yet and were read from raw samples (slower); "
            "`metricvault maintain` rolls them up",
        )
    return ()


def _utc(ms: int) -> str:
    return f"{ms_to_datetime(ms):%Y-%m-%d %H:%M}"
