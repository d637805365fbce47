"""The vault remembers which series rows (by the keys of a decoder's series cache) it checked
against its series table, and skips finding new series and the collision check for a batch
whose rows it checked before; anything else is checked as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from metricvault.errors import SeriesCollisionError
from metricvault.model import Series, SeriesRows
from metricvault.store.checked_series import SPAN, CheckedKeys
from metricvault.store.vault import Vault

T0 = 1_767_225_600_000


def _rows(series: list[Series], keys: list[int]) -> SeriesRows:
    rows = SeriesRows((s.series_id, s.metric, s.labels_json, "gauge") for s in series)
    rows.keys = np.array(keys, dtype=np.int64)
    return rows


def _write(vault: Vault, rows: SeriesRows, ts: int) -> int:
    ids = np.array([row[0] for row in rows], dtype=np.int64)
    return vault.write_resolved(ids, np.full(len(ids), ts), np.ones(len(ids)), rows)


def test_checked_keys_are_remembered_and_others_are_not() -> None:
    checked = CheckedKeys()
    assert not checked.all_checked(np.array([5]))
    checked.remember(np.array([5, 7, 1000]))
    assert checked.all_checked(np.array([5, 7, 1000]))
    assert not checked.all_checked(np.array([5, 6]))
    checked.remember(np.array([2]))  # below the first one remembered: the bitmap grows down
    assert checked.all_checked(np.array([2, 5, 7, 1000]))
    checked.remember(np.array([3 * SPAN]))  # out of reach: starts over from there
    assert checked.all_checked(np.array([3 * SPAN]))
    assert not checked.all_checked(np.array([5]))
    assert checked.all_checked(np.array([], dtype=np.int64))


def test_a_checked_batch_skips_the_series_lookups(tmp_path: Path) -> None:
    vault = Vault.open_local(str(tmp_path / "vault"))
    series = [Series.make("gpu_util", {"gpu": str(i)}) for i in range(3)]
    rows = _rows(series, [10, 11, 12])
    looked_up: list[int] = []
    unknown = vault.index.unknown

    def counting(batch_series: list[tuple[int, str, str, str]]) -> list[tuple[int, str, str, str]]:
        looked_up.append(len(batch_series))
        return unknown(batch_series)

    vault.index.unknown = counting  # type: ignore[method-assign,assignment]
    assert _write(vault, rows, T0) == 3
    assert _write(vault, _rows(series, [10, 11, 12]), T0 + 1000) == 3
    assert looked_up == [3]  # the second batch's rows were all checked already
    assert _write(vault, _rows(series, [10, 11, 13]), T0 + 2000) == 3
    assert looked_up == [3, 3]  # key 13 is new: the whole batch is checked again
    assert len(vault.index) == 3
    vault.flush()
    assert vault.stats()["tiers"]["raw"]["rows"] == 9
    vault.close()


def test_a_colliding_series_under_a_new_key_is_still_refused(tmp_path: Path) -> None:
    vault = Vault.open_local(str(tmp_path / "vault"))
    first = Series.make("gpu_util", {"gpu": "0"})
    assert _write(vault, _rows([first], [20]), T0) == 1
    other = Series.make("gpu_util", {"gpu": "1"})
    forged = SeriesRows([(first.series_id, other.metric, other.labels_json, "gauge")])
    forged.keys = np.array([21], dtype=np.int64)
    with pytest.raises(SeriesCollisionError, match="hashes to the same 64-bit id"):
        vault.write_resolved(np.array([first.series_id]), np.array([T0 + 1000]), np.ones(1), forged)
    assert vault.buffer.depth()[0] == 1  # nothing of the refused batch was written
    assert not vault._checked.all_checked(np.array([21]))
    vault.close()
