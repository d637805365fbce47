"""A throwaway PostgreSQL cluster on 127.0.0.1 (Debian's `postgresql` binaries), for the
Iceberg SQL catalog's multi-machine form.

`initdb` refuses to run as root, so as root the cluster runs as the `postgres` user (the
Debian package creates it; `nobody` otherwise) through `runuser -u USER --`. That user cannot
enter pytest's tmp_path (under the 0700 `/tmp/pytest-of-root`), so as root the cluster lives in
its own `tempfile.mkdtemp()` directory under /tmp, owned by that user and removed at the end;
otherwise in the test's tmp_path. The server listens on 127.0.0.1 only, on a port bound free
just before, with its socket in that directory (never /var/run/postgresql), fsync off; it is
stopped with `pg_ctl stop -m immediate` and the directory deleted. docs/testing.md says this.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

START_TIMEOUT_S = 60
DB_USER = "mv"
INITDB_OPTS = ("--auth=trust", "-E", "UTF8", "--no-sync")


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    database: str
    root: Path

    @property
    def uri(self) -> str:
        """The SQLAlchemy URI (psycopg 3) of the database, as iceberg_catalog takes it."""
        return f"postgresql+psycopg://{DB_USER}@{self.host}:{self.port}/{self.database}"


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    return Path(found[-1]).parent if found else None


def _version(path: str) -> float:
    try:
        return float(Path(path).parts[-3])
    except ValueError:
        return 0.0


def _run_as() -> list[str]:
    if os.geteuid() != 0:
        return []
    for user in ("postgres", "nobody"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            continue
        return ["runuser", "-u", user, "--"]
    pytest.skip("running as root and neither a postgres nor a nobody user exists for initdb")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_postgres(tmp_path: Path, database: str = "iceberg") -> Iterator[Postgres]:
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("Debian's postgresql is not installed (make system-deps installs it)")
    prefix = _run_as()
    if prefix:
        root = Path(tempfile.mkdtemp(prefix="metricvault-pg-"))
        user = pwd.getpwnam(prefix[2])
        os.chown(root, user.pw_uid, user.pw_gid)
    else:
        root = tmp_path / "postgres"
        root.mkdir()
    data, log = root / "data", root / "server.log"
    started = False
    try:
        subprocess.run(
            [*prefix, str(bindir / "initdb"), "-D", str(data), "-U", DB_USER, *INITDB_OPTS],
            check=True,
            capture_output=True,
            timeout=START_TIMEOUT_S * 2,
        )
        for _ in range(3):  # the free port may be taken between bind and listen
            port = _free_port()
            opts = f"-k {root} -p {port} -h 127.0.0.1 -c fsync=off -c full_page_writes=off"
            pg_ctl = [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t"]
            done = subprocess.run(
                [*prefix, *pg_ctl, str(START_TIMEOUT_S), "-o", opts, "start"],
                capture_output=True,
                timeout=START_TIMEOUT_S + 10,
            )
            if done.returncode == 0:
                started = True
                break
        if not started:
            raise RuntimeError(f"PostgreSQL did not start: {log.read_text()[-3000:]}")
        where = ["-h", "127.0.0.1", "-p", str(port), "-U", DB_USER]
        subprocess.run(
            [*prefix, str(bindir / "createdb"), *where, database],
            check=True,
            capture_output=True,
            timeout=START_TIMEOUT_S,
        )
        yield Postgres("127.0.0.1", port, database, root)
    finally:
        if started:
            subprocess.run(
                [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                capture_output=True,
                timeout=START_TIMEOUT_S,
            )
        shutil.rmtree(root, ignore_errors=True)
