"""DVC through its command line (the stable interface), one call at a time.

DVC takes a repository-wide lock, so concurrent calls fail with "Unable to acquire lock"; every
call here holds a process-wide lock and an ``fcntl`` lock on ``.dvc/tmp/metricvault.lock``, so
threads and processes of metricvault queue instead. Analytics are switched off
(``DVC_NO_ANALYTICS``): the archive must work offline and must not phone home from a cluster.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from metricvault.errors import ArchiveError

DVC_TIMEOUT_S = 1800
_LOCK = threading.Lock()


def executable() -> str:
    """The ``dvc`` next to this Python (a venv) or on PATH."""
    beside = Path(sys.executable).with_name("dvc")
    if beside.exists():
        return str(beside)
    found = shutil.which("dvc")
    if found is None:
        raise ArchiveError(
            "DVC is not installed: pip install 'metricvault[archive]' (or `pip install dvc dvc-s3`)"
        )
    return found


@contextmanager
def _locked(repo: Path) -> Iterator[None]:
    with _LOCK:
        if not (repo / ".dvc").is_dir():  # `dvc init`: nothing to lock yet but this process
            yield
            return
        tmp = repo / ".dvc" / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        with open(tmp / "metricvault.lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def run(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``dvc args`` in ``repo`` under the lock."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "DVC_NO_UPDATER": "1"}
    with _locked(repo):
        try:
            return subprocess.run(
                [executable(), *args],
                cwd=repo,
                env=env,
                capture_output=True,
                text=True,
                timeout=DVC_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as exc:
            raise ArchiveError(f"dvc {' '.join(args)} did not finish in {DVC_TIMEOUT_S} s") from exc


def dvc(repo: Path, *args: str, what: str = "") -> str:
    """Run ``dvc args``; failure raises ArchiveError with DVC's message (``what``: context)."""
    done = run(repo, *args)
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        detail = " ".join(line for line in message if "dvc.org/support" not in line).strip()
        raise ArchiveError(f"{what or 'dvc ' + ' '.join(args)} failed: {detail}")
    return done.stdout


def is_repo(repo: Path) -> bool:
    return (repo / ".dvc").is_dir()


def init(repo: Path) -> None:
    dvc(repo, "init", "--quiet", what="dvc init")
    dvc(repo, "config", "core.analytics", "false", what="dvc config core.analytics false")


def remotes(repo: Path) -> dict[str, str]:
    """Remote name -> URL, from ``dvc remote list``."""
    out = dvc(repo, "remote", "list", what="dvc remote list")
    pairs = (line.split(None, 1) for line in out.splitlines() if line.strip())
    return {p[0]: p[1].strip() if len(p) > 1 else "" for p in pairs}


def default_remote(repo: Path) -> str | None:
    done = run(repo, "remote", "default")  # fails when none is set
    return done.stdout.strip() or None if done.returncode == 0 else None


def add(repo: Path, path: Path) -> Path:
    """``dvc add``: cache the file and write ``<path>.dvc``; returns the pointer's path."""
    dvc(repo, "add", "--quiet", str(path.relative_to(repo)), what=f"dvc add {path.name}")
    return path.with_name(path.name + ".dvc")


def push(repo: Path, pointer: Path, remote: str | None) -> None:
    args = ["push", "--quiet", str(pointer.relative_to(repo))]
    dvc(repo, *args, *(["--remote", remote] if remote else []), what=f"dvc push {pointer.name}")


def get(repo: Path, path: str, rev: str, out: Path, remote: str | None) -> None:
    """The file ``path`` as of git revision ``rev``, fetched from the remote into ``out``."""
    args = ["get", str(repo), path, "--rev", rev, "--out", str(out), "--force"]
    if remote:
        args += ["--remote", remote]
    local_config = repo / ".dvc" / "config.local"
    if local_config.exists():  # credentials live there; `dvc get` would not read them
        args += ["--config", str(local_config)]
    dvc(repo, *args, what=f"dvc get {path} at {rev}")


def cloud_missing(repo: Path, pointers: list[Path], remote: str | None) -> set[str]:
    """Paths (as DVC prints them) of the given pointers whose data is not in the remote
    (DVC says "new": only in the local cache, "missing": nowhere; "deleted" means in the remote
    but not in the cache, which is fine)."""
    if not pointers:
        return set()
    args = ["status", "--cloud", "--json", *(str(p.relative_to(repo)) for p in pointers)]
    out = dvc(repo, *args, *(["--remote", remote] if remote else []), what="dvc status --cloud")
    status = json.loads(out or "{}")
    return {path for path, state in status.items() if state in ("new", "missing")}


def read_pointer(text: str) -> tuple[str, int, str]:
    """(md5, size, out path) of a single-output ``.dvc`` file's text."""
    try:
        body = yaml.safe_load(text)
        out = body["outs"][0]
        return str(out["md5"]), int(out.get("size", -1)), str(out["path"])
    except (yaml.YAMLError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise ArchiveError(f"not a DVC pointer file (no outs/md5): {exc}") from exc


def file_md5(path: Path) -> str:
    """The MD5 DVC 3 records for a file (of its bytes)."""
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
