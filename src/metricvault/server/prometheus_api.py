"""The Prometheus HTTP query API on ``metricvault serve`` (the requests Grafana makes).

``/api/v1/query``, ``/api/v1/query_range``, ``/api/v1/series``, ``/api/v1/labels``,
``/api/v1/label/<name>/values``, ``/api/v1/metadata``, ``/api/v1/query_exemplars`` and
``/api/v1/status/buildinfo``, GET or form-encoded POST (remote_read, ``POST /api/v1/read``,
is :mod:`metricvault.server.remote_read_api`), answering Prometheus's JSON shapes:
``{"status": "success", "data": ...}`` or ``{"status": "error", "errorType": ..., "error":
...}`` with its status codes (400 ``bad_data``, 422 ``execution``, 503 ``timeout``). Parameters
are parsed as Prometheus parses them (times: Unix seconds with fractions or RFC 3339;
durations: seconds or ``5m``-style), and errors carry Prometheus's words.

The routes are thin: they parse, then call the PromQL engine (:mod:`metricvault.promql`),
which knows nothing of HTTP. Authentication, the body limit and the caller's tenant come from
the gateway (:meth:`Gateway.handle`); a tenant's token sees only series carrying its tenant
label, because every selection the engine makes is narrowed by a tenant matcher first
(:mod:`metricvault.server.reads`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route

from metricvault.credentials import Principal
from metricvault.durations import parse_duration_ms
from metricvault.errors import MetricVaultError, PromQLError, SelectorError
from metricvault.memory import release_freed_memory
from metricvault.model import is_label_name
from metricvault.promql import Engine, EngineOptions, QueryResult
from metricvault.promql import parse as parse_module
from metricvault.promql.head_cache import TenantHeads
from metricvault.promql.limits import check_resolution, timed_out, too_many_series
from metricvault.promql.result_cache import CachedAnswer, CatalogVersion, ResultCache
from metricvault.promql.source import TenantSource
from metricvault.promql.window_cache import catalog_of
from metricvault.protocols import Reading, has
from metricvault.selector import Matcher, Selector, parse_selector
from metricvault.server.api import ServerAPI
from metricvault.server.prometheus_json import answer_body
from metricvault.server.reads import readable, tenant_matchers, tenant_source

if TYPE_CHECKING:
    from metricvault.server.app import Gateway

log = logging.getLogger("metricvault.gateway")
# how long past a query's deadline the route waits before answering 503 without the engine
BACKSTOP_GRACE_S = 1.0
PROMETHEUS_COMPATIBLE_VERSION = "2.42.0"  # what Grafana reads from buildinfo to pick features
_PROM_DURATION = re.compile(r"^(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$")
# Prometheus's own min/max time strings (what Grafana and promtool send for "all time")
_MIN_TIME = {"-292273086-05-16T16:47:06Z", "0001-01-01T00:00:00Z"}
_MAX_TIME = {"292277025-08-18T07:12:54.999999999Z", "9999-12-31T23:59:59Z"}
# what those strings stand for here; a time outside them is refused (it fits no timestamp)
MIN_TIME_MS, MAX_TIME_MS = -(2**62), 2**62
_INT64_MAX = 2**63 - 1
# errors the routes word themselves, which must not get the "query" parameter's prefix
BAD_PARAM_WORDS = ("invalid parameter", "exceeded maximum resolution", "no match[]",
                   "invalid label name", "invalid expression type")  # fmt: skip
# What newer Prometheus (2.51+, web/api/v1/api.go) adds to warnings when `limit=` cut a
# series/labels/label values answer short; Grafana's metrics browser looks for these words.
TRUNCATED = "results truncated due to limit"
_GO_INT = re.compile(r"^[+-]?[0-9]+$")  # what Go's strconv.Atoi accepts
# raw samples the query API keeps between queries (about 16 B each: 64 MB)
HEAD_SAMPLES = 4_000_000
STATUS = {"bad_data": 400, "execution": 422, "timeout": 503, "internal": 500, "not_found": 404}


class _Worded(PromQLError):
    """A refusal the route worded in full: ``answer`` adds no ``invalid parameter`` prefix."""


def invalid_param(name: str, detail: str) -> PromQLError:
    """Prometheus's words for a bad parameter (``answer`` adds the ``query`` one itself)."""
    return PromQLError(f'invalid parameter "{name}": {detail}', kind="bad_data")


# --------------------------------------------------------------------------- parameters
def parse_time_param(text: str | None, default_ms: int, name: str, wrapped: bool = True) -> int:
    """Prometheus's ``parseTime``: Unix seconds (fractions allowed) or RFC 3339. ``wrapped``:
    worded as its ``parseTimeParam`` words it (``time``, and ``start``/``end`` of the metadata
    endpoints); query_range's ``start``/``end`` are not."""
    if text is None or text == "":
        return default_ms
    try:
        return _parse_time(text)
    except ValueError:
        detail = f'cannot parse "{text}" to a valid timestamp'
        if wrapped:
            detail = f"Invalid time value for '{name}': {detail}"
        raise invalid_param(name, detail) from None


def _parse_time(text: str) -> int:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isnan(seconds) and math.isfinite(seconds):
        return _representable(round(seconds * 1000), text)
    if text in _MIN_TIME:
        return MIN_TIME_MS
    if text in _MAX_TIME:
        return MAX_TIME_MS
    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))  # ValueError: not a time
    if stamp.tzinfo is None:
        raise ValueError(text)
    return round(stamp.timestamp() * 1000)


def _representable(ms: int, text: str) -> int:
    """``ms`` if it lies between Prometheus's own min and max times; past them (``1e300``,
    ``-1e17``) no timestamp can hold it, and arithmetic on it would overflow int64."""
    if not MIN_TIME_MS <= ms <= MAX_TIME_MS:
        raise ValueError(text)
    return ms


def parse_duration_param(text: str | None, name: str) -> int:
    """Prometheus's ``parseDuration``: seconds (fractions allowed) or ``1h30m``-style."""
    if text is None or text == "":
        raise invalid_param(name, 'cannot parse "" to a valid duration')
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    ms = None
    if math.isfinite(seconds):
        ms = round(seconds * 1000)
    elif _PROM_DURATION.match(text) and text != "0":
        with contextlib.suppress(MetricVaultError):
            ms = parse_duration_ms(text)
    if ms is None:
        raise invalid_param(name, f'cannot parse "{text}" to a valid duration')
    if abs(ms) * 1_000_000 > _INT64_MAX:  # Prometheus's Durations are int64 nanoseconds
        raise invalid_param(name, f'cannot parse "{text}" to a valid duration. It overflows int64')
    return ms


def parse_limit(params: dict[str, list[str]]) -> int:
    """``limit=`` of series/labels/label values as newer Prometheus parses it (0: none)."""
    text = _one(params, "limit")
    if not text:
        return 0
    if not _GO_INT.match(text):
        raise invalid_param("limit", f'strconv.Atoi: parsing "{text}": invalid syntax')
    if int(text) < 0:
        raise invalid_param("limit", "limit must be non-negative")
    return int(text)


def check_depth(expr: str) -> None:
    """The engine's depth check (promql/parse.py), worded as a bad ``query`` parameter."""
    try:
        parse_module.check_depth(expr)
    except PromQLError as exc:
        raise invalid_param("query", exc.message) from None


def parse_matchers(texts: Sequence[str], wrapped: bool = True) -> list[list[Matcher]]:
    """``match[]`` selectors; refusals worded as Prometheus's ``parseMatchersParam`` words
    them: a selector of matchers that all match "" is its own error, and what does not parse is
    a ``parse error`` in the PromQL parser's words. ``wrapped``: with the ``invalid parameter
    "match[]"`` prefix, which Prometheus 2.42 gives on /series but not on /labels and
    /label/<name>/values."""
    out = []
    for text in texts:
        try:
            out.append(list(parse_selector(text).matchers))
        except SelectorError as exc:
            error = _match_error(text, str(exc))
            if not wrapped:
                bare = error.message.removeprefix('invalid parameter "match[]": ')
                raise _Worded(bare, "bad_data") from None
            raise error from None
    return out


def _match_error(text: str, ours: str) -> PromQLError:
    from metricvault.promql.parse import parse

    try:
        parse(text)
    except PromQLError as exc:
        if "at least one non-empty matcher" in exc.message:
            return invalid_param("match[]", "match[] must contain at least one non-empty matcher")
        return invalid_param("match[]", exc.message)
    return invalid_param("match[]", ours)


def _trimmed_after_refusal(call: Callable[[], Any], store: object = None) -> Any:
    """``call()``, its reads of ``store`` in one catalog version where the store pins one
    (``Vault.pinned``: one catalog probe a query, not one per read); a query stopped by its
    budget or deadline built up to the limit before it was refused, so its freed pages go back
    to the OS (else the worker keeps that peak)."""
    pinned = getattr(store, "pinned", None)
    try:
        if pinned is None:
            return call()
        with pinned():
            return call()
    except PromQLError as exc:
        if exc.kind in ("execution", "timeout"):
            release_freed_memory()
        raise


# --------------------------------------------------------------------------- the routes
class PrometheusQueryAPI(ServerAPI):
    name = "query"
    summary = (
        "the Prometheus query API: `/api/v1/query`, `/api/v1/query_range`, `/api/v1/series`, "
        "`/api/v1/labels`, `/api/v1/label/<name>/values`, `/api/v1/metadata`, "
        "`/api/v1/query_exemplars`, `/api/v1/status/buildinfo`; any other `/api/v1/<rest>` "
        "answers a Prometheus-shaped JSON not_found error"
    )

    def routes(self, gateway: Gateway) -> list[Route]:
        return PrometheusAPI(gateway).routes()


API = PrometheusQueryAPI()


class PrometheusAPI:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        settings = gateway.settings
        self.timeout_s = parse_duration_ms(settings.query_timeout) / 1000
        self.max_samples = settings.query_max_samples
        self.max_series = settings.query_max_series
        # the engine counts what a query holds and checks its deadline while it runs
        self.options = EngineOptions(
            lookback_delta_ms=parse_duration_ms(settings.lookback_delta),
            max_samples=settings.query_max_samples,
            max_series=settings.query_max_series,
            round_windows=settings.promql_round_windows,
        )
        # a dashboard refresh recomputes only its newest steps (promql/result_cache.py)
        self.results = ResultCache()
        # and reads only the raw samples since its last read (promql/head_cache.py)
        self.heads = TenantHeads(max_samples=HEAD_SAMPLES)

    def routes(self) -> list[Route]:
        both = ["GET", "POST"]  # remote_read (/api/v1/read) is its own API: remote_read_api
        return [
            # first: Starlette serves the first partial match (a path match with another
            # method), so this answers the 405s of the routes after it in JSON as well
            UnknownPathRoute("/api/v1/{rest:path}", self.unknown, methods=ANY_METHOD),
            Route("/api/v1/query", self.query, methods=both),
            Route("/api/v1/query_range", self.query_range, methods=both),
            Route("/api/v1/series", self.series, methods=both),
            Route("/api/v1/labels", self.labels, methods=both),
            Route("/api/v1/label/{name}/values", self.label_values, methods=["GET"]),
            Route("/api/v1/metadata", self.metadata, methods=["GET"]),
            Route("/api/v1/query_exemplars", self.exemplars, methods=both),
            Route("/api/v1/status/buildinfo", self.buildinfo, methods=["GET"]),
        ]

    # ------------------------------------------------------------------ plumbing
    async def answer(
        self,
        request: Request,
        endpoint: str,
        work: Callable[[dict[str, list[str]], Principal], Awaitable[tuple[Any, list[str]]]],
    ) -> Response:
        async def run(req: Request, who: Principal) -> Response:
            try:
                params = await self.params(req)
                data, warnings = await work(params, who)
            except PromQLError as exc:  # Prometheus: a query that can never run is a bad param
                bare = exc.kind == "bad_data" and not exc.message.startswith(BAD_PARAM_WORDS)
                bare = bare and not isinstance(exc, _Worded)
                prefix = 'invalid parameter "query": ' if bare else ""
                return _error(exc.kind, prefix + exc.message)
            if isinstance(data, _Written):  # a query's answer: its JSON written by _written
                return Response(data.body, media_type="application/json")
            body: dict[str, Any] = {"status": "success", "data": data}
            if warnings:
                body["warnings"] = warnings
            return JSONResponse(body)

        response = await self.gateway.handle(request, endpoint, run)
        if response.media_type != "application/json":  # auth, body limit: Prometheus's shape
            kind = "bad_data" if response.status_code < 500 else "internal"
            text = bytes(response.body).decode(errors="replace").strip()
            return _error(kind, text, response.status_code, dict(response.headers))
        return response

    async def params(self, request: Request) -> dict[str, list[str]]:
        """Query-string and form-encoded body parameters, repeated keys kept (``match[]``)."""
        pairs = list(request.query_params.multi_items())
        if request.method == "POST":
            content_type = request.headers.get("content-type", "")
            body = await self.gateway.body(request)
            if body and content_type.startswith("application/x-www-form-urlencoded"):
                pairs += parse_qsl(body.decode(errors="replace"), keep_blank_values=True)
        out: dict[str, list[str]] = {}
        for key, value in pairs:
            out.setdefault(key, []).append(value)
        return out

    def store(self) -> Reading:
        return readable(self.gateway)

    def engine(self, who: Principal, timeout_s: float) -> tuple[Engine, TenantSource]:
        """An engine for one query of ``who``'s: its reads narrowed to the tenant first, its
        limits the settings' (the engine counts samples and series itself), its deadline
        ``timeout_s`` from the start of its evaluation."""
        # a raw selection reaching before the store's raw horizon (retention dropped the
        # samples there) and answered by no rollup rows warns
        source = tenant_source(self.gateway, who)
        # recent raw samples kept between queries (where the options keep a head cache)
        options = replace(self.options, timeout_s=timeout_s)
        return Engine(source, options, shared_heads=self.heads), source

    def catalog_version(self) -> CatalogVersion | None:
        """The store's catalog version, which says whether a cached answer still holds; None
        (nothing cached) for a store without one."""
        current = catalog_of(self.gateway.vault)
        return None if current is None else current()

    def tenant_matchers(self, who: Principal) -> tuple[Matcher, ...]:
        return tenant_matchers(self.gateway, who)

    def query_timeout(self, params: dict[str, list[str]]) -> float:
        """Seconds a query may run: ``query_timeout``, or less where the request's ``timeout=``
        says so (Prometheus's API and Grafana's ``queryTimeout`` send one)."""
        text = _one(params, "timeout")
        if not text:
            return self.timeout_s
        return min(self.timeout_s, parse_duration_param(text, "timeout") / 1000)

    async def evaluate(self, call: Callable[[], Any], timeout_s: float) -> Any:
        """Run ``call`` (an evaluation with its own deadline) in a worker thread. The engine's
        deadline is what stops the work; this wait only answers a query stuck past it in a
        single read (which no deadline check can interrupt) a little later."""
        try:
            return await asyncio.wait_for(
                run_in_threadpool(_trimmed_after_refusal, call, self.gateway.vault),
                timeout_s + BACKSTOP_GRACE_S,
            )
        except TimeoutError:
            log.warning("a query ran %.1f s past its deadline in one read", BACKSTOP_GRACE_S)
            raise timed_out() from None

    def warnings(self, source: TenantSource, result: QueryResult) -> list[str]:
        """The engine's own (rollups answering before the raw horizon), and whether raw
        selections were cut short by it."""
        notes = list(result.warnings)
        if source.truncated:
            horizon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(source.raw_horizon_ms / 1000))
            notes.append(
                f"raw samples before {horizon} were dropped by retention (retention_raw) and "
                "no rollup rows answered there: the selection covers only the raw data after it"
            )
        return notes

    # ------------------------------------------------------------------ endpoints
    async def query(self, request: Request) -> Response:
        async def work(params: dict[str, list[str]], who: Principal) -> tuple[Any, list[str]]:
            at = parse_time_param(_one(params, "time"), round(time.time() * 1000), "time")
            expr = _one(params, "query") or ""
            timeout_s = self.query_timeout(params)
            check_depth(expr)
            engine, source = self.engine(who, timeout_s)

            def evaluate() -> tuple[QueryResult, list[str]]:
                result = engine.evaluate(expr, at)
                return result, self.warnings(source, result)

            written: tuple[_Written, list[str]] = await self.evaluate(
                lambda: _written(*evaluate()), timeout_s
            )
            return written

        return await self.answer(request, "/api/v1/query", work)

    async def query_range(self, request: Request) -> Response:
        async def work(params: dict[str, list[str]], who: Principal) -> tuple[Any, list[str]]:
            start = parse_time_param(_one(params, "start"), -1, "start", wrapped=False)
            end = parse_time_param(_one(params, "end"), -1, "end", wrapped=False)
            if _one(params, "start") in (None, ""):
                raise invalid_param("start", 'cannot parse "" to a valid timestamp')
            if _one(params, "end") in (None, ""):
                raise invalid_param("end", 'cannot parse "" to a valid timestamp')
            if end < start:
                raise invalid_param("end", "end timestamp must not be before start time")
            step = parse_duration_param(_one(params, "step"), "step")
            if step <= 0:
                raise invalid_param(
                    "step",
                    "zero or negative query resolution step widths are not accepted. "
                    "Try a positive integer",
                )
            check_resolution(start, end, step)
            expr = _one(params, "query") or ""
            timeout_s = self.query_timeout(params)
            check_depth(expr)

            def evaluate(lo: int, hi: int) -> tuple[QueryResult, list[str]]:
                engine, source = self.engine(who, timeout_s)
                result = engine.evaluate(expr, lo, hi, step)
                return result, self.warnings(source, result)

            answer: tuple[_Written, list[str]]
            if _one(params, "nocache") in ("1", "true"):  # VictoriaMetrics's switch
                answer = await self.evaluate(lambda: _written(*evaluate(start, end)), timeout_s)
                return answer
            scope = (self.tenant_matchers(who), self.options.lookback_delta_ms,
                     self.options.round_windows)  # fmt: skip
            answer = await self.evaluate(
                lambda: _written(
                    *self.results.query_range(
                        scope, expr, start, end, step, self.catalog_version, evaluate
                    )
                ),
                timeout_s,
            )
            return answer

        return await self.answer(request, "/api/v1/query_range", work)

    def matching_series(
        self,
        selectors: list[list[Matcher]],
        who: Principal,
        with_kind: bool = False,
        span: tuple[int | None, int | None] = (None, None),
    ) -> list[dict[str, str]]:
        """Label sets (``__name__`` included) of the series any selector matches, sorted;
        ``with_kind`` adds the metric kind under the key ``" kind"`` (not a label name).
        ``span`` (start, end ms) keeps the series with samples then (to the day)."""
        tenant = self.tenant_matchers(who)
        found: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        start, end = span
        if start is not None and end is not None and end < start:
            return []  # no series has samples in an empty range (Prometheus lists none)
        store = self.store()
        times = {"start_ms": start, "end_ms": end} if has(store, "series_times") else {}
        for matchers in selectors or [[]]:
            text = str(Selector((*tenant, *matchers))) if (matchers or tenant) else None
            table = store.series(text, output="arrow", **times)
            names = [c for c in table.column_names if c != "series_id"]
            for row in table.select(names).to_pylist():
                kind = row.pop("kind")
                row["__name__"] = row.pop("metric")
                labels = {k: row[k] for k in sorted(row) if row[k]}  # Prometheus's label order
                key = tuple(labels.items())
                if with_kind:
                    labels[" kind"] = kind or "unknown"
                found[key] = labels
        return [found[k] for k in sorted(found)]

    def check_expansion(self, found: list[dict[str, str]], selectors: list[list[Matcher]]) -> None:
        """``query_max_series`` on what the match[] selectors expanded to (without match[],
        labels and label values read the whole index, which the limit does not cover)."""
        if selectors and len(found) > self.max_series:
            raise too_many_series(self.max_series)

    def range_note(self, params: dict[str, list[str]]) -> list[str]:
        """Where the store keeps no first/last-seen times, say that start/end were not applied."""
        if has(self.store(), "series_times"):
            return []
        if _one(params, "start") or _one(params, "end"):
            return ["start/end are not applied: every matching series the store holds is listed"]
        return []

    async def series(self, request: Request) -> Response:
        async def work(params: dict[str, list[str]], who: Principal) -> tuple[Any, list[str]]:
            if not params.get("match[]"):
                raise PromQLError("no match[] parameter provided", "bad_data")
            selectors = parse_matchers(params["match[]"])
            span = _check_range(params)
            limit = parse_limit(params)
            found = await run_in_threadpool(self.matching_series, selectors, who, False, span)
            self.check_expansion(found, selectors)
            return _truncate(found, limit, self.range_note(params))

        return await self.answer(request, "/api/v1/series", work)

    async def labels(self, request: Request) -> Response:
        async def work(params: dict[str, list[str]], who: Principal) -> tuple[Any, list[str]]:
            selectors = parse_matchers(params.get("match[]", []), wrapped=False)
            span = _check_range(params)
            limit = parse_limit(params)
            found = await run_in_threadpool(self.matching_series, selectors, who, False, span)
            self.check_expansion(found, selectors)
            names = sorted({name for labels in found for name in labels})
            return _truncate(names, limit, self.range_note(params))

        return await self.answer(request, "/api/v1/labels", work)

    async def label_values(self, request: Request) -> Response:
        name = request.path_params["name"]

        async def work(params: dict[str, list[str]], who: Principal) -> tuple[Any, list[str]]:
            if not is_label_name(name):
                raise PromQLError(f'invalid label name: "{name}"', "bad_data")
            selectors = parse_matchers(params.get("match[]", []), wrapped=False)
            span = _check_range(params)
            limit = parse_limit(params)
            found = await run_in_threadpool(self.matching_series, selectors, who, False, span)
            self.check_expansion(found, selectors)
            values = sorted({s[name] for s in found if name in s})
            return _truncate(values, limit, self.range_note(params))

        return await self.answer(request, "/api/v1/label/{name}/values", work)

    async def metadata(self, request: Request) -> Response:
        async def work(params: dict[str, list[str]], who: Principal) -> tuple[Any, list[str]]:
            wanted = _one(params, "metric")
            found = await run_in_threadpool(self.matching_series, [], who, True)
            kinds = {s["__name__"]: s[" kind"] for s in found}
            data: dict[str, list[dict[str, str]]] = {}
            for metric in sorted(kinds):
                if wanted and metric != wanted:
                    continue
                data[metric] = [{"type": kinds[metric], "help": "", "unit": ""}]
            limit = _one(params, "limit")
            if limit and limit.lstrip("-").isdigit() and int(limit) >= 0:
                data = dict(list(data.items())[: int(limit)])
            return data, []

        return await self.answer(request, "/api/v1/metadata", work)

    async def exemplars(self, request: Request) -> Response:
        async def work(params: dict[str, list[str]], who: Principal) -> tuple[Any, list[str]]:
            return [], []  # exemplars are counted on ingest, not stored

        return await self.answer(request, "/api/v1/query_exemplars", work)

    async def buildinfo(self, request: Request) -> Response:
        from metricvault import __version__

        async def work(params: dict[str, list[str]], who: Principal) -> tuple[Any, list[str]]:
            return {
                "version": PROMETHEUS_COMPATIBLE_VERSION,
                "revision": f"metricvault-{__version__}",
                "branch": "metricvault",
                "buildUser": "metricvault",
                "buildDate": "",
                "goVersion": "none (Python)",
            }, []

        return await self.answer(request, "/api/v1/status/buildinfo", work)

    async def unknown(self, request: Request) -> Response:
        """A path under /api/v1/ that no API serves: Prometheus's JSON error shape (clients
        such as Grafana parse every /api/v1 answer as JSON), after auth like any route."""

        allowed = sorted(  # a path another API serves, asked with a method it does not take
            m
            for route in request.app.router.routes
            if not isinstance(route, UnknownPathRoute)
            and isinstance(route, Route)
            and route.matches(request.scope)[0] != Match.NONE
            for m in route.methods or ()
        )
        if allowed:
            return _error(
                "bad_data",
                f"method {request.method} is not allowed for {request.url.path} "
                f"(allowed: {', '.join(allowed)})",
                405,
                {"Allow": ", ".join(allowed)},
            )

        async def work(params: dict[str, list[str]], who: Principal) -> tuple[Any, list[str]]:
            if request.method != "POST":  # POST bodies were read (and limited) by params()
                await self.gateway.body(request)
            raise _Worded(
                f"unknown API endpoint {request.method} {request.url.path}: the query API "
                f"serves {', '.join(sorted(SERVED_PATHS))} (docs/promql.md)",
                kind="not_found",
            )

        return await self.answer(request, "/api/v1/*", work)


ANY_METHOD = ["GET", "POST", "PUT", "DELETE", "PATCH"]
SERVED_PATHS = ("/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels",
                "/api/v1/label/<name>/values", "/api/v1/metadata", "/api/v1/query_exemplars",
                "/api/v1/status/buildinfo")  # fmt: skip


class UnknownPathRoute(Route):
    """A catch-all that matches only as a last resort: its path match is reported PARTIAL,
    and Starlette's router serves a partial match only when no route matched fully, so the
    APIs mounted after this one (remote_read's /api/v1/read, rules) keep their paths."""

    def matches(self, scope: Any) -> tuple[Match, Any]:
        match, child = super().matches(scope)
        return (Match.PARTIAL if match == Match.FULL else match), child


def _one(params: dict[str, list[str]], name: str) -> str | None:
    values = params.get(name)
    return values[-1] if values else None


def _check_range(params: dict[str, list[str]]) -> tuple[int | None, int | None]:
    """The metadata endpoints' ``start``/``end`` in ms (None where absent: all time)."""
    start = parse_time_param(_one(params, "start"), MIN_TIME_MS, "start")
    end = parse_time_param(_one(params, "end"), MAX_TIME_MS, "end")
    return (
        None if start <= MIN_TIME_MS else start,
        None if end >= MAX_TIME_MS else end,
    )


@dataclass(frozen=True)
class _Written:
    """A query's answer as its JSON body, written on the worker thread that evaluated it: not
    on the event loop, which a big answer's formatting (~3 ms for 46,000 points) would hold
    up for every other request of the worker."""

    body: bytes


def _written(result: QueryResult, warnings: list[str]) -> tuple[_Written, list[str]]:
    """``result``'s body: a cached answer joins its kept point texts, any other is written
    by ``answer_body`` (the bytes ``JSONResponse(to_prometheus())`` would be)."""
    if isinstance(result, CachedAnswer):
        return _Written(_served_by(result.body(warnings), result)), warnings
    return _Written(_served_by(answer_body(result, warnings), result)), warnings


def _served_by(body: bytes, result: QueryResult) -> bytes:
    """The answer with ``"servedBy": [tiers]`` beside ``data`` when rollup tiers answered
    (the UI says which tier answered a range). Additive: Prometheus clients and Grafana read
    ``status``/``data``/``warnings`` and ignore other keys; an answer from raw samples only
    is left byte for byte as Prometheus writes it."""
    if not result.served_by:
        return body
    tiers = json.dumps(sorted(result.served_by)).encode()
    return b"".join((body[:-1], b',"servedBy":', tiers, b"}"))  # one copy (answer_body's note)


def _truncate(items: list[Any], limit: int, warnings: list[str]) -> tuple[list[Any], list[str]]:
    """The first ``limit`` items (0: all), with Prometheus's warning when some were cut."""
    if limit and len(items) > limit:
        return items[:limit], [*warnings, TRUNCATED]
    return items, warnings


def _error(
    kind: str, message: str, status: int | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    passed = ("retry-after", "www-authenticate", "allow")
    keep = {k: v for k, v in (headers or {}).items() if k.lower() in passed}
    return JSONResponse(
        {"status": "error", "errorType": kind, "error": message},
        status_code=status or STATUS.get(kind, 422),
        headers=keep,
    )
