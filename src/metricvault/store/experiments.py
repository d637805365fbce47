"""The embedded store's experiment registry: one JSON file ``<vault>/experiments/<id>.json``
per experiment, replaced atomically on update, so the registry lives next to the data it
describes (local disk or S3) and needs no server. The record, its checks and messages are
:mod:`metricvault.experiment`'s."""

from __future__ import annotations

import json

from metricvault.experiment import Experiment, RegistryBase, encode, validate_id
from metricvault.store.layout import EXPERIMENTS_DIR, Location


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
        return [self.get(i) for i in self.ids()]

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
