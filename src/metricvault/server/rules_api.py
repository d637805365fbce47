"""Alerting and recording rules inside ``serve``: the evaluator (a background task) and
Prometheus's ``GET /api/v1/rules``, ``GET /api/v1/alerts`` and ``POST /-/reload``.

Exactly one evaluator per vault: every worker runs the task, and only the holder of the
evaluator lease (:mod:`metricvault.rules.lease`: a lock in the state directory, plus a lease
object by conditional write on an ``s3://`` vault) loads the rule files and evaluates. It
writes what the APIs answer to ``rules-status.json`` in the state directory after every round,
so whichever worker a request reaches answers the same. A reload (``POST /-/reload``, SIGHUP)
is checked by the worker that receives it, which answers with the files' problems if they are
invalid (the evaluator keeps its rules), and otherwise signals the evaluator through
``rules.reload`` in the state directory.

Rules read the whole vault (or, with ``rules_tenant``, that tenant's series, its label set on
everything they write) through the PromQL engine, and write recorded series and ``ALERTS``
through the store's write path: durable, like any remote-write sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from metricvault.credentials import Principal
from metricvault.durations import parse_duration_ms
from metricvault.errors import MetricVaultError, RuleFileError
from metricvault.fsutil import write_atomically
from metricvault.promql import EngineOptions
from metricvault.promql.source import TenantSource
from metricvault.protocols import SampleSource
from metricvault.rules.files import read_rule_files
from metricvault.rules.group import OutgoingAlert, RuleGroup, SampleWriter
from metricvault.rules.lease import EvaluatorLease
from metricvault.rules.manager import ManagerOptions, RuleManager, status_json
from metricvault.selector import Matcher
from metricvault.server.api import BackgroundTask, ServerAPI
from metricvault.server.reads import readable
from metricvault.store.vault import Vault

if TYPE_CHECKING:
    from metricvault.server.app import Gateway

log = logging.getLogger("metricvault.rules")

STATUS_FILE = "rules-status.json"
RELOAD_FILE = "rules.reload"
POLL_S = 0.5

AlertHook = Callable[[RuleGroup, list[OutgoingAlert]], None]
# Where alerts go: factories called once per evaluator with its gateway; each returns a hook
# that receives every round's alerts to send (the Alertmanager client registers here), or None.
ALERT_SINKS: list[Callable[[Gateway], AlertHook | None]] = []


class RulesAPI(ServerAPI):
    name = "rules"
    summary = (
        "`GET /api/v1/rules`, `GET /api/v1/alerts` and `POST /-/reload`; evaluates the "
        "rules_files (`serve --rules`) in one worker, by lease"
    )

    def routes(self, gateway: Gateway) -> list[Route]:
        api = RulesRoutes(gateway)
        return [
            Route("/api/v1/rules", api.rules, methods=["GET"]),  # as Prometheus: GET only
            Route("/api/v1/alerts", api.alerts, methods=["GET"]),
            Route("/-/reload", api.reload, methods=["POST", "PUT"]),
        ]

    def background_tasks(self, gateway: Gateway) -> list[BackgroundTask]:
        return [lambda: evaluator_task(gateway)]


API = RulesAPI()


def _state_dir(gateway: Gateway) -> Path:
    return Path(gateway.vault.state_dir)


class RulesRoutes:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def status(self) -> dict[str, Any]:
        path = _state_dir(self.gateway) / STATUS_FILE
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {"groups": [], "alerts": []}
        return data

    async def rules(self, request: Request) -> Response:
        async def work(request: Request, who: Principal) -> Response:
            kind = request.query_params.get("type", "")
            if kind not in ("", "alert", "record"):
                return _error(f'invalid query parameter type="{kind}", must be alert or record')
            data = await run_in_threadpool(self.status)
            groups = data.get("groups", [])
            if kind:
                wanted = "alerting" if kind == "alert" else "recording"
                groups = [
                    {**g, "rules": [r for r in g["rules"] if r["type"] == wanted]} for g in groups
                ]
                groups = [g for g in groups if g["rules"]]
            return JSONResponse({"status": "success", "data": {"groups": groups}})

        return await self.gateway.handle(request, "rules", work)

    async def alerts(self, request: Request) -> Response:
        async def work(request: Request, who: Principal) -> Response:
            data = await run_in_threadpool(self.status)
            return JSONResponse({"status": "success", "data": {"alerts": data.get("alerts", [])}})

        return await self.gateway.handle(request, "alerts", work)

    async def reload(self, request: Request) -> Response:
        async def work(request: Request, who: Principal) -> Response:
            await self.gateway.body(request)  # unused, but bounded as every body is (413)
            problem = await run_in_threadpool(request_reload, self.gateway)
            if problem:
                return PlainTextResponse(f"failed to reload config: {problem}\n", 500)
            return PlainTextResponse("")

        return await self.gateway.handle(request, "reload", work)


def _error(message: str) -> Response:
    return JSONResponse(
        {"status": "error", "errorType": "bad_data", "error": message}, status_code=400
    )


def request_reload(gateway: Gateway) -> str:
    """Check the rule files; if Prometheus would load them, signal the evaluator (whichever
    worker it is) to reload. The problems, or "" when signalled."""
    try:
        read_rule_files(gateway.settings.rules_files)
    except RuleFileError as exc:
        return exc.message
    path = _state_dir(gateway) / RELOAD_FILE
    write_atomically(str(path), f"{time.time_ns()}\n".encode())
    return ""


def manager_options(gateway: Gateway) -> ManagerOptions:
    s = gateway.settings
    return ManagerOptions(
        default_interval_ms=parse_duration_ms(s.rules_evaluation_interval),
        outage_tolerance_ms=parse_duration_ms(s.rules_for_outage_tolerance),
        grace_period_ms=parse_duration_ms(s.rules_for_grace_period),
        resend_delay_ms=parse_duration_ms(s.rules_resend_delay),
        external_url=s.rules_external_url.rstrip("/"),
        engine=EngineOptions.from_settings(s),
        max_concurrent_groups=s.rules_max_concurrent_groups,
    )


def rules_source(gateway: Gateway) -> SampleSource:
    """What the rules read: the vault, or with ``rules_tenant`` that tenant's series."""
    source: SampleSource = readable(gateway)
    tenant = gateway.settings.rules_tenant
    if not tenant:
        return source
    return TenantSource(source, (Matcher(gateway.settings.tenant_label, "=", tenant),))


def rules_writer(gateway: Gateway) -> SampleWriter:
    """The store's write path for what rules produce (the tenant's label set, as the write
    API sets it on a tenant's samples)."""
    tenant = gateway.settings.rules_tenant
    label = gateway.settings.tenant_label

    def write(samples: list[tuple[str, dict[str, str], int, float]]) -> None:
        if tenant:
            samples = [(m, {**lab, label: tenant}, t, v) for m, lab, t, v in samples]
        stored = gateway.vault.write(samples)
        gateway.metrics.stored.labels("rules").inc(stored)

    return write


class Evaluator:
    """The evaluator loop of one worker: waits for the lease, then loads and evaluates."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        state_dir = _state_dir(gateway)
        location = gateway.vault.location if isinstance(gateway.vault, Vault) else None
        self.lease = EvaluatorLease(state_dir, location)
        self.status_path = state_dir / STATUS_FILE
        self.reload_path = state_dir / RELOAD_FILE
        self.manager: RuleManager | None = None
        self.reload_seen = ""
        self.reload_error = ""
        self.leader = False
        self._publish_lock = threading.Lock()

    def _reload_marker(self) -> str:
        try:
            return self.reload_path.read_text()
        except FileNotFoundError:
            return ""

    def start_manager(self) -> None:
        g = self.gateway
        manager = RuleManager(rules_source(g), rules_writer(g), manager_options(g))
        for factory in ALERT_SINKS:
            hook = factory(g)
            if hook is not None:
                manager.on_alerts(hook)
        manager.on_round(self._round_done)
        self.reload_seen = self._reload_marker()
        try:
            manager.load(g.settings.rules_files)
        except MetricVaultError as exc:  # serve checked the files; they changed since
            self.reload_error = exc.message
            log.error("rule files not loaded: %s", exc.message)
        self.manager = manager
        self.publish()

    def publish(self) -> None:
        manager = self.manager
        if manager is None:
            return
        extra = {"leader": self.lease.holder, "reloadError": self.reload_error}
        with self._publish_lock:  # rounds end in the manager's threads
            write_atomically(str(self.status_path), status_json(manager, extra))

    def _round_done(self, group: RuleGroup, failures: int) -> None:
        """After each group's round (in its thread): count its failures, publish the status."""
        self.gateway.metrics.rule_failures.labels(group.key).inc(failures)
        self.publish()

    def step(self) -> None:
        """One pass: keep or take the lease, reload if asked, run the rounds due."""
        held = self.lease.held()
        if not held:
            if self.leader:
                log.warning("rule evaluator lease lost; another gateway evaluates now")
            if self.manager is not None:
                self.manager.close(wait_running=False)
            self.leader, self.manager = False, None
            return
        if not self.leader:
            self.leader = True
            self.start_manager()
        assert self.manager is not None
        marker = self._reload_marker()
        if marker != self.reload_seen:
            self.reload_seen = marker
            try:
                self.manager.load(self.gateway.settings.rules_files)
                self.reload_error = ""
            except MetricVaultError as exc:
                self.reload_error = exc.message
                log.error("rule reload refused, the old rules stay: %s", exc.message)
            self.publish()
        missed = self.manager.missed_total
        # Each due group's round starts in the manager's pool, on its own schedule; each
        # counts and publishes when it ends (_round_done).
        self.manager.run_due(wait_done=False)
        self.gateway.metrics.rule_missed.inc(self.manager.missed_total - missed)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.step()
            except OSError as exc:  # no file descriptor left, a failing disk: not a bug
                log.error("rule evaluator pass failed: %s; the next pass tries again", exc)
            except Exception:  # a bug in one pass must not end the evaluator
                log.exception("rule evaluator pass failed")
            self.gateway.metrics.rule_leader.set(1 if self.leader else 0)
            wait = POLL_S
            if self.manager is not None and (due := self.manager.next_due_ms()) is not None:
                wait = max(0.0, min(POLL_S, (due - self.manager.now_ms()) / 1000))
            stop.wait(wait)
        if self.manager is not None:
            self.manager.close()  # the rounds in flight end before the lease goes
        self.lease.release()


async def evaluator_task(gateway: Gateway) -> None:
    """The evaluator in a thread of this worker; SIGHUP asks for a reload."""
    evaluator = Evaluator(gateway)
    stop = threading.Event()
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGHUP, lambda: threading.Thread(target=request_reload, args=(gateway,)).start()
        )
    thread = threading.Thread(target=evaluator.run, args=(stop,), name="rules", daemon=True)
    thread.start()
    try:
        await asyncio.Event().wait()  # until the app shuts down and cancels this task
    finally:
        stop.set()
        await asyncio.to_thread(thread.join)


def pid_holding_lease(state_dir: Path) -> int | None:
    """The pid written in the lease file (a test's view of which worker evaluates)."""
    try:
        text = (state_dir / "rules.lease").read_text().strip()
    except FileNotFoundError:
        return None
    _, _, pid = text.rpartition(":")
    return int(pid) if pid.isdigit() and os.path.exists(f"/proc/{pid}") else None
