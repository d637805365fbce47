"""``metricvault``: keep GPU-cluster and LLM training/inference metrics for years.

Every command works on a vault — a local directory (default ``./metricvault-data``) or
``s3://bucket/prefix`` — given with ``--data`` or ``METRICVAULT_DATA``. Settings come from
``--config FILE`` (TOML), ``METRICVAULT_*`` environment variables and flags; ``metricvault
config`` lists them all.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from metricvault.cli.agent import AGENT_CONTEXT, agent
from metricvault.cli.anomaly import anomaly_app
from metricvault.cli.archive import archive_app
from metricvault.cli.baseline import baseline_app
from metricvault.cli.common import (
    ConfigOpt,
    DataOpt,
    FormatOpt,
    OutOpt,
    SetOpt,
    console,
    emit,
    err,
    load_settings,
    open_vault,
    typer_annotation,
)
from metricvault.cli.cost import cost
from metricvault.cli.experiments import experiment_app
from metricvault.cli.iceberg import iceberg_app
from metricvault.cli.influx import influx_app
from metricvault.cli.kinds import kind_app
from metricvault.cli.light import COMMON_OPTS, HOT_OPTS, run_hot
from metricvault.cli.output import print_table
from metricvault.cli.rules import rules_app
from metricvault.cli.ui import ui
from metricvault.config import describe
from metricvault.durations import (
    parse_duration_ms,
    parse_time_ms,
)
from metricvault.errors import ApproximateAnswer, MetricVaultError, PromQLError, ResolutionError
from metricvault.redact import redact, setting_for_display
from metricvault.redact import remember as remember_secrets

app = typer.Typer(
    name="metricvault",
    help=__doc__,
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(experiment_app, name="experiment")
app.add_typer(archive_app, name="archive")
app.add_typer(influx_app, name="influx")
app.add_typer(rules_app, name="rules")
app.add_typer(baseline_app, name="baseline")
app.add_typer(kind_app, name="kind")
app.add_typer(anomaly_app, name="anomaly")
app.add_typer(iceberg_app, name="iceberg")


def _print_version(value: bool) -> None:
    if value:
        from metricvault import __version__

        print(f"metricvault {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    pass


def _hot_command(name: str, doc: str) -> None:
    """Register a hot command with typer from its one declaration (cli/light.py HOT_OPTS),
    so the manual and the fast path take the same options."""
    params = [
        inspect.Parameter(
            opt.dest, inspect.Parameter.KEYWORD_ONLY, annotation=typer_annotation(opt),
            default=inspect.Parameter.empty if opt.required else opt.default,
        )
        for opt in (*HOT_OPTS[name], *COMMON_OPTS)
    ]  # fmt: skip

    def command(**args: Any) -> None:
        run_hot(name, args)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = doc
    app.command(name)(command)


_hot_command(
    "query",
    """Read samples or per-step aggregates of the series a selector matches.

Without --step you get raw samples (`value` column); with it, one row per series and
bucket with one column per aggregate, served from the coarsest tier that fits.

Example: `metricvault query 'DCGM_FI_DEV_GPU_UTIL{Hostname="node01"}' -s -7d --step 1h
--agg mean,max`

When nothing matches it says why on stderr (no such series, with the nearest metric
names, or no samples in the range). `-o x.parquet` picks the format from the extension.
""",
)


@app.command()
def promql(
    expr: Annotated[str, typer.Argument(help="PromQL expression, e.g. 'rate(x_total[5m])'.")],
    start: Annotated[
        str, typer.Option("--start", "-s", help="Evaluation time (instant) or range start.")
    ] = "now",
    end: Annotated[
        str | None, typer.Option("--end", "-e", help="Range end: with --step, a range query.")
    ] = None,
    step: Annotated[str | None, typer.Option(help="Range query resolution (15s, 1m, 1h).")] = None,
    fmt: FormatOpt = None,
    output: OutOpt = None,
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Evaluate PromQL over the vault, as Prometheus would over the same samples.

    Without --end: an instant query at --start (default now). With --end and --step: a range
    query at start, start+step, ... <= end. Times: ISO, epoch ms, now or -2h. The answer is the
    long shape (timestamp, metric, labels, value); `-f csv|json|parquet` or `-o FILE`.

    Example: `metricvault promql 'avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)' --start=-1h
    --end now --step 5m`
    """
    from metricvault.cli.output import resolve_format, to_arrow

    kind = resolve_format(fmt, output)
    if (end is None) != (step is None):
        raise typer.BadParameter("a range query needs both --end and --step")
    from metricvault.cli.light import open_with

    settings = load_settings(data, config, set_)
    with open_with(settings) as vault:
        from metricvault.promql.frame import promql_frame

        with warnings.catch_warnings(record=True) as notes:
            warnings.simplefilter("always", ApproximateAnswer)
            # the vault's query limits hold here as on serve: a refusal is a clean error
            try:
                table = promql_frame(vault, expr, start, end, step, "arrow", settings=settings)
            except ResolutionError as exc:
                raise _resolution_in_cli_words(exc, step) from exc
        empty = table.num_rows == 0 and _promql_empty_note(vault, start, end)
    for note in notes:
        print(f"warning: {note.message}", file=sys.stderr)
    if empty:
        print(empty, file=sys.stderr)
        if kind == "table" and output is None:
            return  # say so instead of drawing an empty table
    emit(to_arrow(table), kind, output, title=expr)


def _resolution_in_cli_words(exc: ResolutionError, step: str | None) -> PromQLError:
    """The engine's refusal in the CLI's words (``--step``, not the HTTP API's ``?step=``)."""
    points = exc.range_ms // exc.step_ms
    return PromQLError(
        f"--step {step} gives {points:,} points per series over the range, more than the "
        f"limit of 11,000 (Prometheus's): give --step {exc.smallest_step_s}s or more, or a "
        "shorter range (--start/--end)",
        kind="bad_data",
    )


def _promql_empty_note(vault: Any, start: str, end: str | None) -> str:
    """Why a PromQL answer is empty, when the vault can tell: the time is past its data."""
    from metricvault.durations import ms_to_datetime, parse_time_ms

    last = vault.stats().get("tiers", {}).get("raw", {}).get("last")
    when = "the range" if end else f"{start} (instant queries look back 5m)"
    hint = ""
    if last is not None and parse_time_ms(end or start) > last:
        ends = f"{ms_to_datetime(last):%Y-%m-%d %H:%M:%S} UTC"
        hint = f"; the vault's raw data ends at {ends}: pass --start"
    return f"the query returns no series at {when}{hint}"


@app.command()
def sql(
    statement: Annotated[str, typer.Argument(help="DuckDB SQL.")],
    fmt: FormatOpt = None,
    output: OutOpt = None,
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run DuckDB SQL over the views `raw`, `rollup_1m`, `rollup_1h`, `series`, `experiments`.

    `raw(series_id, ts, timestamp, value)`; `rollup_*(series_id, ts, timestamp, count, sum, min,
    max, last, increase, mean)`; `series(series_id, metric, labels JSON, kind)`;
    `experiments(id, name, selector, start, end, start_ms, end_ms, git_repo, git_sha, owner,
    tags, notes, params, created_ms)`.

    Example: `metricvault sql "SELECT s.metric, count(*) FROM raw JOIN series s USING
    (series_id) GROUP BY 1"`
    """
    with open_vault(data, config, set_) as vault:
        emit(vault.sql(statement), fmt, output)


_hot_command("series", "List the series in the vault (id, metric, kind and labels).")
_hot_command(
    "stats", "Series count, samples and bytes per tier, bytes/sample, time coverage, rollup lag."
)


@app.command()
def maintain(
    loop: Annotated[bool, typer.Option(help="Keep running every maintain_interval.")] = False,
    now: Annotated[
        str | None, typer.Option(help="Pretend it is this time (for retention); default: now.")
    ] = None,
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Flush the ingest buffer, compact, roll up (1m, 1h), apply retention, expire snapshots.

    Idempotent and safe to kill at any moment: every step commits atomically, and a killed run
    is finished by the next one.
    """
    settings = load_settings(data, config, set_)
    from metricvault.cli.light import open_with
    from metricvault.progressbar import console_progress
    from metricvault.store.upkeep import MaintenanceLoop, stop_on_signals

    at = parse_time_ms(now) if now else None
    from metricvault.analysis.baselines import BaselineSpec

    # the `baselines` setting, refreshed every baseline_interval; a bad entry is refused
    # before anything runs
    specs = [BaselineSpec.parse(entry) for entry in settings.baselines]
    from metricvault.analysis.online_step import OnlineScoring

    # anomaly_score_selectors and anomaly_detector, likewise refused before anything runs
    scoring = OnlineScoring.from_settings(settings)
    with open_with(settings, need="maintain") as vault:

        def on_report(report: Any, seconds: float) -> None:
            console.print(_report_line(report, seconds))
            if specs:
                _maintain_baselines(vault, specs, settings.baseline_interval, at)
            if report.get("anomaly_scores") is not None:
                scored = report["anomaly_scores"]
                console.print(f"anomaly scores: {scored} new sample(s) scored ({scoring.detector})")

        maintainer = MaintenanceLoop(
            vault,
            parse_duration_ms(settings.maintain_interval) / 1000,
            on_report=on_report,
            steps=[scoring.as_step(vault, at)] if scoring.enabled else [],
        )
        if loop:  # one line a round; a gateway's maintainer may take some rounds
            stop = threading.Event()
            with stop_on_signals(stop):  # SIGTERM/SIGINT: its claims released, exit 0
                maintainer.run(stop, now_ms=at)
            return
        with console_progress() as progress:
            maintainer.round(at, progress, wait=True)


def _maintain_baselines(vault: Any, specs: Any, interval: str, at: int | None) -> None:
    from metricvault.analysis.baselines import maintain_baselines

    done = maintain_baselines(vault, specs, interval, at)
    console.print(
        f"baselines: {done['recomputed']} recomputed, {done['carried_forward']} samples carried"
        f" forward, {done['untrusted']} not stored (less history than min_history)"
    )


@app.command()
def check(
    repair: Annotated[
        bool, typer.Option(help="Do the plan: drop damaged files in one new catalog commit.")
    ] = False,
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Verify every file the catalog names (page checksums, row counts, time ranges).

    Prints each problem, what --repair would do and exactly what would be lost; without
    --repair nothing changes. Exits 1 when problems were found (also after repairing them).
    """
    from metricvault.store.check import check as check_vault
    from metricvault.store.layout import open_location

    settings = load_settings(data, config, set_)
    report = check_vault(open_location(settings.data, settings, create=False), repair)
    print("\n".join(report.lines(repair)))
    if not report.ok:
        raise typer.Exit(1)


def _report_line(report: dict[str, Any], seconds: float) -> str:
    return (
        f"flushed {report['flushed_samples']:,} samples, compacted "
        f"{report['compacted_partitions']} partition(s), rolled up {report['rolled_up_hours']} "
        f"hour(s), retention dropped {sum(report['retention'].values())} partition(s), expired "
        f"{report['expired']['snapshots']} snapshot(s) and {report['expired']['files']} file(s) "
        f"in {seconds:.1f}s; {report['rollup_pending_hours']} hour(s) still pending"
        + _iceberg_line(report.get("iceberg"))
    )


def _iceberg_line(published: dict[str, Any] | None) -> str:
    if published is None:  # iceberg_catalog is not set
        return ""
    added = sum(t["added_files"] for t in published.values())
    removed = sum(t["removed_files"] for t in published.values())
    return f"; Iceberg tables: {added} vault file(s) published, {removed} withdrawn"


@app.command("import")
def import_(
    path: Annotated[Path, typer.Argument(help="CSV or Parquet file in the long shape.")],
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Write a CSV/Parquet file in the long shape (`metric`, `timestamp`, `value`, labels...).

    `timestamp` is epoch milliseconds or an ISO time (both may be mixed in one file; an ISO
    time without a zone is UTC); every other column is a label. The file is streamed in
    batches (memory stays bounded whatever its size), with a progress bar on a terminal.
    """
    from metricvault.store.importer import import_file

    with open_vault(data, config, set_, create=True) as vault, _progress(path) as progress:
        count = import_file(vault, path, progress)
    console.print(f"wrote {count:,} samples from {path}")


@contextmanager
def _progress(path: Path) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar over the file's bytes, on stderr and only when it is a terminal."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    columns = (BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(f"importing {path.name}", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


@app.command()
def config(
    data: DataOpt = None,
    config_file: Annotated[Path | None, typer.Option("--config", "-c")] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print the table for docs/configuration.md.")
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Show every setting with its current value, default and meaning."""
    if markdown:
        print("| setting | default | meaning |\n|---|---|---|")
        for name, default, help_text in describe():
            print(f"| `{name}` | `{default}` | {help_text.replace('|', '/')} |")
        return
    settings = load_settings(data, config_file, set_)
    remember_secrets(settings)
    rows = [
        (name, setting_for_display(name, getattr(settings, name)), default, help_text)
        for name, default, help_text in describe()
    ]
    print_table(
        ("setting", "value", "default", "meaning"),
        rows,
        title="settings (TOML key = METRICVAULT_<KEY> environment variable)",
    )


@app.command()
def demo(
    data: DataOpt = None,
    nodes: Annotated[int, typer.Option(help="Simulated nodes (8 GPUs each).")] = 2,
    days: Annotated[float, typer.Option(help="Days of 5-second data to backfill.")] = 14,
    seed: Annotated[int, typer.Option(help="Simulator seed.")] = 0,
    report: Annotated[Path, typer.Option(help="HTML report to write.")] = Path("demo-report.html"),
    fresh: Annotated[bool, typer.Option(help="Delete the demo vault first.")] = True,
    end: Annotated[
        str,
        typer.Option(
            help="Where the data ends: now, ISO time or epoch ms (with --seed, the same data "
            "every run)."
        ),
    ] = "now",
) -> None:
    """Backfill a vault with a simulated GPU cluster, maintain it, and report.

    Simulates NODES x 8 GPUs for the DAYS up to --end (now) at 5 s running two training jobs
    (all series are labelled `simulated="true"`), runs maintenance, prints bytes/sample per
    tier and a side-by-side table of the jobs, and writes an HTML report with plots.
    """
    from metricvault.demo import run_demo
    from metricvault.durations import parse_time_ms

    end_ms = parse_time_ms(end)
    run_demo(data or "./metricvault-data", nodes, days, seed, report, fresh, console, end_ms)


@app.command()
def serve(
    data: DataOpt = None,
    listen: Annotated[
        str | None, typer.Option("--listen", "-l", help="HOST:PORT (default 127.0.0.1:9201).")
    ] = None,
    insecure_no_auth: Annotated[
        bool,
        typer.Option(
            "--insecure-no-auth",
            help="Listen on a non-loopback address without any credential configured "
            "(anyone who reaches the port can write).",
        ),
    ] = False,
    rules: Annotated[
        list[str] | None,
        typer.Option(
            "--rules",
            help="Prometheus rule file or glob to evaluate (repeatable; the rules_files "
            "setting). Invalid files stop serve with promtool's words.",
            show_default=False,
        ),
    ] = None,
    alertmanager: Annotated[
        list[str] | None,
        typer.Option(
            "--alertmanager",
            help="Alertmanager URL the rules' alerts are sent to (repeatable; the "
            "alertmanagers setting).",
            show_default=False,
        ),
    ] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run the gateway: writes into the vault, and the Prometheus API, remote_read and the
    experiment registry over it.

    Writes: `POST /api/v1/write` (Prometheus remote_write 1.0 and 2.0), `POST /write` and
    `POST /api/v2/write` (InfluxDB line protocol; `GET /ping` and `/query` DDL as no-ops),
    `POST /v1/metrics` (OpenTelemetry OTLP/HTTP). Reads: the Prometheus query API
    (`/api/v1/query`, `/api/v1/query_range`, `/api/v1/series`, `/api/v1/labels`,
    `/api/v1/label/<name>/values`, `/api/v1/metadata`, `/api/v1/query_exemplars`,
    `/api/v1/status/buildinfo`; any other `/api/v1/<rest>` answers Prometheus's JSON
    `not_found` error) and `POST /api/v1/read` (remote_read). Experiments:
    `/api/v1/experiments` and `/api/v1/experiments/<id>`. Rules (`--rules`): `GET
    /api/v1/rules`, `GET /api/v1/alerts`, `POST /-/reload` (and SIGHUP); their alerts go to
    every `--alertmanager`, converged on a root cause. Health: `GET /-/healthy`,
    `GET /-/ready`, `GET /metrics` (the gateway's own metrics). Web UI (docs/ui.md): `GET /`,
    `/ui/experiments`, `/ui/experiments/<experiment_id>`, `/ui/compare`, `/ui/explore`,
    `/ui/alerts`, `/ui/vault`, `/ui/static/<path>`, the login form `/ui/login` (`POST
    /ui/session`, `POST /ui/logout`), and its JSON `/api/v1/ui/experiments`,
    `/api/v1/experiments/<experiment_id>/history`, `/api/v1/experiments/<experiment_id>/gpus`,
    `/api/v1/experiments/<experiment_id>/archive`, `/api/v1/compare`, `/api/v1/vault/stats`,
    `/api/v1/ui/alerts`, `/api/v1/ui/anomalies`.
    A 204 means the samples are durable. SIGTERM drains requests and flushes. Point Prometheus
    at it with the fragment from `metricvault prometheus-config`. A non-loopback `--listen`
    needs auth_bearer_tokens or auth_basic_users (or `--insecure-no-auth`).
    """
    import uvicorn

    from metricvault.server.app import SETTINGS_ENV, create_app
    from metricvault.server.auth import check_listener
    from metricvault.server.connections import raise_open_file_limit, uvicorn_options
    from metricvault.server.ui_common import freeze_startup_heap

    settings = load_settings(data, config, set_)
    if listen:
        settings = settings.with_overrides(listen=listen)
    if rules:
        settings = settings.with_overrides(rules_files=tuple(rules))
    if alertmanager:
        settings = settings.with_overrides(alertmanagers=tuple(alertmanager))
    if settings.rules_files:
        from metricvault.rules.files import read_rule_files

        read_rule_files(settings.rules_files)  # refused before serving, as Prometheus does
    remember_secrets(settings)
    warning = check_listener(settings, insecure_no_auth)
    if warning:
        err.print(f"[bold yellow]warning[/]: {warning}")
    from metricvault.open import open as open_store

    raise_open_file_limit()  # stalled clients must hit gateway_max_connections first
    host, _, port = settings.listen.rpartition(":")
    options = uvicorn_options(settings)
    scheme = "https" if settings.tls_cert else "http"
    where = redact(settings.data)
    if settings.gateway_workers > 1:
        open_store(settings.data, settings, need="serve").close()  # fail fast on a bad vault
        os.environ[SETTINGS_ENV] = json.dumps(dataclasses.asdict(settings))
        err.print(
            f"metricvault gateway on {scheme}://{host}:{port}, "
            f"{settings.gateway_workers} workers, storing into {where}"
        )
        uvicorn.run(
            "metricvault.server.app:app_from_environment",
            factory=True,
            workers=settings.gateway_workers,
            loop="metricvault.server.accept_balance:BalancedEventLoop",
            **options,
        )
        return
    vault = open_store(settings.data, settings, need="serve")
    err.print(f"metricvault gateway on {scheme}://{host}:{port} storing into {redact(vault.uri)}")
    # uvicorn re-raises SIGTERM after its graceful shutdown (drain, then the app's lifespan
    # flush); exit through the finally below instead of dying with status 143
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        app = create_app(vault, settings)
        freeze_startup_heap()  # as `metricvault ui` does, before the gateway listens
        uvicorn.run(app, **options)
    finally:
        vault.close()


@app.command("prometheus-config")
def prometheus_config(
    gateway: Annotated[
        str, typer.Option(help="Gateway URL as Prometheus reaches it.")
    ] = "http://127.0.0.1:9201",
    agents: Annotated[
        list[str] | None,
        typer.Option(
            "--agent",
            help="HOST:PORT of a metricvault agent to scrape (repeatable).",
            show_default=False,
        ),
    ] = None,
    merge: Annotated[
        Path | None,
        typer.Option(
            "--merge",
            help="Edit this prometheus.yml in place: add what is missing, keep a backup, "
            "refuse a result that does not parse; running it twice changes nothing.",
            show_default=False,
        ),
    ] = None,
    remote_read: Annotated[
        bool,
        typer.Option(
            "--remote-read",
            help="Also add remote_read from the gateway: Prometheus's own queries (and its "
            "UI) then reach the history past its retention.",
        ),
    ] = False,
) -> None:
    """Point Prometheus at the gateway: print `remote_write` (with --agent, a scrape job; with
    --remote-read, `remote_read`), or merge them into an existing file with --merge.

    Example: `metricvault prometheus-config --merge /etc/prometheus/prometheus.yml --agent
    10.0.0.7:9400`, then `promtool check config` and reload Prometheus.
    """
    from metricvault import prometheus_config as pc

    if merge is None:
        print(pc.fragment(gateway, agents, remote_read), end="")
        return
    done = pc.merge(merge, gateway, agents, remote_read)
    if done.changed:
        err.print(f"{merge}: added {'; '.join(done.added)} (backup: {done.backup})")
    else:
        err.print(f"{merge} already has everything; unchanged")


@app.command("hash-secret")
def hash_secret_cmd(
    secret: Annotated[str, typer.Option(prompt=True, hide_input=True, help="Token or password.")],
) -> None:
    """Print the SHA-256 digest to put in auth_bearer_tokens / auth_basic_users (settings
    store only digests, never secrets)."""
    from metricvault.credentials import hash_secret

    print(hash_secret(secret))


app.command("cost")(cost)
app.command("ui")(ui)

# listed after serve (the collector side); its options are the agent's own (argparse)
app.command(context_settings=AGENT_CONTEXT, add_help_option=False)(agent)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except MetricVaultError as exc:
        err.print(f"[bold red]error[/] ({type(exc).__name__}): {redact(exc.message)}")
        sys.exit(2)
