"""``metricvault agent``'s command line, with the standard library's argparse.

The rest of the CLI uses typer and rich; the agent runs on every GPU host under a 60 MB budget,
and those two cost ~10 MB (`bench/agent.py` prints the import costs), so ``metricvault agent``
is dispatched here before they are imported (see ``metricvault.cli``). One parser, one help.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from metricvault.collect.agent import Agent
    from metricvault.collect.edge import EdgeAgent

DESCRIPTION = """\
Collect GPU (NVML, under dcgm-exporter's names), host and log metrics of this machine.

Serves /metrics (Prometheus text or OpenMetrics) for Prometheus to scrape, and with --push URL
also sends remote_write to a gateway, spooling to disk while it is unreachable. GPU utilisation
and power are sampled at --sample-hz and exported with their mean and max over the scrape
window. Push credentials: --push-bearer-token-file, --push-basic-auth-file or
http://user:password@gw:9201 (else $METRICVAULT_GATEWAY_TOKEN). Auth of /metrics itself: the
auth_* tables of --config.

--profile edge: for small boxes, host and GPU metrics only, collected every --sample-interval
(10 s) and pushed every 30 s; no /metrics, no fast sampler, no log watch (~23 MB RSS).

example: metricvault agent --simulate-gpus 8 --watch-log train.log --pattern 'cuda=CUDA error'
         metricvault agent --profile edge --push http://gw:9201
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="metricvault agent",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("--listen", "-l", default="127.0.0.1:9400", help="HOST:PORT for /metrics.")
    add(
        "--simulate-gpus",
        type=int,
        default=0,
        metavar="N",
        help='Simulate N GPUs (series labelled simulated="true").',
    )
    add(
        "--gpu",
        choices=("auto", "nvml", "none"),
        default="auto",
        help="GPU source: auto (NVML if present), nvml, none.",
    )
    add("--seed", type=int, default=0, help="Seed of the simulated GPUs.")
    add("--hostname", default=None, help="Host label value (default: this host's name).")
    add(
        "--hostname-label",
        default="Hostname",
        help="Host label name: Hostname (dcgm-exporter 3+) or hostname.",
    )
    add(
        "--instance",
        default="",
        metavar="HOST:PORT",
        help="With --push: the instance label of pushed series (default HOSTNAME:PORT of "
        "--listen, as Prometheus labels the scraped target HOSTNAME:PORT).",
    )
    add("--sample-hz", type=float, default=10.0, help="Internal GPU sampling rate.")
    add("--min-sample-hz", type=float, default=1.0, help="Lowest rate under host load.")
    add("--load-high", type=float, default=0.9, help="Back off above this 1-min load per CPU.")
    add("--load-low", type=float, default=0.6, help="Recover below this load per CPU.")
    add(
        "--push",
        default=None,
        metavar="URL",
        help="Gateway address (http://gw:9201) or remote_write URL: push mode.",
    )
    add(
        "--push-bearer-token-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="File holding the push bearer token (re-read on HTTP 401).",
    )
    add(
        "--push-basic-auth-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="File holding user:password for push basic auth (re-read on HTTP 401).",
    )
    add(
        "--push-interval",
        type=_seconds,
        default=None,
        metavar="DURATION",
        help="Time between pushes: 2s, 1m, or seconds (default 15s; 30s with --profile edge).",
    )
    add(
        "--profile",
        choices=("full", "edge"),
        default="full",
        help="full: everything above; edge: host and GPU metrics pushed every 30 s, nothing "
        "served, ~20 MB RSS (docs/agent.md).",
    )
    add(
        "--sample-interval",
        type=_seconds,
        default=None,
        metavar="DURATION",
        help="--profile edge: time between collections: 10s, 1m, or seconds (default 10s).",
    )
    add(
        "--spool-max-bytes",
        type=int,
        default=256 * 1024 * 1024,
        help="On-disk spool bound while the gateway is unreachable.",
    )
    add(
        "--clock-bound",
        type=_seconds,
        default=0.5,
        metavar="DURATION",
        help="Correct pushed timestamps when the clock offset surely exceeds this: 500ms, 2s, "
        "or seconds (default 0.5).",
    )
    add(
        "--state-dir",
        type=Path,
        default=Path(".metricvault-agent"),
        help="Spool and persisted counters.",
    )
    add(
        "--watch-log",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="Training log to tail (repeatable).",
    )
    add(
        "--pattern",
        action="append",
        default=[],
        metavar="NAME=REGEX",
        help="Regex counted in watched logs (repeatable).",
    )
    add("--no-host", action="store_true", help="Skip host metrics.")
    add(
        "--kubernetes",
        choices=("auto", "off"),
        default="auto",
        help="Label GPU series with namespace/pod/container on a Kubernetes node: auto, off.",
    )
    add(
        "--pod-resources-socket",
        type=Path,
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        metavar="PATH",
        help="The kubelet's pod-resources socket (used with --kubernetes auto when present).",
    )
    add("--tls-cert", default="", help="PEM certificate: serve HTTPS.")
    add("--tls-key", default="", help="PEM key for --tls-cert.")
    add("--config", "-c", type=Path, default=None, help="TOML settings file (auth tables).")
    add(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="Override a setting for this run (repeatable).",
    )
    return p  # fmt: skip


def _seconds(text: str) -> float:
    """argparse's type for duration flags: units like every duration setting, or seconds."""
    from metricvault.durations import parse_seconds
    from metricvault.errors import TimeRangeError

    try:
        return parse_seconds(text)
    except TimeRangeError as exc:
        raise argparse.ArgumentTypeError(exc.message) from exc


def main(argv: Sequence[str]) -> int:
    """Run the agent until SIGTERM/SIGINT; 2 on a bad command line or setting."""
    from metricvault.errors import MetricVaultError

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        agent = _make_agent(args, parser)
        agent.start()
    except MetricVaultError as exc:
        print(f"error ({type(exc).__name__}): {exc.message}", file=sys.stderr)
        return 2
    print(_started_line(agent), file=sys.stderr)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # a timed wait: Python runs a signal's handler in the main thread only when it next runs
    # bytecode, and a signal the kernel hands to another thread does not wake an untimed wait
    while not stop.wait(1.0):
        pass
    agent.stop()
    return 0


def _make_agent(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Agent | EdgeAgent:
    from metricvault.collect.agent import Agent, AgentOptions

    _check_profile(args, parser)

    if args.watch_log and not args.pattern:
        parser.error("--watch-log needs at least one --pattern NAME=REGEX")
    if args.pattern and not args.watch_log:
        parser.error("--pattern needs a --watch-log PATH to apply to")
    if (args.push_bearer_token_file or args.push_basic_auth_file) and not args.push:
        parser.error("--push-bearer-token-file / --push-basic-auth-file need --push URL")
    flags = {}
    for item in args.overrides:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--set {item!r}: write NAME=VALUE, e.g. --set tls_cert=cert.pem")
        flags[name.strip()] = value.strip()
    opts = AgentOptions(
        listen=args.listen,
        hostname_label=args.hostname_label,
        gpu=args.gpu,
        simulate_gpus=args.simulate_gpus,
        seed=args.seed,
        sample_hz=args.sample_hz,
        min_sample_hz=args.min_sample_hz,
        load_high=args.load_high,
        load_low=args.load_low,
        push_url=args.push or "",
        push_bearer_token_file=args.push_bearer_token_file,
        push_basic_auth_file=args.push_basic_auth_file,
        push_interval_s=_push_interval(args),
        sample_interval_s=_sample_interval(args),
        spool_max_bytes=args.spool_max_bytes,
        clock_bound_s=args.clock_bound,
        state_dir=args.state_dir,
        watch_logs=_watched(args.watch_log, args.pattern, parser),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        host_metrics=not args.no_host,
        kubernetes=args.kubernetes,
        pod_resources_socket=args.pod_resources_socket,
        instance=args.instance,
    )
    if args.hostname:
        opts.hostname = args.hostname
    if args.profile == "edge":
        from metricvault.collect.edge import EdgeAgent

        return EdgeAgent(opts)
    from metricvault.config import Settings

    settings = Settings.load(config_file=args.config, **flags)
    secured = settings if settings.auth_basic_users or settings.auth_bearer_tokens else None
    return Agent(opts, secured)


def _watched(
    paths: list[Path], patterns: list[str], parser: argparse.ArgumentParser
) -> list[tuple[Path, dict[str, str]]]:
    if not paths:
        return []  # logwatch imports prometheus-client: not for nothing (the edge agent)
    from metricvault.collect.logwatch import parse_patterns

    try:
        parsed = parse_patterns(patterns) if patterns else {}
    except ValueError as exc:
        parser.error(str(exc))
    return [(p, dict(parsed)) for p in paths]


# Options of the full profile that the edge profile has no use for (it serves nothing and
# samples no faster than --sample-interval): given with --profile edge, they are refused.
_FULL_ONLY = (
    ("listen", "--listen"),
    ("sample_hz", "--sample-hz"),
    ("min_sample_hz", "--min-sample-hz"),
    ("load_high", "--load-high"),
    ("load_low", "--load-low"),
    ("watch_log", "--watch-log"),
    ("pattern", "--pattern"),
    ("tls_cert", "--tls-cert"),
    ("tls_key", "--tls-key"),
    ("config", "--config"),
    ("overrides", "--set"),
)


def _check_profile(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.profile != "edge":
        if args.sample_interval is not None:
            parser.error("--sample-interval is for --profile edge (the full agent: --sample-hz)")
        return
    given = [flag for dest, flag in _FULL_ONLY if getattr(args, dest) != parser.get_default(dest)]
    if given:
        parser.error(
            f"--profile edge serves no /metrics, runs no fast sampler and watches no logs: "
            f"{', '.join(given)} do(es) not apply (docs/agent.md)"
        )
    if not args.push:
        parser.error("--profile edge only pushes: give --push URL (e.g. http://gw:9201)")


def _push_interval(args: argparse.Namespace) -> float:
    if args.push_interval is not None:
        return float(args.push_interval)
    if args.profile == "edge":
        from metricvault.collect.edge import PUSH_INTERVAL_S

        return PUSH_INTERVAL_S
    return 15.0


def _sample_interval(args: argparse.Namespace) -> float:
    from metricvault.collect.edge import SAMPLE_INTERVAL_S

    return SAMPLE_INTERVAL_S if args.sample_interval is None else float(args.sample_interval)


def _started_line(agent: Agent | EdgeAgent) -> str:
    server = getattr(agent, "server", None)
    if server is not None:
        return f"metricvault agent on {server.url} (GPU source: {agent.gpu_kind})"
    from metricvault.redact import redact_url

    return (
        f"metricvault agent --profile edge pushing to {redact_url(agent.opts.push_url)} every "
        f"{agent.opts.push_interval_s:g} s, collecting every {agent.opts.sample_interval_s:g} s "
        f"(GPU source: {agent.gpu_kind})"
    )
