"""Real full disks for the fault tests: a small tmpfs, and a filler that fills it to ENOSPC.

The tests run as root here and in CI (make test installs Debian packages as root); where
mounting is not allowed they skip, saying why.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (e.g. ``"512k"``) on a fresh ``mount_point``; unmount after."""
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the tests run as root here and in CI)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)


def fill(directory: Path, name: str = "filler") -> Path:
    """Write a file until the file system is full (ENOSPC); returns it."""
    filler = directory / name
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\xff" * 4096)  # a short write is followed by ENOSPC on the next
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler
