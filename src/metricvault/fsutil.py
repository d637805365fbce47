"""Durable local files: written whole or not at all, surviving a power cut.

Light on purpose (standard library only): the store, the agent's spool and its state file all
use it, and the agent must not import the store's dependencies.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def durable_tmp(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to a fsynced temporary file beside ``path`` (``<path>.tmp-<random>``)."""
    return durable_tmp_at(Path(f"{path}.tmp-{uuid.uuid4().hex}"), data)


def durable_tmp_at(tmp: Path, data: bytes) -> Path:
    tmp.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return tmp


def write_atomically(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: readers see the old bytes or the new, never a mix. On
    failure (a full disk) no temporary file is left behind and the error propagates."""
    tmp = Path(f"{path}.tmp-{uuid.uuid4().hex}")
    try:
        tmp = durable_tmp_at(tmp, data)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(Path(path).parent)


def fsync_directory(directory: str | Path) -> None:
    """Make a rename, link or unlink durable (the directory entry is what changed)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
