"""The embedded store's experiment registry: one JSON file ``<vault>/experiments/<id>.json``
per experiment, replaced atomically on update, so the registry lives next to the data it
describes (local disk or S3) and needs no server. The record, its checks and messages are
:mod:`metricvault.experiment`'s."""

from __future__ import annotations

import json
import time

from metricvault.experiment import Experiment, RegistryBase, encode, validate_id
from metricvault.store.layout import EXPERIMENTS_DIR, Location

SETTLED_NS = 2_000_000_000  # a record file this old is cached by (mtime, size)
Parsed = dict[str, tuple[tuple[int, int], Experiment]]  # file name -> ((mtime, size), record)
# per registry directory: ``vault.experiments`` is a new object on every access
_PARSED: dict[str, Parsed] = {}


class Experiments(RegistryBase):
    """The registry of one vault. ``vault.experiments.create("run3", '{job="run3"}')``."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self.where = location.uri

    def _path(self, experiment_id: str) -> str:
        return self.location.path(EXPERIMENTS_DIR, f"{validate_id(experiment_id)}.json")

    def _load(self, experiment_id: str) -> Experiment | None:
        path = self._path(experiment_id)
        if not self.location.exists(path):
            return None
        return Experiment.from_record(json.loads(self.location.read_bytes(path)))

    def _all(self) -> list[Experiment]:
        # One listing, and on local disk a record whose file is unchanged since it was read
        # (same name, mtime and size) is not parsed again: the UI lists every experiment per
        # request. Files younger than SETTLED_NS are always read: a second write within the
        # clock's tick could keep the mtime.
        infos = sorted(
            (i for i in self.location.list_files(EXPERIMENTS_DIR) if i.base_name.endswith(".json")),
            key=lambda i: i.base_name,
        )
        where = self.location.path(EXPERIMENTS_DIR)
        now_ns, cached, out = time.time_ns(), _PARSED.get(where, {}), []
        kept: Parsed = {}
        for info in infos:
            key = (info.mtime_ns or 0, info.size or 0)
            hit = cached.get(info.base_name)
            if hit is not None and hit[0] == key:
                exp = hit[1]
            else:
                try:
                    exp = Experiment.from_record(json.loads(self.location.read_bytes(info.path)))
                except FileNotFoundError:  # gone since the listing
                    continue
            if not self.location.remote and info.mtime_ns and now_ns - key[0] > SETTLED_NS:
                kept[info.base_name] = (key, exp)
            out.append(exp)
        if not self.location.remote:
            _PARSED[where] = kept
        return out

    def _store(self, exp: Experiment, *, new: bool) -> bool:
        path = self._path(exp.id)
        if new:
            return self.location.write_bytes_exclusive(path, encode(exp))
        self.location.replace_file(path, encode(exp))
        return True

    def __contains__(self, experiment_id: str) -> bool:
        return self.location.exists(self._path(experiment_id))

    def ids(self) -> list[str]:
        # file names, not records: listing needs no read per experiment
        names = [i.base_name for i in self.location.list_files(EXPERIMENTS_DIR)]
        return sorted(n[: -len(".json")] for n in names if n.endswith(".json"))
