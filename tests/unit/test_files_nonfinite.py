"""Raw files record in their footer which series hold a NaN, ±Inf or staleness marker
(``files.NONFINITE_KEY``): the finiteness test then reads no row group, files without the
key (written before it) are still scanned, compaction's output carries the union of its
inputs', and the rollup planner answers the same with and without the key."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metricvault import Vault
from metricvault.model import STALE_NAN_BITS
from metricvault.protocols import SelectHints
from metricvault.selector import Matcher, parse_selector
from metricvault.store import files as fmt
from metricvault.store.catalog import DataFile
from metricvault.store.maintenance import compact
from metricvault.store.reader import FileCache, Reader

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
DAY = 86_400_000
STEP = 15_000
STALE = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
ODD = [math.nan, math.inf, -math.inf, STALE]
Row = tuple[str, dict[str, str], int, float]


def _rows(odd: float | None, n: int = 60, start: int = T0, step: int = STEP) -> list[Row]:
    """Series ``frac`` (float fallbacks, finite), ``whole`` (scaled integers) and ``odd``
    (integers, one of them ``odd`` where given)."""
    mixed = [float(i) for i in range(n)]
    if odd is not None:
        mixed[n // 2] = odd
    rows: list[Row] = []
    for k, values in (
        ("frac", [i * 0.1 + 0.01 for i in range(n)]),
        ("odd", mixed),
        ("whole", [float(i % 7) for i in range(n)]),
    ):
        rows += [("g", {"k": k}, start + i * step, v) for i, v in enumerate(values)]
    return rows


def _footer(vault: Vault, f: DataFile) -> pq.FileMetaData:
    with vault.reader.loc.fs.open_input_file(f.path) as handle:
        return pq.ParquetFile(handle).metadata


def _ids(vault: Vault, k: str) -> list[int]:
    return vault.index.match(parse_selector(f'g{{k="{k}"}}'))


@pytest.fixture
def row_group_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The row groups read through ``pq.ParquetFile.read_row_group`` meanwhile."""
    seen: list[int] = []
    plain = pq.ParquetFile.read_row_group

    def counted(self: pq.ParquetFile, i: int, *args: Any, **kwargs: Any) -> pa.Table:
        seen.append(i)
        return plain(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counted)
    yield seen


def _no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written from now on are as before the key existed."""
    monkeypatch.setattr(fmt, "nonfinite_metadata", lambda table: {})


@pytest.mark.parametrize("odd", ODD, ids=["nan", "inf", "-inf", "stale"])
def test_the_footer_names_only_the_series_holding_an_odd_value(
    tmp_path: Any, odd: float, row_group_reads: list[int]
) -> None:
    with Vault.open_local(str(tmp_path / "v")) as v:
        v.write(_rows(odd))
        v.flush()
        (f,) = v.snapshot().tier_files("raw")
        recorded = fmt.nonfinite_series(_footer(v, f))
        assert recorded is not None and recorded.tolist() == _ids(v, "odd")
        end = T0 + 60 * STEP
        reader = Reader(v.reader.loc, FileCache(1 << 20))  # a fresh reader: nothing kept
        row_group_reads.clear()
        assert reader.all_finite([f], _ids(v, "frac"), T0, end)
        assert reader.all_finite([f], _ids(v, "whole") + _ids(v, "frac"), T0, end)
        assert not reader.all_finite([f], _ids(v, "odd"), T0, end)
        assert not reader.all_finite([f], _ids(v, "frac") + _ids(v, "odd"), T0, end)
        assert row_group_reads == []  # answered from the footer


def test_a_file_of_finite_values_records_an_empty_set(tmp_path: Any) -> None:
    with Vault.open_local(str(tmp_path / "v")) as v:
        v.write(_rows(None))
        v.flush()
        (f,) = v.snapshot().tier_files("raw")
        metadata = _footer(v, f)
        assert (metadata.metadata or {})[fmt.NONFINITE_KEY] == b""
        assert fmt.nonfinite_series(metadata) is not None
        assert fmt.nonfinite_series(metadata).size == 0  # type: ignore[union-attr]


def test_rollup_rows_and_too_many_series_carry_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    rollup = pa.table({"series_id": [1], "ts": [0], "count": [0], "sum": [math.nan]})
    assert fmt.nonfinite_metadata(rollup) == {}
    raw = pa.table({"series_id": [3, 5, 7], "ts": [0, 0, 0], "value": [math.nan, 1.0, math.inf]})
    (stored,) = fmt.nonfinite_metadata(raw).values()
    assert np.frombuffer(base64.b64decode(stored), "<i8").tolist() == [3, 7]
    monkeypatch.setattr(fmt, "NONFINITE_MAX_IDS", 1)
    assert fmt.nonfinite_metadata(raw) == {}


def test_an_unreadable_record_counts_as_none() -> None:
    for stored in (b"not base64!", b"AAAA"):  # not base64; 3 bytes, not whole int64s
        schema = pa.schema([("a", pa.int64())], metadata={fmt.NONFINITE_KEY: stored})
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table({"a": [1]}, schema=schema), sink)
        metadata = pq.ParquetFile(pa.BufferReader(sink.getvalue())).metadata
        assert fmt.nonfinite_series(metadata) is None


@pytest.mark.parametrize("odd", ODD, ids=["nan", "inf", "-inf", "stale"])
def test_a_file_without_the_key_is_still_scanned(
    tmp_path: Any, odd: float, monkeypatch: pytest.MonkeyPatch, row_group_reads: list[int]
) -> None:
    _no_key(monkeypatch)
    with Vault.open_local(str(tmp_path / "v")) as v:
        v.write(_rows(odd))
        v.flush()
        (f,) = v.snapshot().tier_files("raw")
        assert fmt.NONFINITE_KEY not in (_footer(v, f).metadata or {})
        reader = Reader(v.reader.loc, FileCache(1 << 20))
        end = T0 + 60 * STEP
        row_group_reads.clear()
        assert reader.all_finite([f], _ids(v, "frac"), T0, end)
        assert not reader.all_finite([f], _ids(v, "odd"), T0, end)
        assert row_group_reads  # value_f was read


def test_compaction_output_records_the_union_of_its_inputs(tmp_path: Any) -> None:
    with Vault.open_local(str(tmp_path / "v")) as v:
        first = [r for r in _rows(math.nan) if r[1]["k"] != "whole"]
        v.write(first)
        v.flush()
        later = [r for r in _rows(None, start=T0 + DAY // 2) if r[1]["k"] != "odd"]
        later[-1] = (*later[-1][:3], STALE)  # the last sample of "whole": a staleness marker
        v.write(later)
        v.flush()
        assert len(v.snapshot().tier_files("raw")) == 2
        assert compact(v, now=T0 + 10 * DAY) >= 1
        (f,) = v.snapshot().tier_files("raw")
        recorded = fmt.nonfinite_series(_footer(v, f))
        want = sorted(_ids(v, "odd") + _ids(v, "whole"))
        assert recorded is not None and recorded.tolist() == want


def _bucket_answers(path: str) -> list[Any]:
    """select_buckets of each series and of all of them, a plain selector over 3 days at
    hourly steps (the 1h rows answer where the raw samples are finite)."""
    end = T0 + 3 * DAY
    with Vault.open_local(path) as v:
        v.maintain(now_ms=end + DAY)
        hints = SelectHints(None, 300_000, 3_600_000, T0 + 3_600_000, end - 3_600_000)
        out = []
        for matchers in (
            [Matcher("__name__", "=", "g")],
            *([Matcher("__name__", "=", "g"), Matcher("k", "=", k)] for k in ("frac", "odd")),
        ):
            found = v.select_buckets(matchers, hints)
            out.append(
                None
                if found is None
                else sorted(
                    (sorted(s.labels.items()), {c: a.tobytes() for c, a in s.columns.items()})
                    for s in found.series
                )
            )
        return out


@pytest.mark.parametrize("odd", [*ODD, None], ids=["nan", "inf", "-inf", "stale", "none"])
def test_select_buckets_answers_the_same_with_and_without_the_key(
    tmp_path: Any, odd: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _rows(odd, n=3 * DAY // 60_000, step=60_000)  # 3 days at 60 s
    answers = []
    for name in ("with", "without"):
        if name == "without":
            _no_key(monkeypatch)
        with Vault.open_local(str(tmp_path / name)) as v:
            v.write(rows)
            v.flush()
        answers.append(_bucket_answers(str(tmp_path / name)))
    assert answers[0] == answers[1]
    everything, frac, single = answers[0]
    assert frac is not None  # finite: answered from the rollup rows
    assert (everything is None) == (single is None) == (odd is not None)
