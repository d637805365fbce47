"""The few git operations the archive needs, through the ``git`` command line (the lookups
``metricvault.track`` shares live in :mod:`metricvault.gitinfo`)."""

from __future__ import annotations

from pathlib import Path

from metricvault.errors import ArchiveError
from metricvault.gitinfo import git, has_commits


def tag_commit(repo: Path, tag: str) -> str | None:
    """The commit a tag points to, or None if the tag does not exist."""
    done = git(repo, "rev-parse", "--verify", "-q", f"refs/tags/{tag}^{{commit}}", check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def show_file(repo: Path, rev: str, path: str) -> str | None:
    """A file's text at a revision (``path`` relative to the repository root), or None."""
    done = git(repo, "show", f"{rev}:{path}", check=False)
    return done.stdout if done.returncode == 0 else None


def changed_paths(repo: Path, paths: list[str]) -> list[str]:
    """Those of ``paths`` (relative) with staged or unstaged changes against HEAD."""
    if not has_commits(repo):
        return []
    out = git(repo, "status", "--porcelain", "--untracked-files=no", "--", *paths).stdout
    return [line[3:] for line in out.splitlines() if line.strip()]


def check_ref_name(tag: str) -> str:
    if git(Path("."), "check-ref-format", f"refs/tags/{tag}", check=False).returncode != 0:
        raise ArchiveError(f"{tag!r} is not a valid git tag name; choose another --tag")
    return tag
