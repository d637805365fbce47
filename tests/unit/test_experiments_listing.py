"""The file registry lists every record from one directory listing and keeps the records it
parsed while their files are unchanged (the UI lists 10,000 experiments per request): a
record written since, even at the same size, is read again."""

from __future__ import annotations

import os
from pathlib import Path

from metricvault.store import experiments as registry
from metricvault.store.vault import Vault

T0 = 1_767_225_600_000


def _age(path: Path, seconds: float) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns - int(seconds * 1e9)))


def test_an_unchanged_record_is_listed_from_the_cache_and_a_rewritten_one_is_read(
    tmp_path: Path,
) -> None:
    with Vault.open_local(str(tmp_path / "v")) as vault:
        for i in range(3):
            vault.experiments.create(f"e{i}", f'{{job="e{i}"}}', start=T0 + i, owner="ann")
        files = sorted((tmp_path / "v" / "experiments").glob("*.json"))
        assert len(files) == 3
        for path in files:
            _age(path, 10)
        first = vault.experiments.list()
        again = vault.experiments.list()
        assert [e.id for e in again] == ["e0", "e1", "e2"]
        assert all(a is b for a, b in zip(first, again, strict=True))  # not parsed again
        vault.experiments.update("e1", owner="bob")  # same size as "ann"
        listed = {e.id: e.owner for e in vault.experiments.list()}
        assert listed == {"e0": "ann", "e1": "bob", "e2": "ann"}


def test_a_young_record_is_always_read_again(tmp_path: Path) -> None:
    with Vault.open_local(str(tmp_path / "v")) as vault:
        vault.experiments.create("e0", '{job="e0"}', start=T0, owner="ann")
        first = vault.experiments.list()
        again = vault.experiments.list()
        assert first == again and first[0] is not again[0]  # younger than SETTLED_NS
        assert registry.SETTLED_NS >= 1_000_000_000
