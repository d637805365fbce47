"""Where things live in a vault, on local disk or object storage (through ``pyarrow.fs``).

    <root>/catalog/v000000000042.json          catalog snapshots (the highest version is current)
    <root>/series/part-<id>-<owner>-<uuid>.parquet   the series table (id -> metric, labels, kind)
    <root>/data/<tier>/day=YYYY-MM-DD/part-<id>-<owner>-<uuid>.parquet
    <root>/experiments/<id>.json               the experiment registry (one file each)
    <root>/ha/<tenant>/<cluster>/<generation>.json  HA Prometheus pairs' elected replica (hashed
                                               names; server/ha.py)
    <state>/buffer.sqlite                      the durable ingest buffer (always local disk)
    <state>/buffer-worker-<pid>.sqlite         the buffer of one gateway worker process
    <state>/quarantine/                        corrupt buffer batches, kept for inspection
    <state>/vault.lock                         serialises catalog commits between processes
    <state>/maintain.lock                      one gateway worker at a time runs maintenance
    <state>/gateway-metrics/<run>/             gateway workers' prometheus-client files
                                               (with workers.lock; or under /dev/shm)

A local vault keeps ``<state>`` inside ``<root>``; an ``s3://`` vault keeps it in ``state_dir``.
Every name above is defined once, below, and used from here by the store, the gateway and
maintenance, so that no two of them can disagree on where a file lives. The agent's own
state (spool, counters) is not a vault's: its names stay in ``metricvault.collect``, which
must not import the store.

The catalog names files relative to ``<root>`` (so a vault still works after ``mv``, ``cp -a``,
``rsync``, a new mount point or a copy to another S3 prefix); ``<owner>`` is the first 16 hex
digits of the vault's id (kept in the catalog), which lets maintenance prove that a file nobody
references was written by this vault (a crashed flush) before it deletes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from metricvault.config import Settings
from metricvault.errors import ConfigError, NotFoundError, StorageError
from metricvault.fsutil import durable_tmp, durable_tmp_at, fsync_directory, write_atomically
from metricvault.store.s3 import S3Access

OWNER_CHARS = 16

CATALOG_DIR = "catalog"
SERIES_DIR = "series"
DATA_DIR = "data"
EXPERIMENTS_DIR = "experiments"
STATE_DIR = "state"
BUFFER_NAME = "buffer"
BUFFER_SUFFIX = ".sqlite"
WORKER_BUFFER_PREFIX = "buffer-worker-"
QUARANTINE_DIR = "quarantine"
VAULT_LOCK = "vault.lock"
MAINTAIN_LOCK = "maintain.lock"
HA_DIR = "ha"
GATEWAY_METRICS_DIR = "gateway-metrics"
WORKERS_LOCK = "workers.lock"
# a catalog path of any vault, old or new: what follows the root, whatever the root was
_VAULT_TAIL_RE = re.compile(r"(?:^|/)((?:data/[^/]+/day=[^/]+|series)/[^/]+\.parquet)$")


@dataclass
class Location:
    """A vault's root on some filesystem plus its local state directory."""

    uri: str
    fs: pafs.FileSystem
    root: str
    state_dir: Path
    remote: bool
    s3: S3Access | None = field(default=None, repr=False)  # conditional writes (catalog)

    def path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def relative(self, path: str) -> str:
        """``path`` as the catalog stores it: relative to the root."""
        prefix = self.root.rstrip("/") + "/"
        if not path.startswith(prefix):
            raise StorageError(f"{path} is not inside vault {self.uri}: a file outside the vault")
        return path[len(prefix) :]

    def resolve(self, stored: str) -> str:
        """A catalog path back to a full path under this root. Catalogs written before paths
        were relative hold absolute paths, possibly under a root the vault had before it was
        moved: those keep only their part from ``data/`` or ``series/`` on."""
        if stored.startswith(("data/", "series/")):
            return self.path(stored)
        prefix = self.root.rstrip("/") + "/"
        if stored.startswith(prefix):
            return stored
        tail = _VAULT_TAIL_RE.search(stored)
        if tail is None:
            raise StorageError(
                f"catalog names {stored!r}, which is not a vault data or series file path: "
                "the catalog is damaged; restore it from a backup"
            )
        return self.path(tail.group(1))

    def read_bytes(self, path: str) -> bytes:
        try:
            with self.fs.open_input_stream(path) as stream:
                return bytes(stream.read())
        except FileNotFoundError as exc:
            raise NotFoundError(f"{path} does not exist in vault {self.uri}") from exc
        except OSError as exc:
            raise StorageError(f"cannot read {path} from vault {self.uri}: {exc}") from exc

    def write_bytes_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` with ``data`` unless it exists; False when someone else won. Atomic
        against every other writer: ``link(2)`` on local disk, ``If-None-Match: *`` on S3."""
        if not self.remote:
            created = self._make_dirs(Path(path).parent)
            for directory in created:
                fsync_directory(directory.parent)
            tmp = str(durable_tmp(path, data))
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
            fsync_directory(Path(path).parent)
            return True
        if self.s3 is None:
            raise StorageError(f"{self.uri} has no S3 access for conditional writes")
        return self.s3.create_if_absent(path, data)

    def write_file(self, path: str, data: bytes) -> None:
        """Write a new immutable file, durably: when this returns the bytes and the directory
        entries leading to them survive a power cut, so the catalog commit that names the file
        next can never point at an empty or missing file. On S3 the completed PUT is that point.
        The file becomes visible only once a commit names it; a crash before leaves an orphan."""
        if self.remote:
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            with self.fs.open_output_stream(path) as out:
                out.write(data)
            return
        created = self._make_dirs(Path(path).parent)
        try:
            durable_tmp_at(Path(path), data)
        except OSError:
            Path(path).unlink(missing_ok=True)  # a full disk: leave no partial file behind
            raise
        fsync_directory(Path(path).parent)
        for directory in created:  # a new directory is itself an entry in its parent
            fsync_directory(directory.parent)

    def _make_dirs(self, directory: Path) -> list[Path]:
        """Create ``directory`` and missing parents; returns those created, deepest first."""
        missing = []
        while not directory.exists():
            missing.append(directory)
            directory = directory.parent
        for d in reversed(missing):
            d.mkdir(exist_ok=True)
        return missing

    def replace_file(self, path: str, data: bytes) -> None:
        """Write or overwrite a small file atomically (readers see the old or the new bytes)."""
        if self.remote:  # an S3 PUT replaces the object atomically
            self.write_file(path, data)
            return
        write_atomically(path, data)

    def exists(self, path: str) -> bool:
        return bool(self.fs.get_file_info(path).type != pafs.FileType.NotFound)

    def list_files(self, prefix: str) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(self.path(prefix), recursive=True, allow_not_found=True)
        return [i for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File]

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(path)

    def new_data_path(self, tier: str, day: str, file_id: int, owner: str = "") -> str:
        return self.path(DATA_DIR, tier, f"day={day}", _file_name(file_id, owner))

    def new_series_path(self, file_id: int, owner: str = "") -> str:
        return self.path(SERIES_DIR, _file_name(file_id, owner))


def buffer_file(state_dir: Path, name: str = BUFFER_NAME) -> Path:
    """The ingest buffer called ``name`` (``buffer``, or a worker's) in a state directory."""
    return state_dir / f"{name}{BUFFER_SUFFIX}"


def buffer_files(state_dir: Path) -> list[Path]:
    """Every ingest buffer of a state directory (SQLite's -wal/-shm files left out)."""
    return sorted(state_dir.glob(f"*{BUFFER_SUFFIX}"))


def worker_buffer_name(pid: int) -> str:
    """A gateway worker's own buffer: one writer per SQLite file, named so that a later
    process can tell whether its writer is still alive (:func:`worker_pid`)."""
    return f"{WORKER_BUFFER_PREFIX}{pid}"


def worker_pid(buffer_name: str) -> int | None:
    """The pid in a worker buffer's name, or None for any other buffer."""
    digits = buffer_name.removeprefix(WORKER_BUFFER_PREFIX)
    if digits == buffer_name or not digits.isdigit():
        return None
    return int(digits)


def _file_name(file_id: int, owner: str) -> str:
    """``owner`` is the vault id (``Catalog.owner()``); without it the file is named as before
    vault ids, and maintenance never deletes it unless a commit replaced it."""
    tag = f"-{owner[:OWNER_CHARS]}" if owner else ""
    return f"part-{file_id:010d}{tag}-{uuid.uuid4().hex[:12]}.parquet"


def written_by(path: str, owner: str) -> bool:
    """Whether ``path`` is named like a data or series file that vault ``owner`` wrote."""
    if len(owner) < OWNER_CHARS:
        return False
    name = path.rsplit("/", 1)[-1]
    return (
        re.fullmatch(rf"part-\d{{10}}-{owner[:OWNER_CHARS]}-[0-9a-f]{{12}}\.parquet", name)
        is not None
    )


def open_location(uri: str, settings: Settings, create: bool = True) -> Location:
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        return _open_s3(uri, parsed.netloc, parsed.path.strip("/"), settings)
    if parsed.scheme not in ("", "file"):
        raise ConfigError(
            f"unsupported vault URI {uri!r}: use a local directory or s3://bucket/prefix"
        )
    root = Path(parsed.path if parsed.scheme == "file" else uri).expanduser().resolve()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"vault path {root} exists and is not a directory")
    if not root.exists():
        if not create:
            raise NotFoundError(
                f"no vault at {root}: check --data / METRICVAULT_DATA, or create one by writing "
                "to it (metricvault import, metricvault demo, Vault.open(path))"
            )
        root.mkdir(parents=True)
    state = root / STATE_DIR
    state.mkdir(exist_ok=True)
    return Location(str(root), pafs.LocalFileSystem(), str(root), state, remote=False)


def _open_s3(uri: str, bucket: str, prefix: str, settings: Settings) -> Location:
    if not bucket:
        raise ConfigError(f"vault URI {uri!r} names no bucket: use s3://bucket/prefix")
    access = settings.s3_access_key or os.environ.get("AWS_ACCESS_KEY_ID") or None
    secret = settings.s3_secret_key or os.environ.get("AWS_SECRET_ACCESS_KEY") or None
    kwargs: dict[str, object] = {"region": settings.s3_region}
    if access and secret:
        kwargs.update(access_key=access, secret_key=secret)
    if settings.s3_endpoint:
        endpoint = urlparse(settings.s3_endpoint)
        if endpoint.scheme not in ("http", "https") or not endpoint.netloc:
            raise ConfigError(
                f"s3_endpoint {settings.s3_endpoint!r} is not an http(s) URL: write it as "
                f"http://{settings.s3_endpoint} (or https://...)"
            )
        kwargs["endpoint_override"] = endpoint.netloc
        kwargs["scheme"] = endpoint.scheme
    try:
        fs = pafs.S3FileSystem(**kwargs)
        info = fs.get_file_info(bucket)
    except (OSError, pa.ArrowException) as exc:
        raise StorageError(f"cannot reach S3 bucket {bucket!r} for {uri}: {exc}") from exc
    if info.type == pafs.FileType.NotFound:
        raise NotFoundError(
            f"S3 bucket {bucket!r} does not exist (endpoint {settings.s3_endpoint or 'AWS'}): "
            "create it first"
        )
    root = f"{bucket}/{prefix}".rstrip("/")
    if settings.state_dir:
        state = Path(settings.state_dir)
    else:
        digest = hashlib.sha1(f"{settings.s3_endpoint}|{root}".encode()).hexdigest()[:8]
        state = Path(".metricvault-state") / f"{bucket}-{digest}"
    state.mkdir(parents=True, exist_ok=True)
    s3 = S3Access(settings.s3_endpoint, settings.s3_region, access, secret)
    return Location(uri, fs, root, state.resolve(), remote=True, s3=s3)
