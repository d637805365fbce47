"""Snapshots in a git + DVC repository: publish (dvc add/push, commit, tag), restore by tag,
verify checksums, list.

Publishing pushes the data before it commits the pointer, so no commit or tag ever names data
the remote does not have. A tag ``metrics/<experiment-id>`` is annotated with a JSON summary
(path, md5, rows, content hash), which is how ``list`` and ``restore`` find snapshots without
reading the data.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from metricvault.archive import dvc
from metricvault.archive.git import changed_paths, check_ref_name, show_file, tag_commit
from metricvault.archive.snapshot_format import SnapshotInfo, content_hash, read_info
from metricvault.errors import ArchiveError, ConflictError, MetricVaultError, NotFoundError
from metricvault.experiment import validate_id
from metricvault.gitinfo import git, repo_root

DEFAULT_TAG_PREFIX = "metrics/"
_INIT_FILES = (".dvc/config", ".dvc/.gitignore", ".dvcignore")


@dataclass(frozen=True)
class Published:
    snapshot: Path
    pointer: Path
    tag: str
    commit: str
    md5: str
    remote: str
    created: bool  # False: the tag already held exactly this content


def publish(
    info: SnapshotInfo,
    repo: str | Path | None = None,
    *,
    tag: str | None = None,
    remote: str | None = None,
    init: bool = False,
    tag_prefix: str = DEFAULT_TAG_PREFIX,
    remote_url: str | None = None,
    remote_endpoint: str | None = None,
) -> Published:
    """``dvc add`` + ``dvc push`` the snapshot, commit its pointer, tag the commit.

    ``init`` runs ``dvc init`` where there is no DVC repository; ``remote_url`` (a directory or
    ``s3://bucket/prefix``, with ``remote_endpoint`` for S3-compatible servers) adds a default
    remote named ``metricvault`` where none is configured. Both changes are committed with the
    pointer; credentials never are (use the environment or ``dvc remote modify --local``).
    """
    snapshot = info.path.resolve()
    root = repo_root(repo if repo is not None else snapshot.parent)
    rel = _inside(root, snapshot)
    pointer_rel = rel + ".dvc"
    tag = check_ref_name(tag or f"{tag_prefix}{info.experiment.id}")
    _ensure_dvc(root, init)
    if remote_url:
        remote = _add_remote(root, remote_url, remote_endpoint)
    remote_name = _choose_remote(root, remote)
    _refuse_dirty(root, rel, pointer_rel)
    md5 = dvc.file_md5(snapshot)
    if _already_tagged(root, tag, pointer_rel, md5):
        pointer = dvc.add(root, snapshot)
        dvc.push(root, pointer, remote_name)
        commit = tag_commit(root, tag) or ""
        return Published(snapshot, pointer, tag, commit, md5, remote_name, created=False)
    pointer = dvc.add(root, snapshot)
    dvc.push(root, pointer, remote_name)  # data first: no commit names data the remote lacks
    # DVC's own files go into the commit whenever they are new or changed (not only after
    # --init): `dvc get --rev TAG` reads the remote from the tag's commit, so a remote added by
    # hand and never committed would leave the snapshot unrestorable. Credentials live in
    # config.local, which is never committed.
    paths = [pointer_rel, str(Path(rel).parent / ".gitignore")]
    paths += [p for p in _INIT_FILES if (root / p).exists()]
    _commit(root, paths, f"metrics: snapshot of experiment {info.experiment.id} ({info.tier})")
    summary = _summary(info, rel, md5, remote_name)
    git(root, "tag", "-a", tag, "-m", summary)
    commit = git(root, "rev-parse", "HEAD").stdout.strip()
    return Published(snapshot, pointer, tag, commit, md5, remote_name, created=True)


def check_ready(
    snapshot: Path,
    repo: str | Path | None = None,
    *,
    init: bool = False,
    remote: str | None = None,
    remote_url: str | None = None,
) -> None:
    """Refuse early (before a long export) what :func:`publish` would refuse: no git
    repository, a path outside it, no DVC repository without ``init``, no remote."""
    snapshot = snapshot.resolve()
    root = repo_root(repo if repo is not None else snapshot.parent)
    _inside(root, snapshot)
    if not dvc.is_repo(root):
        _ensure_dvc(root, init=False) if not init else None
        if not remote_url:
            raise ArchiveError(
                f"--init makes a new DVC repository in {root}, which has no remote yet: pass "
                "--remote-url DIR_OR_S3_URL too (or set one up: `dvc init && dvc remote add -d "
                "store /path/to/storage`)"
            )
    elif not remote_url:
        _choose_remote(root, remote)


def _add_remote(root: Path, url: str, endpoint: str | None) -> str:
    name = "metricvault"
    known = dvc.remotes(root)
    if name in known and known[name] != url:
        raise ArchiveError(
            f"DVC remote {name!r} already points to {known[name]}, not {url}: pass --remote "
            f"{name} to use it, or change it with `dvc remote modify {name} url {url}`"
        )
    if name not in known:
        dvc.dvc(root, "remote", "add", "--default", name, url, what="dvc remote add")
    if endpoint:
        dvc.dvc(root, "remote", "modify", name, "endpointurl", endpoint, what="dvc remote modify")
    return name


def _inside(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        raise ArchiveError(
            f"snapshot {path} is outside the git repository {root}: export it into the "
            f"repository (e.g. -o {root / 'artifacts' / 'metrics'})"
        ) from None


def _ensure_dvc(root: Path, init: bool) -> bool:
    if dvc.is_repo(root):
        return False
    if not init:
        raise ArchiveError(
            f"{root} is not a DVC repository: run `dvc init` there, or pass --init to let "
            "metricvault do it"
        )
    dvc.init(root)
    return True


def _choose_remote(root: Path, remote: str | None) -> str:
    known = dvc.remotes(root)
    if remote:
        if remote not in known:
            raise ArchiveError(
                f"DVC remote {remote!r} is not configured in {root} (configured: "
                f"{', '.join(known) or 'none'}): add it with `dvc remote add {remote} URL`"
            )
        return remote
    default = dvc.default_remote(root)
    if default:
        return default
    raise ArchiveError(
        f"no DVC remote configured in {root}: add one with `dvc remote add -d store "
        "/path/to/storage` (or s3://bucket/prefix plus `dvc remote modify store endpointurl "
        "URL` for MinIO and other S3-compatible servers), or pass --remote NAME"
    )


def _refuse_dirty(root: Path, rel: str, pointer_rel: str) -> None:
    if git(root, "ls-files", "--error-unmatch", rel, check=False).returncode == 0:
        raise ArchiveError(
            f"{rel} is tracked by git itself; DVC must track it instead. Run `git rm --cached "
            f"{rel}` and commit, then archive again"
        )
    dirty = changed_paths(root, [pointer_rel])
    if dirty:
        raise ArchiveError(
            f"{pointer_rel} has uncommitted changes in {root}: commit or revert them "
            "(`git checkout -- FILE`) before archiving, so the tag records exactly one snapshot"
        )


def _already_tagged(root: Path, tag: str, pointer_rel: str, md5: str) -> bool:
    """True if ``tag`` exists and records exactly this content; a tag with other content is a
    conflict, because tags are never moved."""
    if tag_commit(root, tag) is None:
        return False
    text = show_file(root, tag, pointer_rel)
    old = dvc.read_pointer(text)[0] if text else None
    if old == md5:
        return True
    held = f"md5 {old}" if old else f"no {pointer_rel}"
    raise ConflictError(
        f"tag {tag} already exists with different content ({held}; the new snapshot has md5 "
        f"{md5}): tags are never moved. Archive under another tag (--tag {tag}-v2), or delete "
        f"the old tag (`git tag -d {tag}`) if it was a mistake"
    )


def _commit(root: Path, paths: list[str], message: str) -> None:
    git(root, "add", "--", *paths)
    staged = git(root, "diff", "--cached", "--quiet", "--", *paths, check=False)
    if staged.returncode != 0:  # something changed (a re-export of equal data changes nothing)
        git(root, "commit", "--quiet", "-m", message, "--", *paths)


def _summary(info: SnapshotInfo, rel: str, md5: str, remote: str) -> str:
    record = {
        "experiment": info.experiment.id,
        "git_sha": info.experiment.git_sha,
        "tier": info.tier,
        "rows": info.rows,
        "bytes": info.bytes,
        "content_hash": info.content_hash,
        "md5": md5,
        "path": rel,
        "remote": remote,
    }
    head = (
        f"metricvault snapshot of experiment {info.experiment.id}: {info.tier}, {info.rows:,} rows"
    )
    return head + "\n\n" + json.dumps(record, sort_keys=True, indent=2) + "\n"


# --------------------------------------------------------------------------- restore
def parse_ref(ref: str, tag_prefix: str = DEFAULT_TAG_PREFIX) -> tuple[str, str]:
    """``EXP`` or ``EXP@TAG`` -> (experiment id, tag)."""
    exp_id, _, tag = ref.partition("@")
    validate_id(exp_id)
    return exp_id, check_ref_name(tag or f"{tag_prefix}{exp_id}")


def restore(
    ref: str,
    repo: str | Path = ".",
    *,
    out: str | Path | None = None,
    remote: str | None = None,
    force: bool = False,
    tag_prefix: str = DEFAULT_TAG_PREFIX,
) -> Path:
    """Bring back the snapshot a tag records (from the DVC remote), byte-identical."""
    root = repo_root(repo)
    exp_id, tag = parse_ref(ref, tag_prefix)
    if tag_commit(root, tag) is None:
        known = sorted(tagged(root, tag_prefix))
        raise NotFoundError(
            f"no tag {tag} in {root} (snapshot tags: {', '.join(known) or 'none'}): check the "
            "experiment id, or `git fetch --tags` if it was archived elsewhere"
        )
    rel = str(_tag_record(root, tag).get("path") or f"artifacts/metrics/{exp_id}.parquet")
    text = show_file(root, tag, rel + ".dvc")
    if text is None:
        raise NotFoundError(f"tag {tag} does not hold the pointer {rel}.dvc")
    md5 = dvc.read_pointer(text)[0]
    target = Path(out).resolve() if out else root / rel
    if target.exists():
        if dvc.file_md5(target) == md5:
            return target
        if not force:
            raise ArchiveError(
                f"{target} exists with other content than {tag}: pass --force to replace it, "
                "or -o to restore elsewhere"
            )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.restore-{uuid.uuid4().hex[:8]}")
    try:
        dvc.get(root, rel, tag, tmp, remote)
        got = dvc.file_md5(tmp)
        if got != md5:
            raise ArchiveError(f"restored {rel} from {tag} has md5 {got}, the tag records {md5}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def tagged(root: Path, tag_prefix: str = DEFAULT_TAG_PREFIX) -> dict[str, dict[str, object]]:
    """Snapshot tags under the prefix -> their JSON summaries ({} for foreign tags)."""
    ref = f"refs/tags/{tag_prefix.rstrip('/')}"
    out = git(root, "for-each-ref", "--format=%(refname:strip=2)", ref).stdout
    return {name: _tag_record(root, name) for name in out.split()}


def _tag_record(root: Path, tag: str) -> dict[str, object]:
    body = git(root, "tag", "-l", "--format=%(contents)", tag).stdout
    start = body.find("{")
    try:
        record = json.loads(body[start : body.rfind("}") + 1]) if start >= 0 else {}
    except json.JSONDecodeError:
        return {}
    return record if isinstance(record, dict) else {}


# --------------------------------------------------------------------------- verify / list
@dataclass(frozen=True)
class Checked:
    path: Path
    status: str  # ok | absent | md5 mismatch | content hash mismatch | unreadable
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "absent")


def pointers(root: Path) -> list[Path]:
    """Every ``*.parquet.dvc`` pointer in the repository (tracked or not, not ignored)."""
    out = git(root, "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.parquet.dvc")
    return sorted({root / line for line in out.stdout.splitlines() if line.strip()})


def verify(repo: str | Path = ".", files: list[str | Path] | None = None) -> list[Checked]:
    """Check each snapshot against its ``.dvc`` md5 (where it has one) and its content hash."""
    if files:
        return [_check(Path(f).resolve(), _pointer_md5(Path(f))) for f in files]
    root = repo_root(repo)
    results = []
    for pointer in pointers(root):
        md5, _, out = dvc.read_pointer(pointer.read_text())
        results.append(_check(pointer.parent / out, md5))
    return results


def _pointer_md5(path: Path) -> str | None:
    pointer = path.with_name(path.name + ".dvc")
    return dvc.read_pointer(pointer.read_text())[0] if pointer.exists() else None


def _check(path: Path, md5: str | None) -> Checked:
    if not path.exists():
        return Checked(path, "absent", "not in the workspace: `metricvault archive restore`")
    if md5 is not None and (got := dvc.file_md5(path)) != md5:
        return Checked(path, "md5 mismatch", f"file {got}, pointer {md5}")
    try:
        info = read_info(path)
        recomputed = content_hash(path)
    except (MetricVaultError, OSError) as exc:
        return Checked(path, "unreadable", str(exc))
    if recomputed != info.content_hash:
        return Checked(
            path, "content hash mismatch", f"rows {recomputed}, metadata {info.content_hash}"
        )
    return Checked(path, "ok", f"{info.rows:,} rows, {info.content_hash[:19]}")


@dataclass(frozen=True)
class Listed:
    pointer: Path
    experiment: str
    tags: tuple[str, ...]
    bytes: int
    rows: int | None
    tier: str
    present: bool
    in_remote: bool | None  # None: not asked


def list_snapshots(
    repo: str | Path = ".",
    *,
    remote: str | None = None,
    check_remote: bool = True,
    tag_prefix: str = DEFAULT_TAG_PREFIX,
) -> list[Listed]:
    root = repo_root(repo)
    found = pointers(root)
    tags = tagged(root, tag_prefix)
    missing = dvc.cloud_missing(root, found, remote) if check_remote and found else set()
    rows = []
    for pointer in found:
        _, size, out = dvc.read_pointer(pointer.read_text())
        snapshot = pointer.parent / out
        rel = str(snapshot.relative_to(root))
        names = tuple(t for t, rec in tags.items() if rec.get("path") == rel)
        record = next((tags[t] for t in names), {})
        info = read_info(snapshot) if snapshot.exists() else None
        rows.append(
            Listed(
                pointer=pointer,
                experiment=info.experiment.id if info else str(record.get("experiment", out)),
                tags=names,
                bytes=size,
                rows=info.rows if info else _int(record.get("rows")),
                tier=info.tier if info else str(record.get("tier", "?")),
                present=snapshot.exists(),
                in_remote=None if not check_remote else rel not in missing,
            )
        )
    return rows


def _int(value: object) -> int | None:
    return value if isinstance(value, int) else None
