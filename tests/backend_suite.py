"""Issue 12: the shared behaviour suite of the store boundary, one set of cases for every backend.

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

import pandas as pd

HOUR_MS = 3_600_000
EXPERIMENT = "r1"
SELECTOR = '{job="r1"} or gpu_util'
STEPS: tuple[str | None, ...] = (None, "1m", "all")
HISTORY_METRICS = ("train_loss",)


def recent_hour(hours_ago: int = 3) -> int:
    """A whole hour ``hours_ago`` hours before now (epoch ms)."""
    return (int(time.time() * 1000) // HOUR_MS - hours_ago) * HOUR_MS


def samples(t0: int) -> list[tuple[str, dict[str, str], int, float]]:
    """An hour of two GPUs' utilisation every 10 s, and a training run's step and loss
    (``job="r1"``) every minute: 840 samples, 4 series."""
    gpus = [
        ("gpu_util", {"host": f"n{h}"}, t0 + i * 10_000, float(i + h))
        for h in (1, 2)
        for i in range(360)
    ]
    run = [
        (metric, {"job": EXPERIMENT}, t0 + 5_000 + i * 60_000, value)
        for i in range(60)
        for metric, value in (("train_step", float(i)), ("train_loss", 4.0 - i / 16))
    ]
    return gpus + run


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
    assert series_rows(got.series(output="arrow")) == everything and len(everything) == 4


def check_stats(want: Any, got: Any, t0: int) -> None:
    """The keys every backend's ``stats`` shares mean the same: how many series it holds."""
    now = t0 + HOUR_MS
    assert got.stats(now=now)["series"] == want.stats(now=now)["series"] == 4


def check_history(want: Any, got: Any) -> None:
    """The experiment's metrics placed by training step, the same frame."""
    expected = want.history(EXPERIMENT, metrics=HISTORY_METRICS)
    assert expected.index.tolist() == list(range(60))
    pd.testing.assert_frame_equal(got.history(EXPERIMENT, metrics=HISTORY_METRICS), expected)
