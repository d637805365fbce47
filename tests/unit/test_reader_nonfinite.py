"""The raw finiteness test over stored files: which series hold NaN, ±Inf or a staleness
marker, with float fallbacks (values that are not exact scaled integers) in the same row
group as the odd values and without them."""

from __future__ import annotations

import math
import struct

import pyarrow.parquet as pq
import pytest

from metricvault import Vault
from metricvault.model import STALE_NAN_BITS
from metricvault.selector import parse_selector
from metricvault.store.reader import FileCache, Reader, _all_null

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
STALE = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]


@pytest.mark.parametrize("odd", [math.nan, math.inf, -math.inf, STALE])
def test_only_the_series_holding_an_odd_value_is_not_finite(tmp_path, odd) -> None:
    n = 60
    fractions = [i * 0.1 + 0.01 for i in range(n)]  # no exact scaled integers: value_f
    mixed = [float(i) for i in range(n)]
    mixed[n // 2] = odd
    whole = [float(i % 7) for i in range(n)]
    rows = [("g", {"k": "frac"}, T0 + i * 15_000, v) for i, v in enumerate(fractions)]
    rows += [("g", {"k": "odd"}, T0 + i * 15_000, v) for i, v in enumerate(mixed)]
    rows += [("g", {"k": "whole"}, T0 + i * 15_000, v) for i, v in enumerate(whole)]
    with Vault.open_local(str(tmp_path / "v")) as v:
        v.write(rows)
        v.flush()
        files = v.snapshot().tier_files("raw")
        assert len(files) == 1
        meta = pq.ParquetFile(v.reader.loc.fs.open_input_file(files[0].path)).metadata
        assert meta.num_row_groups == 1  # the float fallbacks beside the odd value
        assert not _all_null(meta, 0, "value_f")
        ids = {k: v.index.match(parse_selector(f'g{{k="{k}"}}')) for k in ("frac", "odd", "whole")}
        assert all(len(found) == 1 for found in ids.values())
        end = T0 + n * 15_000
        for cached in (False, True):  # a fresh reader, then the kept answer per row group
            reader = v.reader if cached else Reader(v.reader.loc, FileCache(1 << 20))
            assert reader.all_finite(files, ids["frac"], T0, end)
            assert reader.all_finite(files, ids["whole"], T0, end)
            assert reader.all_finite(files, ids["frac"] + ids["whole"], T0, end)
            assert not reader.all_finite(files, ids["odd"], T0, end)
            assert not reader.all_finite(files, ids["frac"] + ids["odd"], T0, end)
            assert reader.all_finite(files, ids["odd"], end, end + 60_000)  # outside the files
