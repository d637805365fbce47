"""The shared behaviour suite of the store boundary, one set of cases for every backend.

``fill(store, t0)`` writes the same samples and registers the same experiment; each ``check_*``
compares what a backend under test answers with what the embedded vault answers on the same
data. ``tests/unit/test_backends_contract.py`` runs them over the embedded vault and an opened
snapshot, ``tests/e2e/test_backends_contract.py`` over a real InfluxDB and through a real gateway
(``metricvault serve``). ``t0`` is a whole hour; InfluxDB needs one within its raw retention
(``recent_hour()``), the others take any.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pandas as pd

from metricvault.promql import Engine

HOUR_MS = 3_600_000
EXPERIMENT = "r1"
SELECTOR = '{job="r1"} or gpu_util'
STEPS: tuple[str | None, ...] = (None, "1m", "all")
HISTORY_METRICS = ("train_loss",)
COUNTER = "gpu_energy_joules_total"
SERIES = 5
RAW_SAMPLES = 1_200
MINUTE_ROWS = 300  # 60 minutes of each of the 5 series


def recent_hour(hours_ago: int = 3) -> int:
    """A whole hour ``hours_ago`` hours before now (epoch ms)."""
    return (int(time.time() * 1000) // HOUR_MS - hours_ago) * HOUR_MS


def samples(t0: int) -> list[tuple[str, dict[str, str], int, float]]:
    """An hour of two GPUs' utilisation every 10 s, the run's energy counter every 10 s (it
    resets once), and a training run's step and loss (``job="r1"``) every minute: 1,200
    samples, 5 series."""
    gpus = [
        ("gpu_util", {"host": f"n{h}"}, t0 + i * 10_000, float(i + h))
        for h in (1, 2)
        for i in range(360)
    ]
    energy = [
        (COUNTER, {"host": "n1", "job": EXPERIMENT}, t0 + i * 10_000, float((i % 200) * 7))
        for i in range(360)
    ]
    run = [
        (metric, {"job": EXPERIMENT}, t0 + 5_000 + i * 60_000, value)
        for i in range(60)
        for metric, value in (("train_step", float(i)), ("train_loss", 4.0 - i / 16))
    ]
    return gpus + energy + run


def fill(store: Any, t0: int) -> None:
    """Write the samples and register the experiment that spans them."""
    store.write(samples(t0))
    store.experiments.create(EXPERIMENT, SELECTOR, start=t0, end=t0 + HOUR_MS)


def _query(store: Any, t0: int, step: str | None, selector: str) -> list[dict[str, Any]]:
    table = store.query(selector, t0, t0 + HOUR_MS, step=step, output="arrow")
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def check_query(want: Any, got: Any, t0: int, step: str | None) -> None:
    """The same rows (columns, order, values) for raw samples and per-step aggregates."""
    expected = _query(want, t0, step, "gpu_util")
    assert len(expected) == (720 if step is None else 120 if step == "1m" else 2)
    assert _query(got, t0, step, "gpu_util") == expected
    union = _query(want, t0, step, SELECTOR)  # a union of selectors, the experiment's own
    assert _query(got, t0, step, SELECTOR) == union and len(union) > len(expected)


def series_rows(table: Any) -> list[tuple[int, str, str, dict[str, str]]]:
    """(id, metric, kind, labels) per series, sorted. A vault and InfluxDB give one column per
    label name, and so does an opened snapshot (a JSON ``labels`` column is read too)."""
    rows = []
    for row in table.to_pylist():
        fixed = {k: row.pop(k) for k in ("series_id", "metric", "kind")}
        labels = json.loads(row.pop("labels")) if "labels" in row else {}
        labels.update({k: v for k, v in row.items() if v is not None})
        rows.append((fixed["series_id"], fixed["metric"], fixed["kind"], labels))
    return sorted(rows, key=lambda r: (r[1], sorted(r[3].items())))


def check_series(want: Any, got: Any) -> None:
    """The same series: ids, metrics, kinds and labels."""
    expected = series_rows(want.series("gpu_util", output="arrow"))
    assert [(metric, labels) for _, metric, _, labels in expected] == [
        ("gpu_util", {"host": "n1"}),
        ("gpu_util", {"host": "n2"}),
    ]
    assert series_rows(got.series("gpu_util", output="arrow")) == expected
    everything = series_rows(want.series(output="arrow"))
    assert series_rows(got.series(output="arrow")) == everything and len(everything) == SERIES


def check_stats(want: Any, got: Any, t0: int) -> None:
    """The keys every backend's ``stats`` shares mean the same: how many series it holds."""
    now = t0 + HOUR_MS
    assert got.stats(now=now)["series"] == want.stats(now=now)["series"] == SERIES


def check_history(want: Any, got: Any) -> None:
    """The experiment's metrics placed by training step, the same frame."""
    expected = want.history(EXPERIMENT, metrics=HISTORY_METRICS)
    assert expected.index.tolist() == list(range(60))
    pd.testing.assert_frame_equal(got.history(EXPERIMENT, metrics=HISTORY_METRICS), expected)


# --------------------------------------------------------------------------- PromQL
# Over the filled hour at 5-minute steps: the raw path (any window), and windows of whole
# minutes and hours, which the embedded vault answers from its rollups once maintained.
PROMQL: tuple[str, ...] = (
    "gpu_util",
    "sum by (host) (gpu_util)",
    f"rate({COUNTER}[5m])",
    f"increase({COUNTER}[1h])",
    "max_over_time(gpu_util[5m])",
    "count_over_time(gpu_util[1h])",
    "avg_over_time(train_loss[10m])",
    f"irate({COUNTER}[1m])",
)
MIN_MS = 60_000


def promql(store: Any, expr: str, t0: int) -> Any:
    """``expr`` over the filled hour, evaluated by the engine over the store's read seam."""
    return Engine(store).evaluate(expr, t0 + 5 * MIN_MS, t0 + HOUR_MS, 5 * MIN_MS)


def check_promql(want: Any, got: Any, t0: int, expr: str) -> set[str]:
    """The same series and values (to 1e-12: rollup sums may add in another order); returns
    the rollup tiers that answered on the reference side."""
    expected = promql(want, expr, t0)
    answer = promql(got, expr, t0)
    assert expected.series, f"{expr}: an empty answer would prove nothing"
    assert [labels for labels, _, _ in answer.series] == [
        labels for labels, _, _ in expected.series
    ]
    for (_, ts, values), (_, want_ts, want_values) in zip(
        answer.series, expected.series, strict=True
    ):
        assert ts.tolist() == want_ts.tolist()
        np.testing.assert_allclose(values, want_values, rtol=1e-12, atol=0)
    return set(expected.served_by)


# --------------------------------------------------------------------------- SQL
# Written against the vault's views; they run against its snapshot alike.
SQL: tuple[str, ...] = (
    "SELECT series_id, count(*) AS n, sum(value) AS total, min(ts) AS first, "
    "max(timestamp) AS last FROM raw GROUP BY series_id ORDER BY series_id",
    "SELECT s.metric, count(*) AS n FROM raw r JOIN series s USING (series_id) "
    "GROUP BY s.metric ORDER BY s.metric",
    "SELECT metric, kind FROM series ORDER BY metric, labels",
    f"SELECT id, selector FROM experiments WHERE id = '{EXPERIMENT}'",
)


def check_sql(want: Any, got: Any, statement: str) -> None:
    expected = want.sql(statement, output="arrow")
    assert got.sql(statement, output="arrow").to_pylist() == expected.to_pylist()
