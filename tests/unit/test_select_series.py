"""``Vault.select_series``, the typed read the PromQL engine evaluates over (issue 13): the
same samples as ``vault.query``'s long shape, bit for bit (NaN payloads and staleness markers
included), in the same series order, with the same dedup of rewritten samples, whether the
samples sit in one data file, several day files, overlapping files or the ingest buffer."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from metricvault.errors import TimeRangeError
from metricvault.promql import Engine, MemorySource
from metricvault.selector import Matcher, parse_selector, parse_selectors
from metricvault.store import maintenance
from metricvault.store.vault import Vault
from tests.e2e.test_promql_oracle import dataset
from tests.unit.test_fidelity import STALE, bits, odd_values
from tests.unit.test_oracle import SELECT_ALL, T0, apply, fresh_vault, workloads

DAY = 86_400_000
# 40 minutes of the oracle's series, across a midnight: two day files per flush
START = T0 + DAY - 20 * 60_000
END = START + 41 * 60_000


def long_shape(vault: Vault, selector: str, start: int, end: int, stale: bool = True) -> list[Any]:
    """What ``query(output="arrow")`` answers, split into (labels, ts, value bits) per series
    independently of the code under test (row by row)."""
    table = vault.query(selector, start, end, output="arrow", stale_markers=stale)
    rows = table.to_pylist()
    names = [c for c in table.column_names if c not in ("timestamp", "metric", "value")]
    out: list[Any] = []
    for row, value in zip(rows, bits(table["value"]), strict=True):
        labels = {"__name__": row["metric"], **{n: row[n] for n in names if row[n]}}
        if not out or out[-1][0] != labels:
            out.append((labels, [], []))
        out[-1][1].append(int(row["timestamp"].timestamp() * 1000))
        out[-1][2].append(value)
    return out


def in_memory(vault: Vault, start: int, end: int) -> MemorySource:
    """The vault's samples in ``[start, end)``, read through ``query``'s long shape, held in
    memory: the engine over it reads raw samples only, bit for bit the same."""
    memory = MemorySource()
    for labels, ts, value_bits in long_shape(vault, SELECT_ALL, start, end):
        memory.add(labels, ts, np.array(value_bits, dtype=np.uint64).view(np.float64))
    return memory


def typed(vault: Vault, selector: Any, start: int, end: int, stale: bool = True) -> list[Any]:
    found = vault.select_series(selector, start, end, stale_markers=stale)
    for _, ts, values in found:
        assert ts.dtype == np.int64 and values.dtype == np.float64
        assert ts.flags.writeable and values.flags.writeable  # the engine may own them
    return [(labels, ts.tolist(), bits(values)) for labels, ts, values in found]


def write_oracle_series(vault: Vault) -> None:
    """The oracle's series (NaN, Inf, a stale marker, counters, histograms) in four writes:
    two flushed, one rewriting some samples with other values (a later, overlapping file
    wins), the last left in the ingest buffer."""
    rows = [
        (metric, labels, int(t), float(v))
        for metric, labels, ts, vs in dataset(START)
        for t, v in zip(ts.tolist(), vs.tolist(), strict=True)
    ]
    rows.sort(key=lambda r: r[2])
    half = len(rows) // 2
    vault.write(rows[:half])
    vault.flush()
    vault.write(rows[half : half + half // 2])
    vault.flush()
    rewritten = [(m, labels, t, v + 0.25) for m, labels, t, v in rows[: half // 3]]
    vault.write(rewritten)
    vault.flush()
    vault.write(rows[half + half // 2 :])  # buffered: a read flushes it first


@pytest.fixture
def vault(tmp_path: Path) -> Iterator[Vault]:
    with Vault.open_local(str(tmp_path / "v")) as v:
        write_oracle_series(v)
        yield v


SELECTORS = [
    SELECT_ALL,
    "http_requests_total",
    'node_temp_celsius{instance=~"a|b", zone!="cpu"}',
    "nan_gauge or stale_gauge",
    'request_duration_seconds_bucket{le="+Inf"}',
    "no_such_metric",
]


@pytest.mark.parametrize("selector", SELECTORS)
def test_select_series_equals_the_long_shape_bit_for_bit(vault: Vault, selector: str) -> None:
    for start, end in [(START, END), (START + 7 * 60_000, START + 22 * 60_000 + 1)]:
        want = long_shape(vault, selector, start, end)
        assert typed(vault, selector, start, end) == want
        if selector == SELECT_ALL:
            assert len(want) > 30, "a small answer would prove little"
            assert len(vault.catalog_version().tier_files("raw")) > 3  # days, overlap, buffer


def test_the_same_after_compaction_and_without_stale_markers(vault: Vault) -> None:
    before = typed(vault, SELECT_ALL, START, END)
    maintenance.compact(vault, now=START + 3 * DAY)
    assert typed(vault, SELECT_ALL, START, END) == before
    assert typed(vault, SELECT_ALL, START, END, stale=False) == long_shape(
        vault, SELECT_ALL, START, END, stale=False
    )
    stale = next(s for s in before if s[0]["__name__"] == "stale_gauge")
    assert bits([STALE])[0] in stale[2]


def test_nan_payloads_inf_and_markers_keep_their_bits(tmp_path: Path) -> None:
    values = odd_values()
    rows = [("g", {"k": "a"}, T0 + i * 5000, v) for i, v in enumerate(values)]
    with Vault.open_local(str(tmp_path / "v")) as v:
        v.write(rows[:50])
        v.flush()
        v.write(rows[50:])  # in the buffer
        [(labels, ts, got)] = v.select_series("g", T0, T0 + DAY)
        assert labels == {"__name__": "g", "k": "a"}
        assert bits(got) == bits(values)
        assert ts.tolist() == [r[2] for r in rows]
        [(_, _, finite)] = v.select_series("g", T0, T0 + DAY, stale_markers=False)
        assert bits(finite) == [b for b in bits(values) if b != bits([STALE])[0]]
        assert any(math.isnan(x) for x in finite)


def test_selectors_come_as_text_parsed_or_matchers(vault: Vault) -> None:
    text = 'node_temp_celsius{zone="gpu"}'
    want = typed(vault, text, START, END)
    assert want
    assert typed(vault, parse_selector(text), START, END) == want
    assert typed(vault, parse_selectors(text), START, END) == want
    matchers = [Matcher("__name__", "=", "node_temp_celsius"), Matcher("zone", "=", "gpu")]
    assert typed(vault, matchers, START, END) == want
    with pytest.raises(TimeRangeError, match="not before"):
        vault.select_series(text, END, START)


@pytest.mark.parametrize(
    "expr",
    [
        "rate(http_requests_total[5m])",
        "nan_gauge",
        "stale_gauge",
        "histogram_quantile(0.9, sum by (le) (rate(request_duration_seconds_bucket[5m])))",
        "topk(3, avg_over_time(gpu_util_ratio[2m]))",
    ],
)
def test_the_engine_answers_the_same_through_both_reads(vault: Vault, expr: str) -> None:
    args = (START + 5 * 60_000, END - 60_000, 30_000)
    got = Engine(vault).evaluate(expr, *args).to_prometheus()
    want = Engine(in_memory(vault, START - DAY, END + DAY)).evaluate(expr, *args).to_prometheus()
    assert got == want
    assert got["result"], "an empty answer would prove nothing"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(max_n=30))
def test_random_workloads_read_the_same_both_ways(workload: Any) -> None:
    """Rewrites, writes back in time, flushes and maintenance in any order (the store
    oracle's workloads): the typed read still equals the long shape."""
    with fresh_vault() as vault:
        apply(vault, workload)
        lo, hi = T0, T0 + 4 * DAY
        assert typed(vault, SELECT_ALL, lo, hi) == long_shape(vault, SELECT_ALL, lo, hi)
