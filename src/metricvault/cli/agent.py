"""``metricvault agent``: the collector on every GPU host."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from metricvault.cli.common import ConfigOpt, SetOpt, err, load_settings


def agent(
    listen: Annotated[str, typer.Option("--listen", "-l", help="HOST:PORT for /metrics.")] = (
        "127.0.0.1:9400"
    ),
    simulate_gpus: Annotated[
        int, typer.Option(help='Simulate N GPUs (series labelled simulated="true").')
    ] = 0,
    gpu: Annotated[str, typer.Option(help="GPU source: auto (NVML if present), nvml, none.")] = (
        "auto"
    ),
    seed: Annotated[int, typer.Option(help="Seed of the simulated GPUs.")] = 0,
    hostname: Annotated[str | None, typer.Option(help="Host label value (default: hostname).")] = (
        None
    ),
    hostname_label: Annotated[
        str, typer.Option(help="Host label name: Hostname (dcgm-exporter 3+) or hostname.")
    ] = "Hostname",
    sample_hz: Annotated[float, typer.Option(help="Internal GPU sampling rate.")] = 10.0,
    min_sample_hz: Annotated[float, typer.Option(help="Lowest rate under host load.")] = 1.0,
    load_high: Annotated[float, typer.Option(help="Back off above this 1-min load per CPU.")] = 0.9,
    load_low: Annotated[float, typer.Option(help="Recover below this load per CPU.")] = 0.6,
    push: Annotated[
        str | None, typer.Option("--push", help="Gateway remote_write URL (push mode).")
    ] = None,
    push_interval: Annotated[float, typer.Option(help="Seconds between pushes.")] = 15.0,
    spool_max_bytes: Annotated[
        int, typer.Option(help="On-disk spool bound while the gateway is unreachable.")
    ] = 256 * 1024 * 1024,
    clock_bound: Annotated[
        float, typer.Option(help="Correct timestamps when the clock offset exceeds this (s).")
    ] = 0.5,
    state_dir: Annotated[Path, typer.Option(help="Spool and persisted counters.")] = Path(
        ".metricvault-agent"
    ),
    watch_log: Annotated[
        list[Path] | None, typer.Option("--watch-log", help="Training log to tail (repeatable).")
    ] = None,
    pattern: Annotated[
        list[str] | None,
        typer.Option("--pattern", help="NAME=REGEX counted in watched logs (repeatable)."),
    ] = None,
    no_host: Annotated[bool, typer.Option("--no-host", help="Skip host metrics.")] = False,
    tls_cert: Annotated[str, typer.Option(help="PEM certificate: serve HTTPS.")] = "",
    tls_key: Annotated[str, typer.Option(help="PEM key for --tls-cert.")] = "",
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Collect GPU (NVML, under dcgm-exporter's names), host and log metrics of this machine.

    Serves `/metrics` (Prometheus text or OpenMetrics) for Prometheus to scrape, and with
    `--push URL` also sends remote_write to a gateway, spooling to disk while it is unreachable.
    GPU utilisation and power are sampled at `--sample-hz` and exported with their mean and max
    over the scrape window. Basic auth / bearer tokens: the `auth_*` tables of `--config`.

    Example: `metricvault agent --simulate-gpus 8 --watch-log train.log --pattern
    'cuda=CUDA error' --pattern 'oom=out of memory'`
    """
    from metricvault.collect.agent import Agent, AgentOptions

    settings = load_settings(None, config, set_)
    logs = _watched(watch_log or [], pattern or [])
    opts = AgentOptions(
        listen=listen,
        hostname_label=hostname_label,
        gpu=gpu,
        simulate_gpus=simulate_gpus,
        seed=seed,
        sample_hz=sample_hz,
        min_sample_hz=min_sample_hz,
        load_high=load_high,
        load_low=load_low,
        push_url=push or "",
        push_interval_s=push_interval,
        spool_max_bytes=spool_max_bytes,
        clock_bound_s=clock_bound,
        state_dir=state_dir,
        watch_logs=logs,
        tls_cert=tls_cert,
        tls_key=tls_key,
        host_metrics=not no_host,
    )
    if hostname:
        opts.hostname = hostname
    secured = settings if settings.auth_basic_users or settings.auth_bearer_tokens else None
    running = Agent(opts, secured)
    running.start()
    assert running.server is not None
    err.print(f"metricvault agent on {running.server.url} (GPU source: {running.gpu_kind})")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    running.stop()


def _watched(paths: list[Path], patterns: list[str]) -> list[tuple[Path, dict[str, str]]]:
    if paths and not patterns:
        raise typer.BadParameter("--watch-log needs at least one --pattern NAME=REGEX")
    if patterns and not paths:
        raise typer.BadParameter("--pattern needs a --watch-log PATH to apply to")
    from metricvault.collect.logwatch import parse_patterns

    parsed = parse_patterns(patterns) if patterns else {}
    return [(p, dict(parsed)) for p in paths]
