"""What the archive holds for one experiment: its snapshot file, content hash, DVC pointer,
git tag and whether the data was pushed — read from the files and the git repository that
``metricvault archive export [--dvc]`` writes, never from the vault (the archive lives in
the git + DVC repository of the project, not in the vault).

``metricvault archive export <id>`` writes ``<archive_dir>/<id>.parquet``; with ``--dvc`` it
adds the file to DVC (``<id>.parquet.dvc``, the pointer with its md5), pushes it, commits the
pointer and tags the commit ``<archive_tag_prefix><id>`` with a JSON summary. ``publish``
pushes before it tags, so a tag means the data reached the remote when it was made; asking
the remote itself again (``check_remote``) runs ``dvc status --cloud`` (seconds).
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from metricvault.archive import dvc
from metricvault.archive.git import tag_commit
from metricvault.archive.repository import DEFAULT_TAG_PREFIX, _tag_record
from metricvault.archive.snapshot_format import read_info, snapshot_path
from metricvault.errors import MetricVaultError
from metricvault.gitinfo import repo_root

# state, in the order an export with --dvc goes through them
NOT_ARCHIVED, EXPORTED, ADDED, ARCHIVED = "not archived", "exported", "in DVC", "archived"


@dataclass(frozen=True)
class ArchiveState:
    """One experiment's archive state (fields None where the archive has no answer)."""

    experiment: str
    state: str  # not archived | exported (file only) | in DVC (pointer, no tag) | archived
    snapshot: str | None = None  # the file's path in its repository (else as configured)
    present: bool = False  # the snapshot file is in the workspace
    tier: str | None = None
    rows: int | None = None
    bytes: int | None = None
    content_hash: str | None = None
    md5: str | None = None  # from the .dvc pointer, else the tag's summary
    tag: str | None = None
    commit: str | None = None  # the commit the tag names
    remote: str | None = None  # the DVC remote the tag's summary names
    pushed: bool | None = None  # None: unknown (no DVC pointer)
    repository: str | None = None  # the git work tree holding the snapshot
    export_command: str = ""  # what makes (or completes) the archive

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def archive_state(
    experiment_id: str,
    archive_dir: str | Path = "artifacts/metrics",
    *,
    tag_prefix: str = DEFAULT_TAG_PREFIX,
    check_remote: bool = False,
    remote: str | None = None,
) -> ArchiveState:
    """The archive state of ``experiment_id`` under ``archive_dir`` (the ``archive_dir``
    setting; relative paths from the current directory) and its git repository.
    ``check_remote`` asks the DVC remote whether it holds the data (else a tag counts as
    pushed, since ``publish`` pushes before it tags)."""
    path = snapshot_path(archive_dir, experiment_id)
    export = f"metricvault archive export {experiment_id} --dvc"
    found: dict[str, Any] = {"snapshot": str(path), "present": path.is_file()}
    if found["present"]:
        try:
            info = read_info(path)
            found.update(
                tier=info.tier, rows=info.rows, bytes=info.bytes, content_hash=info.content_hash
            )
        except (MetricVaultError, OSError, KeyError, ValueError):
            pass  # not a snapshot (or unreadable): shown as a file without figures
    pointer = path.with_name(path.name + ".dvc")
    if pointer.is_file():
        with contextlib.suppress(MetricVaultError, OSError):
            found["md5"] = dvc.read_pointer(pointer.read_text())[0]
    tag = f"{tag_prefix}{experiment_id}"
    try:
        root: Path | None = repo_root(path.parent if path.parent.exists() else Path("."))
    except (MetricVaultError, OSError):
        root = None
    record: dict[str, object] = {}
    if root is not None:
        found["repository"] = str(root)
        with contextlib.suppress(ValueError):  # as the tag's summary names it
            found["snapshot"] = str(path.resolve().relative_to(root))
        commit = tag_commit(root, tag)
        if commit is not None:
            record = _tag_record(root, tag)
            found.update(tag=tag, commit=commit, remote=record.get("remote") or None)
            for key in ("tier", "rows", "bytes", "content_hash", "md5"):
                if found.get(key) is None and record.get(key) is not None:
                    found[key] = record[key]
    if found.get("tag"):
        state, found["pushed"] = ARCHIVED, True
    elif pointer.is_file():
        state, found["pushed"] = ADDED, False
    elif found["present"]:
        state = EXPORTED
    else:
        state = NOT_ARCHIVED
        export = f"metricvault archive export {experiment_id}"
    if check_remote and root is not None and pointer.is_file():
        try:
            missing = dvc.cloud_missing(root, [pointer], remote)
            found["pushed"] = str(path.resolve().relative_to(root)) not in missing
        except (MetricVaultError, OSError, ValueError):
            pass
    if state == ARCHIVED and found["pushed"]:
        export = ""
    return ArchiveState(experiment=experiment_id, state=state, export_command=export, **found)
