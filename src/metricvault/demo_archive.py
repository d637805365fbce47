"""The demo's last act: freeze one simulated run as a snapshot, version it with DVC and a git tag
in a throw-away repository next to the vault, forget it locally, and bring it back by tag."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from metricvault.archive import dvc
from metricvault.archive.repository import publish, restore, verify
from metricvault.archive.snapshot_export import export_snapshot
from metricvault.archive.snapshot_format import SnapshotInfo
from metricvault.errors import ArchiveError
from metricvault.gitinfo import git
from metricvault.store.vault import Vault

ARCHIVE_MARKER = "demo-archive.txt"


@dataclass(frozen=True)
class ArchiveOutcome:
    """What the demo's archive step did, for the console and the report."""

    snapshot: SnapshotInfo
    tag: str = ""  # empty: not versioned (no DVC)
    commit: str = ""
    restored: bool | None = None  # restored by tag byte-identical; None: not tried
    verified: str = ""  # `archive verify` statuses
    note: str = ""  # why it was not versioned
    hint: str = ""  # commands for the user to try


def archive_first_job(
    vault: Vault, experiment_id: str, vault_path: Path, fresh: bool, console: Console
) -> ArchiveOutcome:
    """Export, archive and restore ``experiment_id``; say what happened."""
    root = vault_path.with_name(vault_path.name + "-archive")
    repo, remote = root / "paper", root / "dvc-remote"
    if fresh and root.exists():
        if not (root / ARCHIVE_MARKER).exists():
            raise SystemExit(f"{root} exists and was not made by 'metricvault demo': remove it")
        shutil.rmtree(root)
    repo.mkdir(parents=True, exist_ok=True)
    (root / ARCHIVE_MARKER).write_text("made by 'metricvault demo'; it may replace it\n")
    console.print(f"archiving experiment {experiment_id} (raw samples) into {repo} ...")
    info = export_snapshot(vault, experiment_id, repo / "artifacts" / "metrics")
    console.print(
        f"  snapshot {info.path.name}: {info.rows:,} rows, {info.bytes:,} bytes "
        f"({info.bytes / info.rows:.2f} B/row), {info.content_hash[:23]}..."
    )
    try:
        dvc.executable()
    except ArchiveError as exc:
        console.print(f"  [yellow]not versioned[/]: {exc}")
        hint = f"  metricvault archive open {info.path} mfu --step 1h\n"
        return ArchiveOutcome(info, note=str(exc), hint=hint)
    _git_repo(repo)
    done = publish(info, init=True, remote_url=str(remote.resolve()))
    console.print(f"  dvc add + push to {remote}, commit {done.commit[:12]}, tag {done.tag}")
    digest = hashlib.sha256(info.path.read_bytes()).hexdigest()
    info.path.unlink()
    shutil.rmtree(repo / ".dvc" / "cache", ignore_errors=True)
    restored = restore(experiment_id, repo)
    same = hashlib.sha256(restored.read_bytes()).hexdigest() == digest
    verified = ", ".join(c.status for c in verify(repo))
    console.print(
        f"  deleted the file and DVC's cache, restored it by tag: "
        f"{'byte-identical' if same else 'DIFFERENT'}; verify: {verified}"
    )
    hint = (
        f"  cd {repo} && metricvault archive list && metricvault archive verify\n"
        f"  metricvault archive open {repo / 'artifacts/metrics' / info.path.name} "
        f"'mfu{{job=\"{experiment_id}\"}}' --step 1h\n"
    )
    return ArchiveOutcome(info, done.tag, done.commit, same, verified, hint=hint)


def _git_repo(repo: Path) -> None:
    if (repo / ".git").exists():
        return
    git(repo, "init", "--quiet")
    git(repo, "config", "user.name", "metricvault demo")
    git(repo, "config", "user.email", "demo@metricvault.invalid")
    (repo / "README.md").write_text(
        "Throw-away repository made by `metricvault demo`: it shows how a paper's repository\n"
        "keeps its metric snapshots (DVC pointers + tags metrics/<experiment-id>).\n"
    )
    git(repo, "add", "README.md")
    git(repo, "commit", "--quiet", "-m", "paper repository (demo)")
