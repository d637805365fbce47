"""The web UI in a real browser at 10,000 experiments, beside MLflow's UI on the same runs.

Builds two vaults through the public API (``vault.experiments.create`` and ``vault.write``,
what ``metricvault experiment create`` and ``metricvault.track()`` store): one with
``--small`` (1,000) experiments and one with ``--experiments`` (10,000). The newest
``--curve-runs`` (300) of each have training curves (``train_step``, ``train_loss``,
``learning_rate``, ``grad_norm``, ``tokens_per_second``, ``mfu`` at ``--steps`` steps, labels
``experiment``, ``host`` and ``simulated="true"``, as ``run.log`` writes them); the large vault
also holds the simulator's 2 nodes x 8 GPUs x ``--gpu-days`` (30) days at 1-minute scrapes
(labelled ``simulated="true"``) with its two jobs registered as experiments (they count toward
the 10,000). Then ``metricvault ui`` serves each vault on loopback and Debian's chromium,
headless through chromedriver (Selenium; nothing downloads a browser), opens:

- the experiments table at 1,000 and 10,000 (first contentful paint, navigation timing, and
  when the first rows were painted);
- an experiment page (a tracked run's curves; a simulated job's per-GPU charts);
- Explore: ``DCGM_FI_DEV_GPU_UTIL`` (16 GPUs) over 30 days, from the click on Run to the chart
  drawn (uPlot's draw hook sets the ``mv-chart-drawn`` performance mark);
- Compare of 100 runs (page load to drawn, and a re-run click to drawn);
- on the 10,000 table: a search (server-side filter), page down, a jump to the middle of the
  virtualised table (rows not fetched yet) and a sort, each from the
  click to the new rows.

Every figure is read in the page with the Performance API (``paint``, ``navigation``,
``resource`` entries and marks; a script added before each document records when the first
rows appear). The ``server`` column is the API requests' time as the browser's resource timing
saw them (request start to response end): the rest of ``total`` is the browser's.

MLflow beside it: if ``mlflow`` is not in ``--mlflow-venv`` (a bench-only venv, never the
project's), it is installed there from PyPI (``python3 -m venv`` + ``pip install mlflow``);
if that fails its column is skipped with the reason printed. The same 1,000 and 10,000 runs
(names, owners, params, tags, final metrics) are logged into a SQLite store, ``mlflow server``
serves it on loopback, and the same browser times its runs table.

    .venv/bin/python bench/ui.py --quick        # 1,000 and 2,000 experiments, 7 GPU-days
    .venv/bin/python bench/ui.py                # 1,000 and 10,000, 30 days (the contract)
    .venv/bin/python bench/ui.py --no-mlflow --workdir /tmp/ui-bench --keep   # reuse vaults
    .venv/bin/python bench/ui.py --workdir /tmp/ui-bench --fresh-only --runs 5  # cold views only

Targets (PASS/MISS, by every run, the cold one included; each run's figure is listed under the
table): first paint of every page <= 300 ms; the 30-day 16-GPU chart <= 500 ms from click to
drawn; 100 runs overlaid <= 1 s. The load average is printed: on the shared
2-core machines compare ratios, not absolute times.
"""

# ruff: noqa: E402  (the path set-up below must precede the project imports)
from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (REPO_ROOT, REPO_ROOT / "src"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import argparse
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

HOUR_MS = 3_600_000
MINUTE_MS = 60_000
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
OWNERS = tuple(f"user{i:02d}" for i in range(25))
TEAMS = ("pretrain", "alignment", "infra", "vision", "speech", "search", "ads", "research")
MODELS = ("llama-7b", "llama-13b", "llama-70b", "mistral-7b")
CURVE_METRICS = ("train_loss", "learning_rate", "grad_norm", "tokens_per_second", "mfu")
READY_TIMEOUT_S = 120.0
PAGE_TIMEOUT_S = 120.0
FIRST_PAINT_MS, CHART_MS, COMPARE_MS = 300.0, 500.0, 1000.0


# --------------------------------------------------------------------------- the data
@dataclass(frozen=True)
class Record:
    """One experiment as both systems get it: the metricvault record, an MLflow run."""

    id: str
    start_ms: int
    end_ms: int
    owner: str
    team: str
    tags: tuple[str, ...]
    params: dict[str, Any]
    git_sha: str
    curves: bool  # has training curves (train_step + CURVE_METRICS) in the vault
    final: dict[str, float] = field(default_factory=dict)  # final metrics (MLflow's columns)


def records(n: int, curve_runs: int, steps: int, end_ms: int, seed: int = 0) -> list[Record]:
    """``n`` experiments one hour apart, the newest ``curve_runs`` of them with curves of
    ``steps`` steps one minute apart, all ended before ``end_ms``. Deterministic."""
    rng = np.random.default_rng(seed)
    out = []
    last = end_ms - steps * MINUTE_MS - HOUR_MS  # the newest run ends an hour before end_ms
    for i in range(n):
        start = last - (n - 1 - i) * HOUR_MS
        curves = i >= n - curve_runs
        duration = steps * MINUTE_MS if curves else int(rng.integers(1, 48)) * HOUR_MS // 2
        lr = float(rng.choice([1e-4, 3e-4, 6e-4, 1e-3]))
        team = TEAMS[i % len(TEAMS)]
        params = {
            "lr": lr,
            "batch_size": int(rng.choice([256, 512, 1024])),
            "seed": i % 5,
            "team": team,
            "model": MODELS[i % len(MODELS)],
            "warmup_steps": int(rng.choice([100, 500, 2000])),
        }
        out.append(
            Record(
                id=f"exp-{i:05d}",
                start_ms=start,
                end_ms=start + duration,
                owner=OWNERS[(i * 7) % len(OWNERS)],
                team=team,
                tags=(f"sweep-{i // 50:03d}", MODELS[i % len(MODELS)], "bench"),
                params=params,
                git_sha=hashlib.sha1(f"commit-{i // 20}".encode()).hexdigest(),
                curves=curves,
                final={
                    "final_loss": round(2.0 + 1.5 * float(rng.random()), 4),
                    "mfu_mean": round(0.3 + 0.2 * float(rng.random()), 4),
                },
            )
        )
    return out


def curve_frame(rec: Record, steps: int) -> pd.DataFrame:
    """The long-shape samples ``run.log(step, loss=, lr=, grad_norm=, tokens=)`` would store,
    one step a minute from the run's start (simulated: labelled so)."""
    step = np.arange(steps, dtype=np.float64)
    ts = rec.start_ms + np.arange(steps, dtype=np.int64) * MINUTE_MS
    rng = np.random.default_rng(int(rec.id.split("-")[1]))
    final = rec.final["final_loss"]
    values = {
        "train_step": step,
        "train_loss": final + 8.0 * np.exp(-step / (steps / 6)) + 0.05 * rng.standard_normal(steps),
        "learning_rate": rec.params["lr"] * np.minimum(1.0, (step + 1) / 50),
        "grad_norm": 1.0 + 0.3 * np.abs(rng.standard_normal(steps)),
        "tokens_per_second": 1.0e5 * (1 + 0.02 * rng.standard_normal(steps)),
        "mfu": rec.final["mfu_mean"] * (1 + 0.02 * rng.standard_normal(steps)),
    }
    parts = [
        pd.DataFrame(
            {
                "timestamp": ts,
                "metric": name,
                "experiment": rec.id,
                "host": "bench-host",
                "simulated": "true",
                "value": v,
            }
        )
        for name, v in values.items()
    ]
    return pd.concat(parts, ignore_index=True)


@dataclass
class Built:
    path: Path
    ids: list[str]  # every experiment id, oldest first
    curve_ids: list[str]
    job_ids: list[str]  # the simulator's jobs (per-GPU charts)


def build_vault(
    path: Path,
    n: int,
    *,
    curve_runs: int,
    steps: int,
    end_ms: int,
    gpu_days: float = 0.0,
    progress: bool = False,
) -> Built:
    """A vault with ``n`` experiments (the simulator's jobs among them when ``gpu_days``),
    written through the public API. Its ``ids`` are what ``vault.experiments`` lists."""
    from metricvault.demo import register_jobs
    from metricvault.sim import ClusterSpec, generate
    from metricvault.store.vault import Vault

    job_ids: list[str] = []
    with Vault.open_local(str(path)) as vault:
        if gpu_days:
            spec = ClusterSpec.ending_at(
                end_ms, gpu_days, nodes=2, gpus_per_node=8, interval_s=60, seed=0
            )
            for chunk in generate(spec, chunk_hours=24.0):
                vault.write(chunk)
            job_ids = register_jobs(vault, spec)
            say(progress, f"  simulated 16 GPUs x {gpu_days:g} d at 60 s, jobs {job_ids}")
        recs = records(n - len(job_ids), curve_runs, steps, end_ms)

        def create(rec: Record) -> None:
            vault.experiments.create(
                rec.id,
                f'{{experiment="{rec.id}"}}',
                start=rec.start_ms,
                end=rec.end_ms,
                owner=rec.owner,
                tags=rec.tags,
                params=rec.params,
                git_sha=rec.git_sha,
                notes="bench/ui.py: a synthetic record (simulated curves where it has any)",
            )

        # each record is one small file made durable (fsync): threads overlap the waits
        with ThreadPoolExecutor(8) as pool:
            for k, _ in enumerate(pool.map(create, recs)):
                if (k + 1) % 2000 == 0:
                    say(progress, f"  {k + 1:,} experiments")
        with_curves = [r for r in recs if r.curves]
        for at in range(0, len(with_curves), 50):
            part = with_curves[at : at + 50]
            vault.write(pd.concat([curve_frame(r, steps) for r in part], ignore_index=True))
        vault.maintain(now_ms=end_ms)
        ids = [e.id for e in vault.experiments.list()]
    return Built(path, ids, [r.id for r in recs if r.curves], job_ids)


def say(enabled: bool, text: str) -> None:
    if enabled:
        print(text, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- servers
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ok(url: str, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{what} did not answer {url} in {READY_TIMEOUT_S:.0f} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def start_ui(vault: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "metricvault.cli", "ui", "--data", str(vault)]
    cmd += ["--listen", f"127.0.0.1:{port}"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_ok(f"{url}/-/healthy", proc, log, "metricvault ui")
    return proc, url


# --------------------------------------------------------------------------- MLflow
MLFLOW_LOG = r"""
import json, sys, time
import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
uri, plan = sys.argv[1], json.load(sys.stdin)
client = MlflowClient(tracking_uri=uri)
out = {}
for name, runs in plan.items():
    eid = client.create_experiment(name)
    out[name] = eid
    for r in runs:
        tags = {"mlflow.user": r["owner"], "mlflow.source.git.commit": r["git_sha"],
                **{t: "1" for t in r["tags"]}}
        run = client.create_run(eid, start_time=r["start_ms"], tags=tags, run_name=r["id"])
        rid = run.info.run_id
        client.log_batch(rid,
            metrics=[Metric(k, v, r["end_ms"], 0) for k, v in r["final"].items()],
            params=[Param(k, str(v)) for k, v in r["params"].items()])
        client.set_terminated(rid, "FINISHED", end_time=r["end_ms"])
print(json.dumps(out))
"""


def mlflow_python(venv: Path, progress: bool) -> tuple[Path | None, str]:
    """The bench-only venv's python with mlflow importable, installing it if absent; or None
    and why not."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import mlflow; print(mlflow.__version__)"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python, subprocess.run(probe, capture_output=True, text=True).stdout.strip()
    say(progress, f"installing mlflow into {venv} (bench-only venv) ...")
    made = subprocess.run(["python3", "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode:
        return None, f"python3 -m venv failed: {made.stderr.strip()[-300:]}"
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "mlflow"], capture_output=True, text=True
    )
    if pip.returncode:
        return None, f"pip install mlflow failed: {pip.stderr.strip()[-500:]}"
    got = subprocess.run(probe, capture_output=True, text=True)
    if got.returncode:
        return None, f"mlflow installed but does not import: {got.stderr.strip()[-300:]}"
    return python, got.stdout.strip()


def mlflow_store(python: Path, db: Path, plans: dict[str, list[Record]]) -> dict[str, str]:
    """Log the runs (one MLflow experiment per plan) into a SQLite store at ``db``; {name:
    id}. Through MLflow's own client (``create_run``, ``log_batch``, ``set_terminated``),
    into a file in memory (``/dev/shm`` where there is one: each call commits, and fsyncs
    would make 11,000 runs take half an hour), then moved to ``db``."""
    payload = {
        name: [
            {
                "id": r.id,
                "owner": r.owner,
                "git_sha": r.git_sha,
                "tags": list(r.tags),
                "start_ms": r.start_ms,
                "end_ms": r.end_ms,
                "params": r.params,
                "final": r.final,
            }
            for r in recs
        ]
        for name, recs in plans.items()
    }
    shm = Path("/dev/shm")
    scratch = Path(tempfile.mkdtemp(dir=shm if shm.is_dir() else db.parent)) / db.name
    done = subprocess.run(
        [str(python), "-c", MLFLOW_LOG, f"sqlite:///{scratch}"],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"logging the MLflow runs failed:\n{done.stderr[-3000:]}")
    ids: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    shutil.move(str(scratch), db)
    shutil.rmtree(scratch.parent, ignore_errors=True)
    return ids


def start_mlflow(python: Path, db: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    mlflow = python.parent / "mlflow"
    cmd = [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{db}"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    cmd += ["--default-artifact-root", str(db.parent / "mlartifacts")]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    wait_ok(f"{url}/health", proc, log, "mlflow server")
    return proc, url


# --------------------------------------------------------------------------- the browser
# Added before every document: when the first rows of either runs table appear (and the
# frame after, when they were painted), and when the UI says it is ready (window.mvReady).
OBSERVER = r"""
window.__bench = {};
(() => {
  const watch = { rows: "#experiments tbody tr[data-id], a[href*='/runs/']" };
  const seen = () => {
    for (const [name, sel] of Object.entries(watch)) {
      if (window.__bench[name] === undefined && document.querySelector(sel)) {
        window.__bench[name] = performance.now();
        requestAnimationFrame(() => { window.__bench[name + "_painted"] = performance.now(); });
      }
    }
  };
  new MutationObserver(seen).observe(document, { childList: true, subtree: true });
  let ready = false;
  Object.defineProperty(window, "mvReady", {
    configurable: true,
    get() { return ready; },
    set(v) {
      ready = v;
      if (v && window.__bench.ready === undefined) {
        window.__bench.ready = performance.now();
        requestAnimationFrame(() => { window.__bench.ready_painted = performance.now(); });
      }
    },
  });
})();
"""

TIMINGS = r"""
const nav = performance.getEntriesByType("navigation")[0] || {};
const paint = {};
for (const p of performance.getEntriesByType("paint")) paint[p.name] = p.startTime;
const since = arguments[0] || 0;
const api = performance.getEntriesByType("resource")
  .filter((r) => r.name.includes("/api/") || r.name.includes("/ajax-api/"))
  .filter((r) => r.startTime >= since)
  .map((r) => ({ name: r.name, start: r.startTime, end: r.responseEnd,
                 ttfb: r.responseStart - r.requestStart }));
const marks = performance.getEntriesByName("mv-chart-drawn")
  .filter((m) => m.startTime >= since).map((m) => ({ key: m.detail, at: m.startTime }));
return { fcp: paint["first-contentful-paint"], fp: paint["first-paint"],
         ttfb: nav.responseStart, dcl: nav.domContentLoadedEventEnd, load: nav.loadEventEnd,
         bench: window.__bench, api, marks };
"""


class Browser:
    def __init__(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1280,900",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
        ):
            options.add_argument(flag)
        self.driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        self.driver.set_page_load_timeout(PAGE_TIMEOUT_S)
        self.driver.set_script_timeout(PAGE_TIMEOUT_S)
        self.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": OBSERVER})

    def close(self) -> None:
        self.driver.quit()

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def wait(self, condition: str, what: str) -> None:
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while not self.js(f"return !!({condition})"):
            if time.monotonic() > deadline:
                raise SystemExit(f"{what}: never saw {condition} at {self.driver.current_url}")
            time.sleep(0.02)

    def open(self, url: str, condition: str, what: str) -> dict[str, Any]:
        # from a blank page: a new document each time (MLflow's routes are #fragments, and
        # going from one fragment to another would not load a page)
        self.driver.get("about:blank")
        self.driver.get(url)
        self.wait(condition, what)
        timings: dict[str, Any] = self.js(TIMINGS, 0)
        error = self.js(
            "const e = document.getElementById('error'); return e && !e.hidden ? e.textContent : ''"
        )
        if error:
            raise SystemExit(f"{what}: the page shows an error: {error}")
        return timings

    def click(self, setup: str, button: str, what: str) -> dict[str, Any]:
        """Run ``setup``, then click ``button`` and wait until the UI is ready again; the
        timings from the click (``click``: its time on the page's clock)."""
        at = self.js(
            setup + ";window.__bench.ready = undefined; window.__bench.ready_painted = undefined;"
            "window.mvReady = false; const t = performance.now();"
            f"document.querySelector({json.dumps(button)}).click(); return t;"
        )
        self.wait("window.__bench.ready_painted !== undefined", what)
        timings: dict[str, Any] = self.js(TIMINGS, at)
        timings["click"] = at
        return timings


# --------------------------------------------------------------------------- measurements
@dataclass
class Row:
    system: str
    view: str
    runs: list[dict[str, float | None]]
    target: str = ""
    limit: float | None = None
    key: str = "total"  # which figure the target applies to
    note: str = ""


def server_ms(t: dict[str, Any]) -> float | None:
    """The API requests' time, first start to last end (they may overlap)."""
    api = t.get("api") or []
    if not api:
        return None
    return float(max(a["end"] for a in api) - min(a["start"] for a in api))


def page_figures(t: dict[str, Any], done_key: str = "ready_painted") -> dict[str, float | None]:
    bench = t.get("bench") or {}
    done = bench.get(done_key)
    return {
        "fcp": t.get("fcp"),
        "ttfb": t.get("ttfb"),
        "load": t.get("load"),
        "total": float(done) if done is not None else None,
        "server": server_ms(t),
    }


def chart_figures(t: dict[str, Any], key: str, since: float = 0.0) -> dict[str, float | None]:
    drawn = [m["at"] for m in t.get("marks") or [] if m["key"] == key]
    figures = page_figures(t)
    figures["total"] = (max(drawn) - since) if drawn else None
    return figures


def measure_mv(
    browser: Browser,
    url: str,
    size: str,
    built: Built,
    runs: int,
    full: bool,
) -> list[Row]:
    rows = [
        Row(
            "metricvault",
            f"experiments table, {size} (virtualised, 100-row pages)",
            [
                page_figures(
                    browser.open(f"{url}/ui/experiments", "window.__bench.ready_painted", "table")
                )
                for _ in range(runs)
            ],
            target="first paint <= 300 ms",
            limit=FIRST_PAINT_MS,
            key="fcp",
        )
    ]
    if not full:
        return rows
    ready = "window.__bench.ready_painted"
    search = built.curve_ids[len(built.curve_ids) // 2]
    for label, setup, button in (
        (
            "search (server-side filter)",
            f"document.getElementById('q').value = {json.dumps(search)}",
            "#filters button[type=submit]",
        ),
        ("page down", "", "#next"),
        (
            "scrolled to row 5,000 (a page not fetched yet), then page down",
            "const b = document.getElementById('table-scroll');b.scrollTop = b.scrollHeight / 2",
            "#next",
        ),
        ("sort by owner", "", "button.sort[data-sort=owner]"),
    ):
        got = []
        for _ in range(runs):
            browser.open(f"{url}/ui/experiments", ready, "table")
            t = browser.click(setup, button, label)
            fig = page_figures(t)
            fig["total"] = t["bench"]["ready_painted"] - t["click"]
            fig["fcp"] = None
            got.append(fig)
        rows.append(Row("metricvault", f"table {size}: {label}, click to rows", got))
    run_id = built.curve_ids[-1]
    got = [
        chart_figures(browser.open(f"{url}/ui/experiments/{run_id}", ready, "experiment"), "mfu")
        for _ in range(runs)
    ]
    rows.append(
        Row(
            "metricvault",
            "experiment page: 5 training curves",
            got,
            target="first paint <= 300 ms",
            limit=FIRST_PAINT_MS,
            key="fcp",
        )
    )
    if built.job_ids:
        got = [
            chart_figures(
                browser.open(f"{url}/ui/experiments/{built.job_ids[0]}", ready, "job"),
                "DCGM_FI_DEV_GPU_TEMP",
            )
            for _ in range(runs)
        ]
        rows.append(
            Row(
                "metricvault",
                "experiment page: a simulated job, 8 GPUs x 4 charts",
                got,
                target="first paint <= 300 ms",
                limit=FIRST_PAINT_MS,
                key="fcp",
            )
        )
        got = []
        for _ in range(runs):
            browser.open(f"{url}/ui/explore", ready, "explore")
            setup = (
                "document.getElementById('expr').value = 'DCGM_FI_DEV_GPU_UTIL';"
                "document.getElementById('range').value = '30d'"
            )
            t = browser.click(setup, "#explore-form button[type=submit]", "explore")
            got.append(chart_figures(t, "explore", t["click"]))
            got[-1]["fcp"] = None
            got[-1]["server"] = server_ms(t)
        step = browser.js("return window.mvCharts.exploreQuery.step")
        lines = browser.js("return window.mvCharts.explore.lines.length")
        rows.append(
            Row(
                "metricvault",
                "Explore: 30 d of 16 GPUs, click to drawn",
                got,
                target="<= 500 ms",
                limit=CHART_MS,
                note=f"{lines} lines, step {step} s (the UI's step for 30 d)",
            )
        )
    ids = ",".join(built.curve_ids[-100:])
    got = [
        chart_figures(browser.open(f"{url}/ui/compare?ids={ids}", ready, "compare"), "compare")
        for _ in range(runs)
    ]
    rows.append(
        Row(
            "metricvault",
            "Compare: 100 runs, page load to drawn",
            got,
            target="<= 1 s",
            limit=COMPARE_MS,
        )
    )
    got = []
    for _ in range(runs):
        browser.open(f"{url}/ui/compare?ids={ids}", ready, "compare")
        t = browser.click("", "#compare-form button[type=submit]", "compare again")
        fig = chart_figures(t, "compare", t["click"])
        fig["fcp"] = None
        got.append(fig)
    lines = browser.js("return window.mvCharts.compare.lines.length")
    rows.append(
        Row(
            "metricvault",
            "Compare: 100 runs, click to drawn",
            got,
            target="<= 1 s",
            limit=COMPARE_MS,
            note=f"{lines} lines",
        )
    )
    return rows


def measure_fresh(browser: Browser, vault: Path, work: Path, built: Built, runs: int) -> list[Row]:
    """Cold as a user meets it: each run on a server started for it (nothing cached in it,
    the page its first request) and with the browser's cache emptied."""
    ready = "window.__bench.ready_painted"
    explore = (
        "document.getElementById('expr').value = 'DCGM_FI_DEV_GPU_UTIL';"
        "document.getElementById('range').value = '30d'"
    )
    views: list[tuple[str, str, str, str | None, float, str]] = [
        ("experiments table, 10,000", "/ui/experiments", "table", None, FIRST_PAINT_MS, "fcp"),
        ("Explore: 30 d of 16 GPUs, click to drawn", "/ui/explore", "explore", "explore",
         CHART_MS, "total"),
        ("Compare: 100 runs, page load to drawn",
         "/ui/compare?ids=" + ",".join(built.curve_ids[-100:]), "compare", "compare",
         COMPARE_MS, "total"),
    ]  # fmt: skip
    if built.job_ids:
        views.insert(1, (
            "experiment page: a simulated job, 8 GPUs x 4 charts",
            f"/ui/experiments/{built.job_ids[0]}", "job", "DCGM_FI_DEV_GPU_TEMP",
            FIRST_PAINT_MS, "fcp",
        ))  # fmt: skip
    rows = []
    for label, path, what, chart, limit, key in views:
        got = []
        for _ in range(runs):
            proc, url = start_ui(vault, work / "ui-fresh.log")
            try:
                browser.driver.execute_cdp_cmd("Network.clearBrowserCache", {})
                t = browser.open(url + path, ready, what)
                if what == "explore":
                    t = browser.click(explore, "#explore-form button[type=submit]", what)
                    fig = chart_figures(t, "explore", t["click"])
                    fig["fcp"], fig["server"] = None, server_ms(t)
                else:
                    fig = chart_figures(t, chart) if chart else page_figures(t)
                got.append(fig)
            finally:
                stop(proc)
        target = "<= 500 ms" if limit == CHART_MS else ("<= 1 s" if limit == COMPARE_MS else "")
        rows.append(
            Row(
                "metricvault",
                f"fresh server each run: {label}",
                got,
                target=target or "first paint <= 300 ms",
                limit=limit,
                key=key,
            )
        )
    return rows


def measure_mlflow(browser: Browser, url: str, ids: dict[str, str], runs: int) -> list[Row]:
    out = []
    for name, eid in ids.items():
        got = []
        for _ in range(runs):
            t = browser.open(
                f"{url}/#/experiments/{eid}/runs?workflowType=machine_learning",
                "window.__bench.rows_painted",
                "mlflow",
            )
            fig = page_figures(t, "rows_painted")
            got.append(fig)
        out.append(
            Row(
                "MLflow",
                f"runs table, {name}",
                got,
                target="first paint <= 300 ms",
                limit=FIRST_PAINT_MS,
                key="fcp",
            )
        )
    return out


# --------------------------------------------------------------------------- report
def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def summary(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    """(first, median of the rest) of a view's runs."""
    first = values[0] if values else None
    rest = [v for v in values[1:] if v is not None]
    return first, (statistics.median(rest) if rest else None)


def report(rows: list[Row], load: tuple[float, float]) -> str:
    head = (
        "| system | view | first paint ms (1st / median) | rows or chart ms (1st / median) | "
        "server ms (median) | target | |\n|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        fcp = summary([x.get("fcp") for x in r.runs])
        total = summary([x.get("total") for x in r.runs])
        server = summary([x.get("server") for x in r.runs])[1]
        verdict = ""
        if r.limit is not None:  # every run, the cold one included
            worst = max((v for x in r.runs if (v := x.get(r.key)) is not None), default=None)
            verdict = "-" if worst is None else ("PASS" if worst <= r.limit else "MISS")
        view = r.view + (f" ({r.note})" if r.note else "")
        lines.append(
            f"| {r.system} | {view} | {fmt(fcp[0])} / {fmt(fcp[1])} | {fmt(total[0])} / "
            f"{fmt(total[1])} | {fmt(server)} | {r.target} | {verdict} |"
        )
    return (
        f"load average {load[0]:.1f} at start, {load[1]:.1f} at the end, "
        f"on {os.cpu_count()} cores\n\n" + head + "\n".join(lines) + every_run(rows)
    )


def every_run(rows: list[Row]) -> str:
    """Each targeted view's figure in every run, in order (a target is met only if all are)."""
    lines = [
        f"- {r.system}, {r.view}: {', '.join(fmt(x.get(r.key)) for x in r.runs)}"
        for r in rows
        if r.limit is not None
    ]
    paints = [v for r in rows if r.system == "metricvault" for x in r.runs if (v := x.get("fcp"))]
    if paints:  # the first-paint target is for every page, whatever its row's own target
        over = sum(v > FIRST_PAINT_MS for v in paints)
        lines.append(
            f"- metricvault, first paint of every page load: {len(paints)} loads, at most "
            f"{fmt(max(paints))}, {over} over {fmt(FIRST_PAINT_MS)}"
        )
    return "\n\nEvery run, ms (the figure the target applies to):\n" + "\n".join(lines)


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=10_000)
    parser.add_argument("--small", type=int, default=1_000, help="the smaller table")
    parser.add_argument("--curve-runs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=500, help="steps per run with curves")
    parser.add_argument("--gpu-days", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=3, help="page loads per view (1st is cold)")
    parser.add_argument("--quick", action="store_true", help="2,000 experiments, 7 GPU-days")
    parser.add_argument("--no-mlflow", action="store_true")
    parser.add_argument(
        "--mlflow-venv",
        type=Path,
        default=Path(tempfile.gettempdir()) / "metricvault-bench-mlflow-venv",
        help="a bench-only venv for MLflow (created and filled from PyPI if absent)",
    )
    parser.add_argument("--workdir", type=Path, help="build here (kept, reused if built)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    parser.add_argument(
        "--fresh-only",
        action="store_true",
        help="only the views on a fresh server each run (the large vault; no MLflow)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.experiments, args.gpu_days = 2_000, 7.0
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        print(
            "needs Debian's chromium and chromium-driver "
            "(apt-get install -y chromium chromium-driver)"
        )
        return 2
    load_start = os.getloadavg()[0]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="metricvault-bench-ui-"))
    work.mkdir(parents=True, exist_ok=True)
    small, large, end_ms = build_both(work, args)
    procs: list[subprocess.Popen[bytes]] = []
    rows: list[Row] = []
    notes: list[str] = []
    browser = Browser()
    try:
        for b, size, full in (
            (small, f"{args.small:,}", False),
            (large, f"{args.experiments:,}", True),
        ):
            if not args.fresh_only:
                proc, url = start_ui(b.path, work / f"ui-{size}.log")
                procs.append(proc)
                say(True, f"measuring metricvault at {size} experiments ({url})")
                rows += measure_mv(browser, url, size, b, args.runs, full)
                stop(proc)
            if full:
                say(True, f"measuring metricvault at {size} experiments, a fresh server a run")
                rows += measure_fresh(browser, b.path, work, b, args.runs)
        if args.no_mlflow or args.fresh_only:
            notes.append("MLflow: skipped (--no-mlflow or --fresh-only)")
        else:
            python, version = mlflow_python(args.mlflow_venv, True)
            if python is None:
                notes.append(f"MLflow: skipped, {version}")
            else:
                db = work / "mlflow.db"
                ids_file = work / "mlflow-ids.json"
                if not ids_file.exists():
                    say(
                        True,
                        f"logging {args.small:,} + {args.experiments:,} runs into MLflow {version}",
                    )
                    started = time.monotonic()
                    plans = {
                        f"{args.small:,} runs": records(
                            args.small, args.curve_runs, args.steps, end_ms
                        ),
                        f"{args.experiments:,} runs": records(
                            args.experiments, args.curve_runs, args.steps, end_ms
                        ),
                    }
                    ids_file.write_text(json.dumps(mlflow_store(python, db, plans)))
                    say(True, f"  logged in {time.monotonic() - started:.0f} s")
                proc, url = start_mlflow(python, db, work / "mlflow.log")
                procs.append(proc)
                say(True, f"measuring MLflow {version} ({url})")
                rows += measure_mlflow(browser, url, json.loads(ids_file.read_text()), args.runs)
                notes.append(f"MLflow {version}, SQLite store, `mlflow server --workers 1`")
    finally:
        browser.close()
        for proc in procs:
            stop(proc)
        if not (args.keep or args.workdir):
            shutil.rmtree(work, ignore_errors=True)
    text = report(rows, (load_start, os.getloadavg()[0]))
    text += "".join(f"\n\n{n}" for n in notes)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


def build_both(work: Path, args: argparse.Namespace) -> tuple[Built, Built, int]:
    """Both vaults (reused from ``work`` when built there before) and where their data ends."""
    out = []
    stamp = work / "end_ms"
    if not stamp.exists():
        stamp.write_text(str(int(time.time() * 1000) // HOUR_MS * HOUR_MS))
    end_ms = int(stamp.read_text())
    for n, gpu_days, name in (
        (args.small, 0.0, "small"),
        (args.experiments, args.gpu_days, "large"),
    ):
        path = work / f"vault-{name}-{n}"
        meta = work / f"vault-{name}-{n}.json"
        if meta.exists():
            saved = json.loads(meta.read_text())
            out.append(Built(path, saved["ids"], saved["curve_ids"], saved["job_ids"]))
            say(True, f"reusing {path}")
            continue
        shutil.rmtree(path, ignore_errors=True)
        started = time.monotonic()
        say(True, f"building {path.name}: {n:,} experiments")
        built = build_vault(
            path,
            n,
            curve_runs=args.curve_runs,
            steps=args.steps,
            end_ms=end_ms,
            gpu_days=gpu_days,
            progress=True,
        )
        say(True, f"  built in {time.monotonic() - started:.0f} s")
        meta.write_text(
            json.dumps({"ids": built.ids, "curve_ids": built.curve_ids, "job_ids": built.job_ids})
        )
        out.append(built)
    return out[0], out[1], end_ms


if __name__ == "__main__":
    sys.exit(main())
