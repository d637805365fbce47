"""Every command README.md and docs/ show is run, as shown, against a small demo vault.

Each page gets a fresh workspace (the current directory of its commands): a vault at
``./metricvault-data`` holding a simulated cluster (every series labelled ``simulated="true"``)
with runs ``r3``/``r4`` and ``llama-70b-r3``/``llama-70b-r4``, a git repository, the files the
commands name (``train.log``, ``samples.csv``, Debian's ``prometheus.yml``, a certificate).
What the test changes in a command is only where it must (each rewrite is in ``REWRITES``):
ports become free loopback ports (a server shown without ``--listen`` gets one, as pages
run in parallel), ``0.0.0.0`` becomes ``127.0.0.1`` (network tests stay on loopback), and
absolute example paths (``/mnt/archive/dvc``, ``/runs/...``) move into the workspace.
Servers (``serve``, ``agent``, ``maintain --loop``) are started, must become ready, and are
stopped with SIGTERM; ``serve`` keeps running for the rest of its page, so an agent shown
after it pushes into it. A ``prometheus.yml`` that a page edits must pass
``promtool check config``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .conftest import free_port, http_get, stop_process
from .docs_commands import EXEMPT, DocCommand, commands, doc_pages
from .influx_fixture import influxd  # noqa: F401  (started only for pages that need it)

VENV_BIN = Path(sys.executable).parent
COMMAND_TIMEOUT_S = 180.0
READY_TIMEOUT_S = 120.0
DEBIAN_PROMETHEUS_YML = Path("/etc/prometheus/prometheus.yml")
MINIMAL_PROMETHEUS_YML = """\
global:
  scrape_interval: 15s
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ["localhost:9090"]
"""


# --------------------------------------------------------------------------- the demo vault
@pytest.fixture(scope="session")
def demo_vault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated 2-node cluster over the last day with four runs (two registered)."""
    from metricvault import Vault
    from metricvault.durations import DAY_MS, now_ms
    from metricvault.sim import ClusterSpec, generate
    from metricvault.sim.spec import LLAMA_70B_FLOPS_PER_TOKEN, JobSpec

    day_s = 86_400
    jobs = tuple(
        JobSpec(name, (node,), int(a * day_s), int((b - a) * day_s), LLAMA_70B_FLOPS_PER_TOKEN, tps)
        for name, node, a, b, tps in (
            ("r3", 0, 0.05, 0.45, 1000.0),
            ("r4", 1, 0.05, 0.45, 1100.0),
            ("llama-70b-r3", 0, 0.50, 0.95, 1000.0),
            ("llama-70b-r4", 1, 0.50, 0.95, 1120.0),
        )
    )
    start = (now_ms() - DAY_MS) // 60_000 * 60_000
    spec = ClusterSpec(nodes=2, days=1.0, seed=3, start_ms=start, jobs=jobs)
    path = tmp_path_factory.mktemp("docs-vault") / "metricvault-data"
    with Vault.open_local(str(path)) as vault:
        for chunk in generate(spec):
            vault.write(chunk)
        vault.maintain()
        for job in jobs[1::2]:  # r4, llama-70b-r4: the pages create r3 / llama-70b-r3
            begin = start + job.start_offset_s * 1000
            host = f"node{job.nodes[0] + 1:02d}"
            vault.experiments.create(
                job.name,
                f'{{job="{job.name}"}} or {{Hostname="{host}"}}',
                start=begin,
                end=begin + job.duration_s * 1000,
                params={"lr": 3e-4, "batch": 512},
            )
    return path


# --------------------------------------------------------------------------- a page's run
@dataclass
class Workspace:
    root: Path
    env: dict[str, str]
    rewrites: list[tuple[str, str]]
    servers: list[tuple[DocCommand, subprocess.Popen[bytes], Path]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def rewrite(self, text: str) -> str:
        for pattern, replacement in self.rewrites:
            text = re.sub(pattern, replacement, text)
        return text


def _git(root: Path, env: dict[str, str], *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True, timeout=60)


def _workspace_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRICVAULT_")}
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
        GIT_AUTHOR_NAME="docs test",
        GIT_AUTHOR_EMAIL="docs@example.invalid",
        GIT_COMMITTER_NAME="docs test",
        GIT_COMMITTER_EMAIL="docs@example.invalid",
        COLUMNS="120",
        # DVC otherwise leaves an analytics report in the system temp directory per command
        # (its sender cannot reach the network here) and would phone home where it can.
        DVC_NO_ANALYTICS="1",
    )
    return env


@pytest.fixture(scope="session")
def workspace_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What every page's workspace starts with and costs a process start or a key to make,
    made once and copied into each: DVC set up (``dvc init``, and ``dvc remote add -d store
    dvc-remote``, which DVC writes relative to ``.dvc/``, so the copy's remote is the copy's own
    ``dvc-remote``) and a certificate for 127.0.0.1."""
    root = tmp_path_factory.mktemp("docs-workspace-template")
    env = _workspace_env()
    _git(root, env, "init", "-q", "-b", "main")
    dvc = str(VENV_BIN / "dvc")
    for args in (["init", "-q"], ["remote", "add", "-d", "store", "dvc-remote"]):
        subprocess.run([dvc, *args], cwd=root, env=env, check=True, capture_output=True)
    if shutil.which("openssl"):
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
             "-keyout", str(root / "key.pem"), "-out", str(root / "cert.pem")],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
    return root


def _make_workspace(
    root: Path, vault: Path, page_text: str, influx: str | None, template: Path
) -> Workspace:
    shutil.copytree(vault, root / "metricvault-data")
    env = _workspace_env()
    _git(root, env, "init", "-q", "-b", "main")
    (root / ".gitignore").write_text("metricvault-data/\n")
    (root / "README.txt").write_text("a paper's repository\n")
    _git(root, env, "add", ".gitignore", "README.txt")
    _git(root, env, "commit", "-q", "-m", "start")
    if "dvc init" not in page_text:  # the page assumes DVC is set up already
        shutil.copytree(template / ".dvc", root / ".dvc", ignore=shutil.ignore_patterns("tmp"))
        shutil.copy2(template / ".dvcignore", root / ".dvcignore")
        _git(root, env, "add", ".dvc", ".dvcignore")
        _git(root, env, "commit", "-q", "-m", "dvc")
    _write_inputs(root, template)
    gateway, agent = free_port(), free_port()
    rewrites = [
        (r"/mnt/archive/dvc", str(root / "dvc-archive")),
        (r"(?<![\w.])/runs/", f"{root}/runs/"),
        (r"\b0\.0\.0\.0:", "127.0.0.1:"),
        (r"http://gateway:", "http://127.0.0.1:"),
        (r":9201\b", f":{gateway}"),
        (r":9400\b", f":{agent}"),
        # a server shown without --listen would take its default port, which the pages run
        # in parallel share: each gets the workspace's own (the edge agent listens nowhere)
        (
            r"(?s)^metricvault agent\b(?!.*--listen)(?!.*--profile edge)",
            f"metricvault agent --listen 127.0.0.1:{agent}",
        ),
        (
            r"(?s)^metricvault serve\b(?!.*--listen)",
            f"metricvault serve --listen 127.0.0.1:{gateway}",
        ),
    ]
    if influx:
        rewrites.append((r"127\.0\.0\.1:8086\b", influx))
    return Workspace(root, env, rewrites)


def _write_inputs(root: Path, template: Path) -> None:
    for log in (root / "train.log", root / "runs" / "r3" / "train.log"):
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("step 1 loss 2.31\nRuntimeError: CUDA error: out of memory\n")
    (root / "samples.csv").write_text(
        "metric,timestamp,value,job\n"
        "imported_loss,2026-11-30T00:00:00Z,2.5,csv-run\n"
        "imported_loss,2026-11-30T00:00:05Z,2.4,csv-run\n"
    )
    yml = DEBIAN_PROMETHEUS_YML
    text = yml.read_text() if yml.exists() else MINIMAL_PROMETHEUS_YML
    (root / "prometheus.yml").write_text(text)
    (root / "agent.toml").write_text("# settings of the agent (empty: the defaults)\n")
    repo = Path(__file__).resolve().parents[2]
    for shipped in ("deploy", "docs/examples"):  # rule files and examples the pages name
        if (repo / shipped).is_dir():
            shutil.copytree(repo / shipped, root / shipped, dirs_exist_ok=True)
    (root / "metricvault.toml").write_text('retention_raw = "30d"\n')
    for pem in ("cert.pem", "key.pem"):
        if (template / pem).exists():
            shutil.copy2(template / pem, root / pem)


SERVER_COMMANDS = re.compile(r"^metricvault (serve|agent|maintain .*--loop)\b")


def _run(ws: Workspace, cmd: DocCommand) -> None:
    text = ws.rewrite(cmd.text)
    if SERVER_COMMANDS.search(text):
        _start_server(ws, cmd, text)
        return
    try:
        done = subprocess.run(
            ["bash", "-c", text], cwd=ws.root, env=ws.env, capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        ws.failures.append(f"{cmd.where}: `{text}` ran past {COMMAND_TIMEOUT_S:.0f} s")
        return
    output = (done.stdout + done.stderr).decode(errors="replace")
    if done.returncode != 0 or "Traceback (most recent call last)" in output:
        ws.failures.append(f"{cmd.where}: `{text}` exited {done.returncode}:\n{output[-3000:]}")


def _listen_url(text: str, default_port: int) -> str:
    match = re.search(r"--listen[ =](\S+)", text)
    address = match.group(1) if match else f"127.0.0.1:{default_port}"
    scheme = "https" if "--tls-cert" in text else "http"
    return f"{scheme}://{address}"


def _start_server(ws: Workspace, cmd: DocCommand, text: str) -> None:
    log_path = ws.root / f"server-{cmd.line}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {text}"], cwd=ws.root, env=ws.env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    ready = _wait_ready(proc, text)
    if not ready:
        stop_process(proc, timeout=10)
        ws.failures.append(
            f"{cmd.where}: `{text}` did not become ready within {READY_TIMEOUT_S:.0f} s "
            f"(exit status {proc.returncode}):\n{log_path.read_text(errors='replace')[-3000:]}"
        )
        return
    if text.startswith("metricvault serve"):
        ws.servers.append((cmd, proc, log_path))  # later commands on the page may use it
    else:
        _stop_server(ws, cmd, proc, log_path)


def _wait_ready(proc: subprocess.Popen[bytes], text: str) -> bool:
    if text.startswith("metricvault maintain") or "--profile edge" in text:
        # a loop, and the edge agent (it only pushes), have no endpoint: alive after start-up
        time.sleep(3.0)
        return proc.poll() is None
    if text.startswith("metricvault serve"):
        url = _listen_url(text, 9201) + "/-/ready"
    else:
        url = _listen_url(text, 9400) + "/metrics"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if url.startswith("https"):
                import ssl
                import urllib.request

                ctx = ssl.create_default_context()
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
                with urllib.request.urlopen(url, timeout=1, context=ctx) as resp:
                    if resp.status == 200:
                        return True
            elif http_get(url, timeout=1)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def _stop_server(
    ws: Workspace, cmd: DocCommand, proc: subprocess.Popen[bytes], log_path: Path
) -> None:
    status = stop_process(proc, timeout=30)
    output = log_path.read_text(errors="replace")
    if status not in (0, -signal.SIGTERM) or "Traceback (most recent call last)" in output:
        ws.failures.append(
            f"{cmd.where}: `{ws.rewrite(cmd.text)}` ended with status {status} after SIGTERM:\n"
            f"{output[-3000:]}"
        )


def _check_prometheus_yml(ws: Workspace) -> None:
    promtool = shutil.which("promtool")
    yml = ws.root / "prometheus.yml"
    if promtool is None:
        return
    done = subprocess.run(
        [promtool, "check", "config", "--syntax-only", str(yml)],
        capture_output=True, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        ws.failures.append(
            "prometheus.yml as the page's commands left it is refused by promtool:\n"
            f"{(done.stdout + done.stderr).decode(errors='replace')}\n---\n{yml.read_text()}"
        )


@pytest.fixture
def workspace_factory(
    tmp_path: Path, demo_vault: Path, request: pytest.FixtureRequest
) -> Iterator[list[Workspace]]:
    made: list[Workspace] = []
    yield made
    for ws in made:
        for cmd, proc, log_path in ws.servers:
            _stop_server(ws, cmd, proc, log_path)


# pages whose every command is exempt (benchmarks.md) have nothing to run here
PAGES = [p for p in doc_pages() if any(c.exemption() is None for c in commands(p))]
# `make test` runs the suite's files in parallel, a file per worker: the slowest pages run
# from test_docs_commands_slow_pages.py, so that no one worker runs every page
SLOW_PAGES = frozenset({"anomaly.md", "archive.md", "alerting.md", "iceberg.md"})
FAST = [p for p in PAGES if p.name not in SLOW_PAGES]


@pytest.mark.parametrize("page", FAST, ids=[p.name for p in FAST])
def test_every_documented_command_runs(
    page: Path,
    tmp_path: Path,
    demo_vault: Path,
    request: pytest.FixtureRequest,
    workspace_factory: list[Workspace],
) -> None:
    run_page(page, tmp_path, demo_vault, request, workspace_factory)


def run_page(
    page: Path,
    tmp_path: Path,
    demo_vault: Path,
    request: pytest.FixtureRequest,
    workspace_factory: list[Workspace],
) -> None:
    """Every command a page shows, run in a workspace holding a copy of the demo vault."""
    text = page.read_text()
    influx = None
    if "influxdb://127.0.0.1:8086" in text:
        server = request.getfixturevalue("influxd")
        influx = f"{server.host}:{server.port}"
    template = request.getfixturevalue("workspace_template")
    ws = _make_workspace(tmp_path / "ws", demo_vault, text, influx, template)
    workspace_factory.append(ws)
    for cmd in commands(page):
        if cmd.exemption() is None:
            _run(ws, cmd)
    for cmd, proc, log_path in ws.servers:
        _stop_server(ws, cmd, proc, log_path)
    ws.servers.clear()
    if "prometheus.yml" in text:
        _check_prometheus_yml(ws)
    assert not ws.failures, f"{len(ws.failures)} documented command(s) failed:\n\n" + "\n\n".join(
        ws.failures
    )


def test_every_exemption_is_still_used() -> None:
    """A stale exemption would silently excuse a new command; each must match a shown one."""
    shown = [c.text for p in doc_pages() for c in commands(p)]
    for pattern, reason in EXEMPT:
        assert any(re.search(pattern, text) for text in shown), (
            f"EXEMPT entry {pattern!r} ({reason}) matches no documented command: remove it"
        )


def test_commands_are_parsed_as_a_reader_sees_them() -> None:
    """Continuation lines join, comments go, quoted '#' stays (the parser the docs test uses)."""
    from .docs_commands import _block_commands

    body = (
        "metricvault agent --push http://gw:9201 \\\n"
        "    --pattern 'cuda=CUDA # error'   # push\n"
        "\n"
        "$ metricvault stats  # the stats\n"
    )
    found = _block_commands(Path("x.md"), body, 10)
    assert [(c.line, c.text) for c in found] == [
        (10, "metricvault agent --push http://gw:9201 --pattern 'cuda=CUDA # error'"),
        (13, "metricvault stats"),
    ]
    assert shlex.split(found[0].text)[-1] == "cuda=CUDA # error"
