"""The git lookups both the archive and ``metricvault.track`` need (which repository, which
commit), through the ``git`` command line.

A leaf module: ``collect`` (the training API) records the commit a run came from without
importing ``archive``; ``metricvault.archive.git`` adds the tag operations the archive needs.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from metricvault.errors import ArchiveError

GIT_TIMEOUT_S = 120


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``git -C repo args``; a failure raises ArchiveError with git's own message."""
    exe = shutil.which("git")
    if exe is None:
        raise ArchiveError("git is not installed: install it (e.g. apt-get install git)")
    try:
        done = subprocess.run(
            [exe, "-C", str(repo), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise ArchiveError(f"git {' '.join(args)} did not finish in {GIT_TIMEOUT_S} s") from exc
    if check and done.returncode != 0:
        raise ArchiveError(f"git {' '.join(args)} failed: {done.stderr.strip() or done.stdout}")
    return done


def repo_root(path: str | Path = ".") -> Path:
    """The top of the git work tree containing ``path``; ArchiveError if there is none."""
    start = Path(path).resolve()
    probe = start if start.is_dir() else start.parent
    while not probe.exists():
        probe = probe.parent
    done = git(probe, "rev-parse", "--show-toplevel", check=False)
    if done.returncode != 0:
        raise ArchiveError(
            f"{start} is not in a git repository: snapshots are versioned with git tags. Run "
            "`git init` there (and commit once), or pass --repo with a repository"
        )
    return Path(done.stdout.strip())


def head(repo: Path) -> tuple[str, str, bool]:
    """(commit SHA of HEAD, URL of the 'origin' remote or '', whether the tree is dirty)."""
    sha = git(repo, "rev-parse", "HEAD").stdout.strip()
    origin = git(repo, "remote", "get-url", "origin", check=False)
    dirty = bool(git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip())
    return sha, origin.stdout.strip() if origin.returncode == 0 else "", dirty


def has_commits(repo: Path) -> bool:
    return git(repo, "rev-parse", "--verify", "-q", "HEAD", check=False).returncode == 0
