"""The experiment record: which series belong to a run, when it ran, and from which commit.

Beside :mod:`metricvault.model` (a leaf: no store, no archive), so every backend's registry,
the gateway and the training client share one record, one validation and one set of messages.
:class:`RegistryBase` is the registry every backend offers (``vault.experiments``): the file
registry of the embedded store (:mod:`metricvault.store.experiments`), the InfluxDB one
(:mod:`metricvault.store.backends.influx_meta`) and the gateway's
(:mod:`metricvault.store.backends.gateway`) differ only in how a record is loaded and stored.

Ids are safe slugs: they become file names, git tags (``metrics/<id>``) and snapshot names, so
anything path-like is refused.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from metricvault.durations import TimeLike, ms_to_datetime, now_ms, parse_time_ms
from metricvault.errors import ConflictError, InputError, NotFoundError
from metricvault.selector import parse_selectors

if TYPE_CHECKING:  # pyarrow only for the SQL view: the agent and track() import this module
    import pyarrow as pa

MAX_ID_LENGTH = 128
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHA_RE = re.compile(r"^[0-9a-f]{7,64}$")
EDITABLE = (
    "name",
    "selector",
    "start",
    "end",
    "git_repo",
    "git_sha",
    "owner",
    "tags",
    "notes",
    "params",
)


def validate_id(experiment_id: object) -> str:
    """Return the id if it is a safe slug, else raise InputError saying why."""
    if not isinstance(experiment_id, str) or not experiment_id:
        raise InputError("experiment id is empty: use a slug such as 'llama-70b-r3'")
    if len(experiment_id) > MAX_ID_LENGTH:
        raise InputError(
            f"experiment id is {len(experiment_id)} characters long; the limit is "
            f"{MAX_ID_LENGTH}: use a shorter slug"
        )
    path_like = "/" in experiment_id or "\\" in experiment_id or ".." in experiment_id
    if path_like or experiment_id.startswith((".", "~")):
        raise InputError(
            f"experiment id {experiment_id!r} looks like a path; ids become file names and git "
            "tags, so use letters, digits, '.', '_' and '-' only, starting with a letter or digit"
        )
    if not _ID_RE.match(experiment_id) or experiment_id.endswith((".", ".lock")):
        raise InputError(
            f"experiment id {experiment_id!r} is not a safe slug: use letters, digits, '.', '_' "
            "and '-' only, starting with a letter or digit and not ending in '.' or '.lock'"
        )
    return experiment_id


@dataclass(frozen=True)
class Experiment:
    """One registered experiment. Times are epoch milliseconds (UTC); ``end_ms`` None: running."""

    id: str
    selector: str
    start_ms: int
    end_ms: int | None = None
    name: str = ""
    git_repo: str = ""
    git_sha: str = ""
    owner: str = ""
    tags: tuple[str, ...] = ()
    notes: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    created_ms: int = 0
    tenant: str = ""  # set by a gateway for a tenant's credential: only that tenant sees it

    def to_record(self) -> dict[str, Any]:
        """The JSON form (sorted keys, ISO times), as stored and embedded in snapshots."""
        record = asdict(self)
        if not self.tenant:  # records (and snapshot bytes) of tenant-less runs stay as they were
            del record["tenant"]
        record["tags"] = list(self.tags)
        record["params"] = dict(self.params)
        record["start"] = _iso(self.start_ms)
        record["end"] = _iso(self.end_ms) if self.end_ms is not None else None
        return dict(sorted(record.items()))

    def to_json(self) -> str:
        return json.dumps(self.to_record(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Experiment:
        known = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in record.items() if k in known}
        values["tags"] = tuple(values.get("tags") or ())
        return cls(**values)

    def window(self, now: int | None = None) -> tuple[int, int]:
        """``[start, end)``; a running experiment ends now."""
        return self.start_ms, self.end_ms if self.end_ms is not None else (now or now_ms())


def _iso(ms: int) -> str:
    return ms_to_datetime(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def make_experiment(
    experiment_id: str,
    selector: str,
    *,
    start: TimeLike | None = None,
    end: TimeLike | None = None,
    name: str = "",
    git_repo: str = "",
    git_sha: str = "",
    owner: str = "",
    tags: Iterable[str] = (),
    notes: str = "",
    params: Mapping[str, Any] | None = None,
    now: int | None = None,
    tenant: str = "",
) -> Experiment:
    """Validate every field and build the record (``start`` defaults to now)."""
    now = now if now is not None else now_ms()
    exp = Experiment(
        id=validate_id(experiment_id),
        selector=selector,
        start_ms=parse_time_ms(start if start is not None else now, now=now),
        end_ms=None if end is None else parse_time_ms(end, now=now),
        name=name or experiment_id,
        git_repo=git_repo,
        git_sha=git_sha,
        owner=owner,
        tags=tuple(tags),
        notes=notes,
        params=dict(params or {}),
        created_ms=now,
        tenant=tenant,
    )
    return check(exp)


def check(exp: Experiment) -> Experiment:
    if not isinstance(exp.selector, str):
        raise InputError(f"experiment {exp.id!r}: the selector must be a string")
    parse_selectors(exp.selector)  # raises SelectorError with the position
    if exp.end_ms is not None and exp.end_ms <= exp.start_ms:
        raise InputError(
            f"experiment {exp.id!r} would end ({_iso(exp.end_ms)}) before it starts "
            f"({_iso(exp.start_ms)}): give an end after the start"
        )
    if exp.git_sha and not _SHA_RE.match(exp.git_sha):
        raise InputError(
            f"git commit {exp.git_sha!r} is not a hexadecimal commit id (7-64 lowercase hex "
            "digits): pass the output of `git rev-parse HEAD`"
        )
    for tag in exp.tags:
        if not isinstance(tag, str) or not tag.strip() or len(tag) > 64 or "," in tag:
            raise InputError(
                f"experiment tag {tag!r} is invalid: tags are non-empty strings of at most 64 "
                "characters without commas"
            )
    try:
        json.dumps(dict(exp.params), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InputError(
            f"experiment {exp.id!r}: params must be JSON (strings, finite numbers, booleans, "
            f"lists, objects): {exc}"
        ) from exc
    return exp


def apply_changes(exp: Experiment, changes: Mapping[str, Any]) -> Experiment:
    """``exp`` with the editable fields in ``changes`` replaced (times in any accepted form),
    validated; the registries of every backend update through this."""
    bad = sorted(set(changes) - set(EDITABLE))
    if bad:
        raise InputError(
            f"cannot update {', '.join(bad)} of an experiment; editable: {', '.join(EDITABLE)}"
        )
    values: dict[str, Any] = {k: v for k, v in changes.items() if k not in ("start", "end")}
    if "tags" in values:
        values["tags"] = tuple(values["tags"])
    if changes.get("start") is not None:
        values["start_ms"] = parse_time_ms(changes["start"])
    if "end" in changes:
        values["end_ms"] = None if changes["end"] is None else parse_time_ms(changes["end"])
    return check(replace(exp, **values))


class RegistryBase:
    """The experiment registry of a backend: ``vault.experiments.create("r3", '{job="r3"}')``.

    Subclasses say how one record is loaded (:meth:`_load`), all are listed (:meth:`_all`) and
    one is stored (:meth:`_store`); validation, ordering and every message live here, so the
    registries of all backends answer alike."""

    where = ""  # the vault named in messages (a URI)

    # ------------------------------------------------------------------ storage
    def _load(self, experiment_id: str) -> Experiment | None:
        raise NotImplementedError

    def _all(self) -> list[Experiment]:
        raise NotImplementedError

    def _store(self, exp: Experiment, *, new: bool) -> bool:
        """Store ``exp``; with ``new``, False (and nothing stored) if the id exists."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the registry
    def create(self, experiment_id: str, selector: str, **fields: Any) -> Experiment:
        """Register a new experiment (see :func:`make_experiment` for the fields)."""
        exp = make_experiment(experiment_id, selector, **fields)
        if not self._store(exp, new=True):
            raise ConflictError(conflict_message(exp.id))
        return exp

    def get(self, experiment_id: str) -> Experiment:
        exp = self._load(validate_id(experiment_id))
        if exp is None:
            raise NotFoundError(unknown_message(experiment_id, self.ids(), self.where))
        return exp

    def __contains__(self, experiment_id: str) -> bool:
        return self._load(validate_id(experiment_id)) is not None

    def ids(self) -> list[str]:
        return sorted(e.id for e in self._all())

    def list(self) -> list[Experiment]:
        """Every experiment, by start time."""
        return sorted(self._all(), key=lambda e: (e.start_ms, e.id))

    def update(self, experiment_id: str, **changes: Any) -> Experiment:
        """Change fields of an experiment (the id never changes). Times take the usual forms."""
        updated = apply_changes(self.get(experiment_id), changes)
        self._store(updated, new=False)
        return updated

    def end(self, experiment_id: str, at: TimeLike = "now") -> Experiment:
        """Mark an experiment finished at ``at`` (default: now)."""
        return self.update(experiment_id, end=at)


def conflict_message(experiment_id: str) -> str:
    """What ConflictError says when an id is taken."""
    return (
        f"experiment {experiment_id!r} already exists: choose another id, or change it with "
        f"`metricvault experiment update {experiment_id} ...`"
    )


def select(
    experiments: Iterable[Experiment],
    *,
    tags: Iterable[str] = (),
    params: Mapping[str, Any] | None = None,
    since: TimeLike | None = None,
) -> list[Experiment]:
    """The experiments that have every tag in ``tags``, every ``params`` value (a value given
    as text, e.g. from ``--param lr=3e-4``, also matches the number it spells) and started at
    or after ``since``."""
    wanted = dict(params or {})
    for key in wanted:
        if not isinstance(key, str) or not key:
            raise InputError(
                f"param filter {key!r} has no name: write KEY=VALUE, e.g. --param lr=3e-4"
            )
    since_ms = None if since is None else parse_time_ms(since)
    return [
        e
        for e in experiments
        if set(tags) <= set(e.tags)
        and all(k in e.params and _same_param(e.params[k], v) for k, v in wanted.items())
        and (since_ms is None or e.start_ms >= since_ms)
    ]


def _same_param(value: Any, wanted: Any) -> bool:
    if value == wanted:
        return True
    if not isinstance(wanted, str):
        return False
    try:
        return bool(value == json.loads(wanted))
    except json.JSONDecodeError:
        return str(value) == wanted


def unknown_message(experiment_id: str, known: list[str], where: str) -> str:
    """What NotFoundError says for an unknown id: close matches, else the known ids."""
    close = difflib.get_close_matches(experiment_id, known, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    listing = f" (known: {', '.join(known[:10])}{' ...' if len(known) > 10 else ''})"
    return (
        f"no experiment {experiment_id!r} in vault {where}{hint}"
        f"{listing if known and not close else ''}. Register it with "
        f"`metricvault experiment create {experiment_id} --selector ...`"
    )


def experiments_table(experiments: Iterable[Experiment]) -> pa.Table:
    """One row per experiment (tags comma-joined, params as JSON) for SQL views."""
    rows = []
    for exp in experiments:
        record = exp.to_record()
        record["tags"] = ",".join(exp.tags)
        record["params"] = json.dumps(dict(exp.params), sort_keys=True)
        rows.append(record)
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=experiments_schema())


def experiments_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("name", pa.string()),
            ("selector", pa.string()),
            ("start", pa.string()),
            ("end", pa.string()),
            ("start_ms", pa.int64()),
            ("end_ms", pa.int64()),
            ("git_repo", pa.string()),
            ("git_sha", pa.string()),
            ("owner", pa.string()),
            ("tags", pa.string()),
            ("notes", pa.string()),
            ("params", pa.string()),
            ("created_ms", pa.int64()),
        ]
    )


def __getattr__(name: str) -> Any:
    if name == "EXPERIMENTS_SCHEMA":  # kept for importers of the old constant
        return experiments_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def encode(exp: Experiment) -> bytes:
    """The file form of a record (indented, sorted keys, trailing newline)."""
    return (json.dumps(exp.to_record(), sort_keys=True, indent=2) + "\n").encode()
