"""Issue 14: the edge profile's sources, defaults, refusals, light families and imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import core as prom
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from metricvault.collect import cli, families
from metricvault.collect.agent import AgentOptions
from metricvault.collect.edge import EdgeAgent, edge_sources
from metricvault.collect.sources._labels import METRICS
from metricvault.collect.sources.host import HostSource
from metricvault.collect.sources.simulated import SimulatedGpuSource
from metricvault.collect.sources.simulated_light import LightSimulatedGpuSource, light_gpu_uuid
from metricvault.errors import ConfigError
from metricvault.sim.uuids import gpu_uuid

SRC = Path(__file__).resolve().parents[2] / "src"


def options(tmp_path: Path, **kw: object) -> AgentOptions:
    return AgentOptions(push_url="http://127.0.0.1:9", state_dir=tmp_path / "state", **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- source selection
def test_edge_sources_are_the_light_simulator_and_the_host(tmp_path: Path) -> None:
    sources, kind = edge_sources(options(tmp_path, simulate_gpus=2))
    assert [type(s) for s in sources] == [LightSimulatedGpuSource, HostSource]
    assert kind == "simulated"


def test_edge_sources_without_host_or_gpu(tmp_path: Path) -> None:
    sources, kind = edge_sources(options(tmp_path, simulate_gpus=1, host_metrics=False))
    assert [type(s) for s in sources] == [LightSimulatedGpuSource]
    sources, kind = edge_sources(options(tmp_path, gpu="none"))
    assert [type(s) for s in sources] == [HostSource] and kind == "none"


def test_edge_sources_refuse_a_log_watch(tmp_path: Path) -> None:
    opts = options(tmp_path, watch_logs=[(tmp_path / "train.log", {"oom": "OOM"})])
    with pytest.raises(ConfigError, match="watches no training logs"):
        edge_sources(opts)


# ---------------------------------------------------------------- command line
def make(argv: list[str]) -> object:
    parser = cli.build_parser()
    return cli._make_agent(parser.parse_args(argv), parser)


def test_the_edge_profile_pushes_every_30_s_and_collects_every_10_s(tmp_path: Path) -> None:
    state = ["--state-dir", str(tmp_path / "s"), "--gpu", "none"]
    agent = make(["--profile", "edge", "--push", "http://127.0.0.1:9", *state])
    assert isinstance(agent, EdgeAgent)
    assert agent.opts.push_interval_s == 30.0 and agent.opts.sample_interval_s == 10.0
    assert agent.push_url == "http://127.0.0.1:9/api/v1/write"
    agent = make(["--profile", "edge", "--push", "http://gw:9201", "--push-interval", "5", *state])
    assert isinstance(agent, EdgeAgent) and agent.opts.push_interval_s == 5.0


@pytest.mark.parametrize(
    ("flag", "given", "dest", "seconds"),
    [
        ("--push-interval", "2s", "push_interval", 2.0),
        ("--push-interval", "1m", "push_interval", 60.0),
        ("--push-interval", "2", "push_interval", 2.0),
        ("--sample-interval", "500ms", "sample_interval", 0.5),
        ("--sample-interval", "10", "sample_interval", 10.0),
        ("--clock-bound", "250ms", "clock_bound", 0.25),
        ("--clock-bound", "0.5", "clock_bound", 0.5),
    ],
)
def test_duration_flags_take_units_or_plain_seconds(
    flag: str, given: str, dest: str, seconds: float
) -> None:
    args = cli.build_parser().parse_args([flag, given])
    assert getattr(args, dest) == seconds


def test_a_duration_flag_without_a_usable_unit_is_refused_with_the_forms_that_work(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["--push-interval", "2x"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--push-interval" in err and "'2s'" in err, err


def test_an_edge_agent_pushes_at_a_push_interval_given_with_a_unit(tmp_path: Path) -> None:
    state = ["--state-dir", str(tmp_path / "s"), "--gpu", "none"]
    agent = make(["--profile", "edge", "--push", "http://gw:9201", "--push-interval", "2s", *state])
    assert isinstance(agent, EdgeAgent) and agent.opts.push_interval_s == 2.0


def test_the_full_profile_keeps_15_s(tmp_path: Path) -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["--push", "http://gw:9201"])
    assert cli._push_interval(args) == 15.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--profile", "edge"], "only pushes: give --push URL"),
        (["--profile", "edge", "--push", "http://gw:9", "--listen", ":1"], "--listen"),
        (["--profile", "edge", "--push", "http://gw:9", "--sample-hz", "2"], "--sample-hz"),
        (["--profile", "edge", "--push", "http://gw:9", "--set", "a=b"], "--set"),
        (["--sample-interval", "5"], "is for --profile edge"),
    ],
)
def test_options_that_do_not_apply_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        make(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_too_short_interval_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--sample-interval 0"):
        EdgeAgent(options(tmp_path, sample_interval_s=0.0, gpu="none"))


# ---------------------------------------------------------------- collection
def test_a_collection_labels_every_sample_as_a_scrape_of_the_host_would(tmp_path: Path) -> None:
    sim = LightSimulatedGpuSource(gpus=2, hostname="edge01", clock=lambda: 1_000.0)
    agent = EdgeAgent(options(tmp_path, hostname="edge01"), sources=[sim])
    assert agent.collect_once() > 0
    samples = agent._pending
    assert {(s[1]["job"], s[1]["instance"]) for s in samples} == {
        ("metricvault-agent", "edge01:9400")
    }
    gpu = [s[1] for s in samples if s[0] == "DCGM_FI_DEV_GPU_UTIL"]
    assert gpu and all(labels["Hostname"] == "edge01" for labels in gpu)
    assert not any(k.startswith("exported_") for s in samples for k in s[1])
    names = {s[0] for s in samples}
    assert {"DCGM_FI_DEV_GPU_UTIL", "metricvault_agent_info", "process_cpu_seconds_total"} <= names
    info = [s for s in samples if s[0] == "metricvault_agent_info"]
    assert info[0][1]["profile"] == "edge"


def test_the_light_simulator_uses_the_gpu_sources_names_and_labels() -> None:
    now = [5_000.0]
    sim = LightSimulatedGpuSource(gpus=3, hostname="h", seed=1, clock=lambda: now[0])
    first = {f.name: f for f in sim.collect()}
    assert set(first) <= set(METRICS)
    assert all(s.labels["simulated"] == "true" for f in first.values() for s in f.samples)
    util = [s.value for s in first["DCGM_FI_DEV_GPU_UTIL"].samples]
    assert len(util) == 3 and all(0 <= u <= 100 for u in util)
    energy0 = [s.value for s in first["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].samples]
    now[0] += 60
    energy1 = [s.value for f in sim.collect() if f.name.endswith("ENERGY_CONSUMPTION")
               for s in f.samples]  # fmt: skip
    assert all(b > a for a, b in zip(energy0, energy1, strict=True))
    with pytest.raises(ConfigError):
        LightSimulatedGpuSource(gpus=0)


@pytest.mark.parametrize(("seed", "gpus"), [(0, 1), (0, 8), (7, 10)])
def test_both_simulators_label_one_hosts_gpus_alike(seed: int, gpus: int) -> None:
    """The edge agent's light simulator and the full agent's label a host's GPUs the same
    (UUID, PCI bus, model), so a host's series do not change with the profile."""
    light = LightSimulatedGpuSource(gpus=gpus, hostname="h7", seed=seed, clock=lambda: 5e3)
    full = SimulatedGpuSource(gpus=gpus, hostname="h7", seed=seed, clock=lambda: 5e3)

    def labels(source: object) -> set[frozenset[tuple[str, str]]]:
        families = source.collect()  # type: ignore[attr-defined]
        util = next(f for f in families if f.name == "DCGM_FI_DEV_GPU_UTIL")
        return {frozenset(s.labels.items()) for s in util.samples}

    assert labels(light) == labels(full)
    assert light_gpu_uuid(seed, 3, 1) == gpu_uuid(seed, 3, 1)


def test_the_node_dashboards_metrics_come_from_the_edge_profile_or_it_says_why_not() -> None:
    """Every DCGM metric the node dashboard plots is exported by the edge agent's simulated
    GPUs, or its panel says which sources have it."""
    import json
    import re

    sim = LightSimulatedGpuSource(gpus=2, hostname="h", clock=lambda: 5e3)
    exported = {f.name for f in sim.collect()}
    for name in ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"):
        family = next(f for f in sim.collect() if f.name == name)
        assert all(0.0 <= s.value <= 1.0 for s in family.samples), name
    board = json.loads((SRC.parent / "deploy/grafana/dashboards/gpu-node.json").read_text())
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            for metric in re.findall(r"DCGM_FI_[A-Z_]+", target.get("expr", "")):
                if metric not in exported:
                    assert metric in panel.get("description", ""), (panel["title"], metric)


# ---------------------------------------------------------------- light families
class Families:
    def __init__(self, module: object) -> None:
        self.module = module

    def collect(self) -> list[object]:
        m = self.module
        gauge = m.GaugeMetricFamily("g_bytes", "a gauge", labels=["a"])  # type: ignore[attr-defined]
        gauge.add_metric(["x"], 1.5)
        counter = m.CounterMetricFamily("c_total", "a counter", labels=["b"])  # type: ignore[attr-defined]
        counter.add_metric(["y"], 3)
        info = m.InfoMetricFamily("i", "info", labels=["k"])  # type: ignore[attr-defined]
        info.add_metric(["v"], {"version": "1"})
        plain = m.GaugeMetricFamily("plain", "no labels", value=2)  # type: ignore[attr-defined]
        return [gauge, counter, info, plain]


@pytest.mark.parametrize("render", [generate_latest, generate_openmetrics])
def test_light_families_render_like_prometheus_clients_own(render: object) -> None:
    outputs = []
    for module in (families, prom):
        registry = CollectorRegistry(auto_describe=False)
        registry.register(Families(module))  # type: ignore[arg-type]
        outputs.append(render(registry))  # type: ignore[operator]
    assert outputs[0] == outputs[1]


def test_the_edge_modules_import_no_prometheus_client_protobuf_or_numpy() -> None:
    """In a fresh interpreter: what `--profile edge` imports to collect and push."""
    code = (
        "import sys\n"
        "from metricvault.collect.edge import import_http_client\n"
        "import_http_client(False)\n"
        "import metricvault.collect.cli, metricvault.collect.edge, metricvault.collect.push\n"
        "import metricvault.collect.sources.host, metricvault.collect.sources.simulated_light\n"
        "import metricvault.collect.sources.nvml\n"
        "heavy = ('prometheus_client', 'google.protobuf', 'numpy', 'pandas', 'pyarrow', 'duckdb',"
        " 'ssl', 'typer', 'rich')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(SRC)},
        timeout=60,
    )
    assert out.stdout.strip() == "[]"


def test_the_edge_profile_takes_the_push_credentials_of_the_full_agent(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    state = ["--state-dir", str(tmp_path / "s"), "--gpu", "none"]
    agent = make(["--profile", "edge", "--push", "http://gw:9201",
                  "--push-bearer-token-file", str(token), *state])  # fmt: skip
    assert isinstance(agent, EdgeAgent) and agent.push_auth is not None
    assert agent.push_auth.kind == "bearer"
    with pytest.raises(ConfigError):
        make(["--profile", "edge", "--push", "http://gw:9201",
              "--push-bearer-token-file", str(tmp_path / "missing"), *state])  # fmt: skip
