"""The web UI: ``GET /`` and the pages under ``/ui/``, and the JSON endpoints they read.

Pages are server-rendered HTML shells (everything taken from data is ``html.escape``d) plus one
small script (``static/ui.js``) and uPlot (``static/vendor/uplot``, vendored from its npm
release); nothing is fetched from elsewhere. The script reads data only through HTTP JSON APIs:
the Prometheus API, ``/api/v1/experiments``, ``/api/v1/alerts``/``/api/v1/rules`` and the
endpoints below (docs/ui.md documents them):

- ``GET /api/v1/ui/experiments``: the experiments table, filtered, sorted and paged on the
  server (``q``, ``tag``, ``owner``, ``param=key=value``, ``sort``, ``order``, ``offset``,
  ``limit``), with the summary figures of the rows of the page.
- ``GET /api/v1/experiments/{id}/history``: metrics by training step (``metrics``, ``width``).
- ``GET /api/v1/compare``: summaries, params side by side, one metric's curves by step.
- ``GET /api/v1/vault/stats``: tiers, rollup lag, buffer depth, series per metric.

Every page and endpoint goes through :meth:`Gateway.handle` (the same credentials as every
route) and sees only the caller's tenant: experiments are those of the tenant, the curves are
read through the experiment's selector confined to the tenant, and the storage figures of the
whole vault are shown only to a tenant-less (administrator) credential. Long series are
downsampled on the server to the chart's pixel width, keeping each pixel column's minimum and
maximum so spikes survive.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import mimetypes
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from metricvault.credentials import Principal
from metricvault.errors import InputError, NotFoundError, UnsupportedError
from metricvault.experiment import Experiment
from metricvault.server.api import ServerAPI
from metricvault.server.experiments_api import Experiments, confine, visible
from metricvault.server.ui_common import STATIC_DIR, downsample, esc, finite
from metricvault.server.ui_curves import step_curves, tracked
from metricvault.server.ui_login import Login, page_guard

if TYPE_CHECKING:
    from metricvault.server.app import Gateway

DEFAULT_WIDTH = 800
MAX_WIDTH = 4000
MAX_PAGE = 500
MAX_COMPARE = 100
# the series index is read whole before the server listens up to this many rows of series
# files (~1 s at ~15 us a series); past it each query reads its metrics' part when first asked
WARM_SERIES_ROWS = 50_000
HISTORY_METRICS = ("train_loss", "learning_rate", "grad_norm", "tokens_per_second", "mfu")
# (name, sortable on the server); the summary figures are computed for the page's rows only,
# so they cannot order 10,000 experiments without computing all of them
COLUMNS = ("id", "name", "owner", "team", "start", "end", "duration_h", "git_sha", "tags")
SORTABLE = ("id", "name", "owner", "team", "start", "end", "duration_h", "git_sha")
SUMMARY_FIELDS = ("gpus", "gpu_hours", "energy_kwh", "final_loss", "mfu_mean", "gpu_util_mean")
PAGES = (
    ("experiments", "Experiments"),
    ("compare", "Compare"),
    ("explore", "Explore"),
    ("alerts", "Alerts"),
    ("vault", "Vault"),
)


class UIAPI(ServerAPI):
    name = "ui"
    summary = (
        "the web UI at `/` (`/ui/...`) and its JSON: `GET /api/v1/ui/experiments`, "
        "`/api/v1/experiments/{id}/history`, `/api/v1/compare`, `/api/v1/vault/stats`"
    )

    def routes(self, gateway: Gateway) -> list[Route]:
        ui = UI(gateway)
        get = ["GET", "HEAD"]
        login = Login(gateway)
        page = ui.page_endpoint
        return [
            Route("/", page(ui.root), methods=get),
            Route("/ui/static/{path:path}", ui.endpoint(ui.static), methods=get),
            Route("/ui/login", login.form, methods=get),
            Route("/ui/session", login.session, methods=["POST"]),
            Route("/ui/logout", login.logout, methods=["POST"]),
            Route("/ui/experiments", page(ui.experiments_page), methods=get),
            Route("/ui/experiments/{experiment_id}", page(ui.experiment_page), methods=get),
            Route("/ui/compare", page(ui.compare_page), methods=get),
            Route("/ui/explore", page(ui.explore_page), methods=get),
            Route("/ui/alerts", page(ui.alerts_page), methods=get),
            Route("/ui/vault", page(ui.vault_page), methods=get),
            Route("/api/v1/ui/experiments", ui.endpoint(ui.table), methods=get),
            Route(
                "/api/v1/experiments/{experiment_id}/history",
                ui.endpoint(ui.history),
                methods=get,
            ),
            Route(
                "/api/v1/experiments/{experiment_id}/gpus",
                ui.endpoint(ui.gpus),
                methods=get,
            ),
            Route(
                "/api/v1/experiments/{experiment_id}/archive",
                ui.endpoint(ui.archive),
                methods=get,
            ),
            Route("/api/v1/compare", ui.endpoint(ui.compare), methods=get),
            Route("/api/v1/vault/stats", ui.endpoint(ui.vault_stats), methods=get),
            Route("/api/v1/ui/alerts", ui.endpoint(ui.alerts), methods=get),
            Route("/api/v1/ui/anomalies", ui.endpoint(ui.anomalies), methods=get),
        ]


API = UIAPI()

Work = Callable[[Request, Principal], Any]


# --------------------------------------------------------------------------- pure helpers
def parse_width(raw: str | None) -> int:
    if raw is None or raw == "":
        return DEFAULT_WIDTH
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_WIDTH:
        raise InputError(
            f"width={raw!r} is not a number of pixels from 1 to {MAX_WIDTH}: pass the chart's "
            "width in CSS pixels"
        )
    return int(raw)


def parse_int(raw: str | None, name: str, default: int, limit: int) -> int:
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or int(raw) > limit:
        raise InputError(f"{name}={raw!r} must be a whole number from 0 to {limit}")
    return int(raw)


def parse_align(raw: str | None) -> str:
    from metricvault.archive.compare import ALIGNMENTS

    align = raw or "step"
    if align not in ALIGNMENTS:
        raise InputError(
            f"align={align!r} is not an alignment: use step (training step), elapsed "
            "(hours since each run's start) or time (wall-clock time), as "
            "`metricvault experiment compare --align` does"
        )
    return align


def team_of(exp: Experiment) -> str:
    """The team: the ``team`` param, else the ``team:<name>`` tag, else none."""
    team = exp.params.get("team")
    if team:
        return str(team)
    return next((t.split(":", 1)[1] for t in exp.tags if t.startswith("team:")), "")


def row_of(exp: Experiment, now: int) -> dict[str, Any]:
    start, end = exp.window(now)
    return {
        "id": exp.id,
        "name": exp.name,
        "owner": exp.owner,
        "team": team_of(exp),
        "start": exp.to_record()["start"],
        "end": exp.to_record()["end"],
        "start_ms": exp.start_ms,
        "end_ms": exp.end_ms,
        "duration_h": (end - start) / 3_600_000,
        "git_sha": exp.git_sha,
        "git_repo": exp.git_repo,
        "tags": list(exp.tags),
        "params": {k: finite(v) for k, v in exp.params.items()},
    }


def matches(
    exp: Experiment, q: str, tags: Sequence[str], owner: str, params: dict[str, str]
) -> bool:
    """The filters of the experiments table: ``q`` a case-insensitive substring of the id,
    name, owner, git SHA or a tag; every ``tag`` present; ``owner`` exact; each param equal
    (compared as text)."""
    if q:
        text = " ".join((exp.id, exp.name, exp.owner, exp.git_sha, team_of(exp), *exp.tags))
        if q.lower() not in text.lower():
            return False
    if any(t not in exp.tags for t in tags):
        return False
    if owner and exp.owner != owner:
        return False
    for key, wanted in params.items():
        if key not in exp.params or _text(exp.params[key]) != wanted:
            return False
    return True


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def filter_and_sort(
    experiments: list[Experiment], query: dict[str, Any], now: int
) -> tuple[int, list[dict[str, Any]]]:
    """(how many match, the page of rows) for the table's query parameters."""
    sort, order = query.get("sort") or "start", query.get("order") or "desc"
    if sort not in SORTABLE:
        raise InputError(
            f"sort={sort!r} is not a column the server sorts by: use one of {', '.join(SORTABLE)} "
            "(the summary figures are computed per page)"
        )
    if order not in ("asc", "desc"):
        raise InputError(f"order={order!r} must be asc or desc")
    params: dict[str, str] = {}
    for item in query.get("param", []):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"param={item!r} must be key=value, e.g. param=seed=0")
        params[key] = value
    found = [
        (sort_value(e, sort, now), e)
        for e in experiments
        if matches(e, query.get("q", ""), query.get("tag", []), query.get("owner", ""), params)
    ]
    present = [(v, e) for v, e in found if v is not None]
    absent = [e for v, e in found if v is None]  # running: no end; always last
    present.sort(key=lambda p: (p[0], p[1].id), reverse=order == "desc")
    ordered = [e for _, e in present] + absent
    offset, limit = query.get("offset", 0), query.get("limit", 50)
    # rows only for the page: building 10,000 of them cost seconds per request
    return len(ordered), [row_of(e, now) for e in ordered[offset : offset + limit]]


def sort_value(exp: Experiment, column: str, now: int) -> Any:
    """What ``row_of`` shows in a sortable column, in the same order (times as epoch ms, which
    order as their ISO text does)."""
    if column == "start":
        return exp.start_ms
    if column == "end":
        return exp.end_ms
    if column == "duration_h":
        start, end = exp.window(now)
        return (end - start) / 3_600_000
    if column == "team":
        return team_of(exp)
    return getattr(exp, column)


def param_rows(exps: Sequence[Experiment]) -> list[dict[str, Any]]:
    """The params side by side: each key, its value per experiment as text, and whether
    they differ (as ``experiment compare`` prints them)."""
    rows = []
    for key in sorted(set().union(*(e.params for e in exps))):
        cells = {e.id: (_text(e.params[key]) if key in e.params else "") for e in exps}
        rows.append({"param": key, "values": cells, "differs": len(set(cells.values())) > 1})
    return rows


# --------------------------------------------------------------------------- the endpoints
class UI:
    def __init__(self, gateway: Gateway, warm: bool = True) -> None:
        self.gateway = gateway
        self.registry_api = Experiments(gateway)
        # a finished experiment's figures, with the catalog version they were computed at
        self.summaries: OrderedDict[tuple[str, ...], tuple[Any, dict[str, Any]]] = OrderedDict()
        if warm:  # before the server listens, so that no first page waits for it
            self.warm()

    def warm(self) -> None:
        """What the first request of each page would otherwise wait for: the modules its
        data paths import (pandas' Arrow bridge, the archive's curves, the query engine) and
        the registry's parsed records (``Experiments.list`` keeps them while their files are
        unchanged: 10,000 JSON files are ~1 s to parse) and a small series index. Done
        while the app is made, before it serves: in a thread beside the first requests it
        held the interpreter's lock while they waited (a fresh server's first page painted
        later, not sooner)."""
        try:
            import pyarrow.pandas_compat  # noqa: F401  (the first .to_pandas() imports it)

            import metricvault.archive.compare
            import metricvault.promql  # noqa: F401

            registry = getattr(self.gateway.vault, "experiments", None)
            if registry is not None:
                registry.list()
            self._warm_series_index()
        except Exception:  # a closed or unreadable vault: the requests will say so
            logging.getLogger(__name__).debug("UI warm-up failed", exc_info=True)

    def _warm_series_index(self) -> None:
        """The whole series index where it is small (``WARM_SERIES_ROWS``): otherwise each
        page's first query reads its metrics' part of it (Compare's first curves: ~30 ms of
        ~200, 2,000 series in 7 files at ~15 us a series)."""
        vault = self.gateway.vault
        index, snapshot = getattr(vault, "index", None), getattr(vault, "snapshot", None)
        if index is None or not callable(snapshot) or not callable(getattr(index, "need_all", 0)):
            return
        if sum(sf.rows for sf in snapshot().series_files) <= WARM_SERIES_ROWS:
            index.need_all()

    def endpoint(self, work: Work) -> Callable[[Request], Any]:
        async def answer(request: Request) -> Response:
            # one label value for all of the UI in the gateway's request-duration metric
            return await self.gateway.handle(request, "/ui", work)

        return answer

    def page_endpoint(self, work: Work) -> Callable[[Request], Any]:
        """A page: without a credential (where some are configured) the login form."""

        async def answer(request: Request) -> Response:
            login = page_guard(self.gateway, request)
            if login is not None:
                return login
            return await self.gateway.handle(request, "/ui", work)

        return answer

    # ---- data
    def experiment(self, experiment_id: str, who: Principal) -> Experiment:
        """The caller's experiment with its selector confined to the caller's tenant (a
        registry record made outside the gateway still reads only the tenant's series)."""
        exp = self.registry_api.owned_experiment(experiment_id, who.tenant)
        label = self.gateway.settings.tenant_label
        return dataclasses.replace(exp, selector=confine(exp.selector, label, who.tenant))

    def summary(self, exp: Experiment) -> dict[str, Any]:
        """The summary figures of ``archive.compare.summarise``; a finished experiment's are
        cached while the catalog shows no data that could change them (:meth:`cached`)."""
        snap = self.catalog()
        return self._summary(exp, snap, self._version(snap))

    def _summary(self, exp: Experiment, snap: Any, version: Any) -> dict[str, Any]:
        from metricvault.archive.compare import summarise

        hit = self.cached([exp], snap, version)
        if exp.id in hit:
            return hit[exp.id]
        figures = dataclasses.asdict(summarise(self.gateway.vault, exp))
        result = {k: finite(figures[k]) for k in SUMMARY_FIELDS}
        if exp.end_ms is not None:
            self.remember(self.summary_key(exp), version, result)
        return result

    def summary_key(self, exp: Experiment) -> tuple[str, ...]:
        return (exp.id, exp.selector, str(exp.start_ms), str(exp.end_ms), exp.tenant)

    def catalog(self) -> Any:
        """The vault's catalog version now (buffered samples flushed first, as a read does),
        which cached figures are checked against; None where the backend has none."""
        vault: Any = self.gateway.vault
        if not callable(getattr(vault, "catalog_version", None)):
            return None
        flush = getattr(vault, "flush_for_read", None)
        if callable(flush):
            flush()
        try:
            snap = vault.catalog_version()
        except UnsupportedError:  # InfluxDB keeps no versions: cached as they are
            return None
        needed = ("version", "vault_id", "raw_horizon_ms", "files", "metric_kinds")
        return snap if all(hasattr(snap, a) for a in needed) else None

    @staticmethod
    def _version(snap: Any) -> Any:
        from metricvault.promql.result_cache import Version

        return None if snap is None else Version.of(snap)

    def cached(
        self, exps: Sequence[Experiment], snap: Any, version: Any
    ) -> dict[str, dict[str, Any]]:
        """The cached figures of the finished experiments among ``exps`` that still hold: a
        run's figures cannot change once it ended, unless late data lands in its window or
        files are rolled up, compacted or dropped; ``result_cache.still_holds`` tells (as
        for the query_range cache), up to the run's end. Entries computed at one catalog
        version are checked together; those that hold are stamped with ``version`` (the
        current one), the others dropped."""
        from metricvault.promql.result_cache import still_holds

        groups: dict[Any, list[tuple[Experiment, tuple[str, ...]]]] = {}
        for exp in exps:
            key = self.summary_key(exp)
            if exp.end_ms is not None and key in self.summaries:
                groups.setdefault(self.summaries[key][0], []).append((exp, key))
        out: dict[str, dict[str, Any]] = {}
        for old, group in groups.items():
            settled = max(int(e.end_ms or 0) for e, _ in group) - 1
            holds = old is None or snap is None or still_holds(old, snap, settled)
            for exp, key in group:
                if not holds:
                    del self.summaries[key]
                    continue
                result = self.summaries[key][1]
                self.summaries[key] = (version, result)
                self.summaries.move_to_end(key)
                out[exp.id] = result
        return out

    def page_summaries(self, exps: Sequence[Experiment], now: int) -> dict[str, dict[str, Any]]:
        """The summary figures of a page's rows: finished experiments from the cache, the
        rest in one batch of reads (``ui_summaries``) for ``track()``'s runs and one
        ``summarise`` each for the others."""
        from metricvault.server.ui_summaries import page_summaries

        snap = self.catalog()
        version = self._version(snap)
        out = self.cached(exps, snap, version)
        todo = [e for e in exps if e.id not in out]
        runs = [e for e in todo if tracked([e])]
        batched = (page_summaries(self.gateway.vault, runs, now) if runs else None) or {}
        for exp in todo:
            if exp.id not in batched:
                out[exp.id] = self._summary(exp, snap, version)
                continue
            result = {k: finite(batched[exp.id][k]) for k in SUMMARY_FIELDS}
            out[exp.id] = result
            if exp.end_ms is not None:
                self.remember(self.summary_key(exp), version, result)
        return out

    def remember(self, key: tuple[str, ...], version: Any, result: dict[str, Any]) -> None:
        self.summaries[key] = (version, result)
        while len(self.summaries) > 20_000:
            self.summaries.popitem(last=False)

    async def table(self, req: Request, who: Principal) -> Response:
        from metricvault.durations import now_ms

        q = req.query_params
        query = {
            "q": q.get("q", ""),
            "tag": [t for t in q.getlist("tag") if t],
            "owner": q.get("owner", ""),
            "param": [p for p in q.getlist("param") if p],
            "sort": q.get("sort", ""),
            "order": q.get("order", ""),
            "offset": parse_int(q.get("offset"), "offset", 0, 10**9),
            "limit": parse_int(q.get("limit"), "limit", 50, MAX_PAGE),
        }
        with_summary = q.get("summary", "1") != "0"

        def work() -> dict[str, Any]:
            registry = self.gateway.vault.experiments
            exps = visible(registry.list(), who.tenant)
            now = now_ms()
            total, rows = filter_and_sort(exps, query, now)
            if with_summary:
                label = self.gateway.settings.tenant_label
                by_id = {e.id: e for e in exps}
                page = [
                    dataclasses.replace(e, selector=confine(e.selector, label, who.tenant))
                    for e in (by_id[row["id"]] for row in rows)
                ]
                figures = self.page_summaries(page, now)
                for row, exp in zip(rows, page, strict=True):
                    row.update(figures[exp.id])
            return {
                "total": total,
                "offset": query["offset"],
                "limit": query["limit"],
                "sortable": list(SORTABLE),
                "rows": rows,
            }

        return JSONResponse(await run_in_threadpool(work))

    async def history(self, req: Request, who: Principal) -> Response:
        experiment_id = str(req.path_params["experiment_id"])
        raw = req.query_params.get("metrics", "")
        names = [m for m in raw.split(",") if m] or list(HISTORY_METRICS)
        width = parse_width(req.query_params.get("width"))
        align = parse_align(req.query_params.get("align"))

        def work() -> dict[str, Any]:
            exp = self.experiment(experiment_id, who)
            if align == "step":
                return {"align": align, **history_curves(self.gateway.vault, exp, names, width)}
            got = {
                n: time_curves(self.gateway.vault, [exp], n, align, width)[exp.id] for n in names
            }
            return {
                "align": align,
                "experiment": exp.id,
                "metrics": {n: c for n, c in got.items() if c is not None},
                "missing": [n for n, c in got.items() if c is None],
            }

        return JSONResponse(await run_in_threadpool(work))

    async def gpus(self, req: Request, who: Principal) -> Response:
        from metricvault.durations import now_ms

        experiment_id = str(req.path_params["experiment_id"])
        width = parse_width(req.query_params.get("width"))

        def work() -> dict[str, Any]:
            exp = self.experiment(experiment_id, who)
            return gpu_curves(self.gateway.vault, exp, width, now_ms())

        return JSONResponse(await run_in_threadpool(work))

    async def compare(self, req: Request, who: Principal) -> Response:
        from metricvault.durations import now_ms

        ids = [i for i in req.query_params.get("ids", "").split(",") if i]
        metric = req.query_params.get("metric") or "train_loss"
        width = parse_width(req.query_params.get("width"))
        align = parse_align(req.query_params.get("align"))
        if not ids:
            raise InputError("compare needs ids=<id>,<id>,...: the experiments to compare")
        if len(ids) > MAX_COMPARE:
            raise InputError(
                f"{len(ids)} experiments asked for, over the limit of {MAX_COMPARE}: compare "
                "fewer at a time"
            )

        # the page asks for the curves first (summaries=0) and draws them, then for the
        # summaries (curves=0): the chart does not wait for 100 runs' summary figures
        want_summaries = req.query_params.get("summaries", "1") != "0"
        want_curves = req.query_params.get("curves", "1") != "0"

        def work() -> dict[str, Any]:
            exps = [self.experiment(i, who) for i in dict.fromkeys(ids)]
            summaries = self.page_summaries(exps, now_ms()) if want_summaries else None
            curves: dict[str, Any] = {}
            if not want_curves:
                pass
            elif align == "step":
                # track()'s runs: two reads for all of them (ui_curves), else one history each
                batched = step_curves(self.gateway.vault, exps, metric, width, now_ms())
                if batched is not None:
                    curves = batched
                for exp in exps if batched is None else ():
                    got = history_curves(self.gateway.vault, exp, [metric], width)
                    curves[exp.id] = got["metrics"].get(metric)
            else:
                curves = time_curves(self.gateway.vault, exps, metric, align, width)
            return {
                "ids": [e.id for e in exps],
                "metric": metric,
                "align": align,
                "x_label": X_LABELS[align],
                "summaries": None
                if summaries is None
                else [{"id": e.id, **summaries[e.id]} for e in exps],
                "records": [row_of(e, 0) for e in exps],
                "params": param_rows(exps),
                "curves": curves if want_curves else None,
            }

        return JSONResponse(await run_in_threadpool(work))

    async def vault_stats(self, req: Request, who: Principal) -> Response:
        if req.query_params.get("only") == "raw_horizon":  # Explore's tier sentence: cheap
            from metricvault.server.reads import readable

            horizon = await run_in_threadpool(lambda: readable(self.gateway).horizons())
            return JSONResponse({"raw_horizon": horizon.raw_start_ms or None})
        return JSONResponse(await run_in_threadpool(self.stats_for, who))

    def agents_for(self, who: Principal) -> list[dict[str, Any]]:
        """The agents whose self-series this caller may read (ui_data.agents_seen)."""
        from metricvault.durations import now_ms
        from metricvault.server.reads import tenant_source
        from metricvault.server.ui_data import agents_seen

        source = tenant_source(self.gateway, who)
        return agents_seen(source, (), now_ms(), self.gateway.settings.tenant_label)

    def stats_for(self, who: Principal) -> dict[str, Any]:
        """Series per metric for the caller's tenant; the storage figures of the whole vault
        (tiers, rollup, buffer) only for a credential without a tenant, since they describe
        every tenant's data together."""
        from metricvault.server.reads import readable

        store = readable(self.gateway)
        label = self.gateway.settings.tenant_label
        selector = f'{{{label}="{who.tenant}"}}' if who.tenant else None
        frame = store.series(selector, output="pandas")
        per_metric: dict[str, int] = {}
        if len(frame) and "__name__" in frame.columns:
            per_metric = {str(k): int(v) for k, v in frame["__name__"].value_counts().items()}
        elif len(frame) and "metric" in frame.columns:
            per_metric = {str(k): int(v) for k, v in frame["metric"].value_counts().items()}
        cardinality = sorted(per_metric.items(), key=lambda kv: (-kv[1], kv[0]))
        settings = self.gateway.settings
        answer: dict[str, Any] = {
            "tenant": who.tenant or None,
            "series": len(frame),
            "cardinality": [{"metric": m, "series": n} for m, n in cardinality],
            **label_cardinality(frame, skip=("__name__", "metric", label if who.tenant else "")),
            "retention": {
                "raw": settings.retention_raw,
                "1m": settings.retention_1m,
                "1h": settings.retention_1h,
            },
            # where raw samples begin (Explore says which tier answers a range)
            "raw_horizon": store.horizons().raw_start_ms or None,
            "agents": self.agents_for(who),
        }
        if not who.tenant:  # overrides name selectors of any tenant's series
            answer["retention_overrides"] = [
                dataclasses.asdict(o) for o in settings.retention_overrides
            ]
            stats = store.stats()
            answer.update({k: stats[k] for k in ("tiers", "rollup", "buffer") if k in stats})
            for key in ("stored_bytes", "raw_horizon", "snapshot", "uri"):
                if key in stats:
                    answer[key] = stats[key]
        return answer

    async def archive(self, req: Request, who: Principal) -> Response:
        """The experiment's archive state (``archive.state.archive_state``): snapshot,
        content hash, DVC pointer, tag, pushed; ``check_remote=1`` asks the DVC remote."""
        from metricvault.archive.state import archive_state

        experiment_id = str(req.path_params["experiment_id"])
        check = req.query_params.get("check_remote", "0")
        if check not in ("0", "1"):
            raise InputError(f"check_remote={check!r} must be 0 or 1")
        settings = self.gateway.settings

        def work() -> dict[str, Any]:
            exp = self.experiment(experiment_id, who)
            state = archive_state(
                exp.id,
                settings.archive_dir,
                tag_prefix=settings.archive_tag_prefix,
                check_remote=check == "1",
                remote=settings.archive_dvc_remote or None,
            )
            return state.to_json()

        return JSONResponse(await run_in_threadpool(work))

    async def alerts(self, req: Request, who: Principal) -> Response:
        """Firing and pending alerts grouped under their root cause, and rule health."""
        return JSONResponse(await run_in_threadpool(self.alerts_for, who))

    def alerts_for(self, who: Principal) -> dict[str, Any]:
        from metricvault.server.ui_data import group_alerts, incident_labelled

        state_dir = Path(self.gateway.vault.state_dir)
        status = _read_json(state_dir / "rules-status.json")
        incidents = _read_json(state_dir / "rules-incidents.json").get("incidents", [])
        alerts = incident_labelled(status.get("alerts", []), incidents)
        settings = self.gateway.settings
        # the rules are a tenant's when they read only its series (rules_tenant); another
        # tenant sees only alerts that carry its own tenant label
        theirs = not who.tenant or who.tenant == settings.rules_tenant
        if not theirs:
            label = settings.tenant_label
            alerts = [a for a in alerts if a.get("labels", {}).get(label) == who.tenant]
        groups = status.get("groups", []) if theirs else []
        rules = [
            {
                "group": g.get("name"),
                "file": g.get("file"),
                "rule": r.get("name"),
                "type": r.get("type"),
                "health": r.get("health"),
                "last_error": r.get("lastError") or "",
                "last_evaluation": r.get("lastEvaluation"),
                "evaluation_time": r.get("evaluationTime"),
                "state": r.get("state"),
            }
            for g in groups
            for r in g.get("rules", [])
        ]
        return {"tenant": who.tenant or None, **group_alerts(alerts), "rules": rules}

    async def anomalies(self, req: Request, who: Principal) -> Response:
        from metricvault.durations import now_ms
        from metricvault.server.reads import tenant_source
        from metricvault.server.ui_data import ANOMALY_RANGES, anomalies

        span = req.query_params.get("range") or "1d"
        if span not in ANOMALY_RANGES:
            raise InputError(
                f"range={span!r} is not one of {', '.join(ANOMALY_RANGES)}: the anomalies page "
                "looks back over one of these"
            )
        width = parse_width(req.query_params.get("width"))
        raw_end = req.query_params.get("end")
        if raw_end and not raw_end.isdigit():
            raise InputError(f"end={raw_end!r} must be Unix seconds")

        def work() -> dict[str, Any]:
            end = int(raw_end) * 1000 if raw_end else now_ms()
            source = tenant_source(self.gateway, who)
            got = anomalies(source, (), end - ANOMALY_RANGES[span], end, width)
            return {"range": span, **got}

        return JSONResponse(await run_in_threadpool(work))

    # ---- pages
    async def root(self, req: Request, who: Principal) -> Response:
        return RedirectResponse("/ui/experiments", status_code=302)

    async def static(self, req: Request, who: Principal) -> Response:
        """A UI file with its ETag (content hash). Pages link each file with ``?v=<hash>``:
        such a URL never changes content, so the browser may keep it for a year without
        asking again; any other request revalidates (304 when unchanged)."""
        path = str(req.path_params["path"])
        target = (STATIC_DIR / path).resolve()
        if STATIC_DIR.resolve() not in target.parents or not target.is_file():
            raise NotFoundError(f"no UI file {path!r}")
        body, digest = static_file(target)
        media = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        etag = f'"{digest}"'
        versioned = req.query_params.get("v") == digest
        headers = {
            "ETag": etag,
            "Cache-Control": "public, max-age=31536000, immutable" if versioned else "no-cache",
        }
        if etag in [t.strip() for t in req.headers.get("if-none-match", "").split(",")]:
            return Response(status_code=304, headers=headers)
        return Response(body, media_type=media, headers=headers)

    async def experiments_page(self, req: Request, who: Principal) -> Response:
        body = (
            '<h1>Experiments</h1><form id="filters" class="filters" role="search">'
            '<label>Search <input id="q" name="q" type="search" '
            'placeholder="id, name, owner, tag, SHA"></label>'
            '<label>Tag <input id="tag" name="tag"></label>'
            '<label>Owner <input id="owner" name="owner"></label>'
            '<label>Param <input id="param" name="param" placeholder="key=value"></label>'
            '<button type="submit">Filter</button>'
            '<button type="button" id="compare-selected">Compare selected</button></form>'
            '<p id="count" aria-live="polite"></p>'
            # virtualised by the script: only the rows in view, the filler below the rest
            '<div class="scroll table-scroll" id="table-scroll" tabindex="0" role="region" '
            'aria-label="experiments (arrow keys, Page Up/Down, Home/End move between rows)">'
            '<table id="experiments" class="data"><thead><tr><th></th>'
            + "".join(
                f'<th><button type="button" class="sort" data-sort="{c}">{esc(h)}</button></th>'
                if c in SORTABLE
                else f"<th>{esc(h)}</th>"
                for c, h in TABLE_HEADERS
            )
            + '</tr></thead><tbody></tbody></table><div id="table-filler"></div></div>'
            '<nav class="pager"><button type="button" id="prev">Page up</button>'
            '<button type="button" id="next">Page down</button></nav>'
        )
        return page("experiments", "Experiments", body)

    async def experiment_page(self, req: Request, who: Principal) -> Response:
        experiment_id = str(req.path_params["experiment_id"])
        exp = await run_in_threadpool(self.experiment, experiment_id, who)
        record = exp.to_record()
        fields = ("name", "owner", "start", "end", "git_repo", "git_sha", "tags", "notes")
        rows = "".join(
            f"<tr><th>{esc(f)}</th><td>{esc(_shown(record.get(f)))}</td></tr>" for f in fields
        )
        params = "".join(
            f"<tr><th>{esc(k)}</th><td>{esc(_text(v))}</td></tr>"
            for k, v in sorted(exp.params.items())
        )
        body = (
            f"<h1>Experiment <code>{esc(exp.id)}</code></h1>"
            f'<div class="cols"><section><h2>Record</h2><table class="kv" id="record">{rows}'
            f"</table></section><section><h2>Params</h2>"
            f'<table class="kv" id="params">{params or "<tr><td>no params</td></tr>"}'
            f"</table></section></div><h2>Archive</h2>"
            f'<div id="archive" data-experiment="{esc(exp.id)}" aria-live="polite"></div>'
            "<h2>Training curves</h2>"
            '<form class="filters"><label>Curves by <select id="curve-align" name="align">'
            '<option value="step">training step</option>'
            '<option value="elapsed">elapsed time (hours since start)</option>'
            '<option value="time">wall time (UTC)</option></select></label></form>'
            f'<div id="charts" data-experiment="{esc(exp.id)}"></div>'
            "<h2>GPUs over the run</h2>"
            f'<div id="gpu-charts" data-experiment="{esc(exp.id)}"></div>'
            f'<p><a href="/ui/compare?ids={esc(exp.id)}">Compare with others</a></p>'
        )
        return page("experiment", f"Experiment {exp.id}", body)

    async def compare_page(self, req: Request, who: Principal) -> Response:
        body = (
            "<h1>Compare</h1>"
            '<form id="compare-form" class="filters"><label>Experiments '
            '<input id="ids" name="ids" placeholder="id,id,..."></label>'
            '<label>Metric <input id="metric" name="metric" value="train_loss"></label>'
            '<label>Align by <select id="align" name="align">'
            '<option value="step">training step</option>'
            '<option value="elapsed">elapsed time (hours since start)</option>'
            '<option value="time">wall time (UTC)</option></select></label>'
            '<label>EMA smoothing <input id="smoothing" name="smoothing" type="range" '
            'min="0" max="0.99" step="0.01" value="0"></label>'
            '<output id="smoothing-value">0</output>'
            '<button type="submit">Compare</button></form>'
            '<p id="share">Shareable link: <a id="share-link" href="#"></a></p>'
            '<div id="compare-chart" class="chart"></div>'
            '<h2>Summary</h2><table id="summaries" class="data"></table>'
            '<h2>Params</h2><table id="param-table" class="data"></table>'
        )
        return page("compare", "Compare", body)

    async def explore_page(self, req: Request, who: Principal) -> Response:
        ranges = ("15m", "1h", "6h", "1d", "7d", "30d", "90d", "1y", "3y")
        options = "".join(f'<option value="{r}">{r}</option>' for r in ranges)
        body = (
            "<h1>Explore</h1>"
            '<form id="explore-form" class="filters"><div class="wide completing">'
            '<label>PromQL <input id="expr" name="expr" autocomplete="off" spellcheck="false" '
            'role="combobox" aria-autocomplete="list" aria-controls="suggest" '
            'aria-expanded="false" '
            'placeholder="rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m])"></label>'
            '<ul id="suggest" class="suggest" role="listbox" aria-label="completions" hidden>'
            "</ul></div>"
            f'<label>Range <select id="range" name="range">{options}</select></label>'
            '<button type="submit">Run</button>'
            '<a id="csv" href="#" download="query.csv">Download CSV</a></form>'
            '<p id="query-info" aria-live="polite"></p><p id="served-by" aria-live="polite"></p>'
            '<ul id="warnings" class="warnings"></ul>'
            '<div id="explore-chart" class="chart"></div>'
            '<div class="scroll"><table id="explore-table" class="data"></table></div>'
        )
        return page("explore", "Explore", body)

    async def alerts_page(self, req: Request, who: Principal) -> Response:
        from metricvault.server.ui_data import ANOMALY_RANGES

        options = "".join(
            f'<option value="{r}"{" selected" if r == "1d" else ""}>{r}</option>'
            for r in ANOMALY_RANGES
        )
        body = (
            "<h1>Alerts</h1><h2>Firing and pending</h2>"
            '<p id="alert-summary" aria-live="polite"></p><div id="incidents"></div>'
            '<h3>Not in an incident</h3><table id="alerts" class="data"></table>'
            '<h2>Rule health</h2><table id="rules" class="data"></table>'
            '<h2>Anomalies</h2><form id="anomaly-form" class="filters">'
            f'<label>Over the last <select id="anomaly-range" name="range">{options}</select>'
            '</label><button type="submit">Show</button></form>'
            '<p id="anomaly-info" aria-live="polite"></p>'
            '<div id="anomaly-score-chart" class="chart"></div>'
            '<div id="anomaly-charts"></div>'
            '<table id="anomaly-table" class="data"></table>'
        )
        return page("alerts", "Alerts", body)

    async def vault_page(self, req: Request, who: Principal) -> Response:
        body = (
            '<h1>Vault</h1><div id="storage"></div>'
            '<h2>Agents seen</h2><table id="agents" class="data"></table>'
            '<h2>Retention</h2><table id="retention" class="data"></table>'
            '<h2>Ingest</h2><p id="ingest-rate" aria-live="polite"></p>'
            '<table id="ingest" class="data"></table>'
            '<h2>Cardinality: series per metric</h2><table id="cardinality" class="data"></table>'
            '<div class="cols"><section><h2>Series per label</h2>'
            '<table id="label-cardinality" class="data"></table></section>'
            '<section><h2>Top label values</h2><table id="top-values" class="data"></table>'
            "</section></div>"
        )
        return page("vault", "Vault", body)


TOP_LABELS = 20


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON file the rule evaluator writes; {} while there is none (or mid-replace)."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def label_cardinality(frame: Any, skip: Sequence[str]) -> dict[str, Any]:
    """What vmui's cardinality explorer shows: per label name the series that carry it and
    its distinct values (most series first), and the label values in most series. ``frame``
    is the series listing (one row per series, one column per label; missing: NaN/empty)."""
    labels: list[dict[str, Any]] = []
    values: list[dict[str, Any]] = []
    for name in frame.columns if len(frame) else []:
        if name in skip:
            continue
        column = frame[name]
        present = column[column.notna() & (column.astype(str) != "")].astype(str)
        if not len(present):
            continue
        counts = present.value_counts()
        labels.append({"label": str(name), "series": len(present), "values": len(counts)})
        values += [
            {"label": str(name), "value": str(v), "series": int(n)}
            for v, n in counts.head(TOP_LABELS).items()
        ]
    labels.sort(key=lambda r: (-r["series"], -r["values"], r["label"]))
    values.sort(key=lambda r: (-r["series"], r["label"], r["value"]))
    return {"labels": labels[:TOP_LABELS], "top_values": values[:TOP_LABELS]}


TABLE_HEADERS = (
    ("id", "id"),
    ("owner", "owner"),
    ("team", "team"),
    ("start", "start"),
    ("end", "end"),
    ("duration_h", "hours"),
    ("gpus", "GPUs"),
    ("gpu_hours", "GPU-h"),
    ("energy_kwh", "kWh"),
    ("final_loss", "final loss"),
    ("mfu_mean", "mean MFU"),
    ("git_sha", "git SHA"),
    ("tags", "tags"),
)


def _shown(value: Any) -> str:
    if value is None:
        return "running"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def history_curves(vault: Any, exp: Experiment, names: Sequence[str], width: int) -> dict[str, Any]:
    """Each metric by training step, downsampled to ``width`` pixel columns; metrics the
    experiment has no samples of are listed in ``missing`` (not an error: a run logs what it
    logs)."""
    from metricvault.archive.compare import history

    metrics: dict[str, dict[str, Any]] = {}
    missing: list[str] = []
    try:  # all at once (the step series read once); one by one where one of them is missing
        together = history(vault, exp, names)
    except NotFoundError:
        together = None
    for name in names:
        try:
            # a metric's own frame is its column of the joint one without the rows where it
            # has no sample (downsampling leaves NaN out; the points are the non-NaN ones)
            frame = together[[name]] if together is not None else history(vault, exp, [name])
        except NotFoundError as exc:
            if "train_step" in str(exc) and "cannot be placed by step" in str(exc):
                return {
                    "experiment": exp.id,
                    "metrics": {},
                    "missing": list(names),
                    "why": str(exc),
                }
            missing.append(name)
            continue
        column = frame[name]
        x, y = downsample(frame.index.to_numpy(dtype=np.float64), column.to_numpy(), width)
        metrics[name] = {
            "x": [finite(float(v)) for v in x],
            "y": [finite(float(v)) for v in y],
            "points": int(column.notna().sum()),
        }
    return {"experiment": exp.id, "metrics": metrics, "missing": missing}


GPU_METRICS = (
    ("DCGM_FI_DEV_GPU_UTIL", "utilisation (%)"),
    ("DCGM_FI_DEV_FB_USED", "memory used (MiB)"),
    ("DCGM_FI_DEV_POWER_USAGE", "power (W)"),
    ("DCGM_FI_DEV_GPU_TEMP", "temperature (°C)"),
)
RAW_GPU_SPAN_MS = 6 * 3_600_000  # longer runs are read as 1m means (then min/max per pixel)


def gpu_line_name(labels: dict[str, Any]) -> str:
    """A GPU's name on the chart: host and GPU index where the series has them."""
    host = labels.get("Hostname") or labels.get("instance") or labels.get("host") or ""
    gpu = labels.get("gpu")
    if gpu not in (None, ""):
        return f"{host} gpu {gpu}".strip()
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "all"


def gpu_curves(vault: Any, exp: Experiment, width: int, now: int) -> dict[str, Any]:
    """Per-GPU utilisation, memory, power and temperature over the run's window, one line
    per GPU series (x: Unix seconds, shared; null where a GPU has no point), each line
    downsampled to ``width`` pixel columns (min and max kept). Metrics the run's selector
    has no series of are listed in ``missing``. The four metrics come from one read (Arrow,
    rows ordered by series and time), split into series in numpy."""
    from metricvault.archive.compare import restrict

    start, end = exp.window(now)
    bucket = None if end - start <= RAW_GPU_SPAN_MS else "1m"
    value = "value" if bucket is None else "mean"
    parts = [restrict(exp.selector, name) for name, _ in GPU_METRICS]
    sel = " or ".join(p for p in parts if p)
    table = vault.query(sel, start, end, step=bucket, output="arrow") if sel else None
    by_metric: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {}
    if table is not None and table.num_rows:
        for metric, labels, ms, ys in _series_of(table, value):
            x, y = downsample(ms.astype(np.float64), ys, width)
            by_metric.setdefault(metric, []).append((gpu_line_name(labels), x, y))
    metrics: dict[str, Any] = {}
    missing: list[str] = []
    for name, unit in GPU_METRICS:
        lines = by_metric.get(name)
        if not lines:
            missing.append(name)
            continue
        xs = np.unique(np.concatenate([x for _, x, _ in lines]))
        out_lines = []
        for label, x, y in lines:
            column = np.full(xs.size, np.nan)
            column[np.searchsorted(xs, x)] = y
            out_lines.append({"label": label, "y": _json_floats(column)})
        metrics[name] = {
            "unit": unit,
            "x": (xs / 1000).tolist(),
            "lines": out_lines,
            "resolution": bucket or "raw",
        }
    return {"experiment": exp.id, "metrics": metrics, "missing": missing}


def _series_of(table: Any, value: str) -> list[tuple[str, dict[str, str], np.ndarray, np.ndarray]]:
    """``vault.query``'s long Arrow table (rows ordered by series, then time) as (metric,
    labels, ms, values) per series; a series is a run of rows with the same metric and
    labels. Labels holding no text are left out (as the pandas path did)."""
    import pyarrow.compute as pc

    keys = [c for c in table.column_names if c not in ("timestamp", value)]
    codes = []
    for key in keys:
        encoded = pc.dictionary_encode(table[key]).combine_chunks()
        codes.append(encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False))
    n = table.num_rows
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for code in codes:
        change[1:] |= code[1:] != code[:-1]
    starts = np.flatnonzero(change)
    ms = table["timestamp"].cast("int64").to_numpy()
    ys = table[value].to_numpy(zero_copy_only=False).astype(np.float64)
    first_rows = table.take(pa_indices(starts)).select(keys).to_pylist()
    out = []
    for first, a, b in zip(first_rows, starts.tolist(), [*starts[1:].tolist(), n], strict=True):
        metric = str(first.pop("metric", "") or "")
        labels = {k: v for k, v in first.items() if isinstance(v, str) and v}
        out.append((metric, labels, ms[a:b], ys[a:b]))
    return out


def pa_indices(values: np.ndarray) -> Any:
    import pyarrow as pa

    return pa.array(values, pa.int64())


def _json_floats(values: np.ndarray) -> list[float | None]:
    """Floats for JSON, NaN and infinities as null (what :func:`finite` does per value)."""
    out: list[float | None] = values.tolist()
    for i in np.flatnonzero(~np.isfinite(values)).tolist():
        out[i] = None
    return out


X_LABELS = {"step": "training step", "elapsed": "hours since start", "time": "time (UTC)"}


def time_curves(
    vault: Any, exps: Sequence[Experiment], metric: str, align: str, width: int
) -> dict[str, dict[str, Any] | None]:
    """Each experiment's ``metric`` by hours since its start (``elapsed``) or by wall-clock
    time (``time``, x in Unix seconds), as ``experiment compare --align`` computes it: the
    mean over the run's series per bucket, one bucket width for all the runs (raw samples
    for short runs, 1m or 1h buckets for long ones); then downsampled to ``width`` pixel
    columns. A run without the metric in its window is None (not an error)."""
    import pandas as pd

    from metricvault.archive.compare import _resolution, curves

    resolution = _resolution(exps, "auto") or "raw"
    runs: Any = exps  # curves() takes ids or the records themselves (tenant-confined here)
    out: dict[str, dict[str, Any] | None] = {}
    for exp in runs:
        try:
            frame = curves(vault, [exp], metric, align=align, step=resolution)
        except NotFoundError:
            out[exp.id] = None
            continue
        xs = frame["x"]
        if align == "time":
            since = pd.to_datetime(xs, utc=True) - pd.Timestamp(0, tz="UTC")
            ms = (since // pd.Timedelta(milliseconds=1)).to_numpy(dtype=np.int64)
            x = ms / 1000.0  # whole milliseconds in Unix seconds, as query_range writes them
        else:
            x = xs.to_numpy(dtype=np.float64)
        order = np.argsort(x, kind="stable")
        values = frame["value"].to_numpy(dtype=np.float64)[order]
        dx, dy = downsample(x[order], values, width)
        out[exp.id] = {
            "x": [finite(float(v)) for v in dx],
            "y": [finite(float(v)) for v in dy],
            "points": int(np.isfinite(values).sum()),
        }
    return out


_STATIC: dict[Path, tuple[tuple[int, int], bytes, str]] = {}


def static_file(target: Path) -> tuple[bytes, str]:
    """A static file's bytes and content hash, kept while its mtime and size stay."""
    st = target.stat()
    stamp = (st.st_mtime_ns, st.st_size)
    found = _STATIC.get(target)
    if found is None or found[0] != stamp:
        body = target.read_bytes()
        found = (stamp, body, hashlib.sha256(body).hexdigest()[:16])
        _STATIC[target] = found
    return found[1], found[2]


def static_url(path: str) -> str:
    """``/ui/static/<path>?v=<content hash>``: a URL the browser may cache for good."""
    return f"/ui/static/{path}?v={static_file((STATIC_DIR / path).resolve())[1]}"


def inline_style(path: str) -> str:
    """A static stylesheet's text, for a ``<style>`` element (kept as :func:`static_file`)."""
    return static_file((STATIC_DIR / path).resolve())[0].decode("utf-8")


def page(name: str, title: str, body: str) -> HTMLResponse:
    """One page: the layout, the navigation (the current page marked), ``body`` (already
    escaped by its builder) and the script, which reads ``data-page``."""
    current = ' aria-current="page"'
    nav = "".join(
        f'<a href="/ui/{p}"{current if p == name else ""}>{esc(label)}</a>' for p, label in PAGES
    )
    text = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · metricvault</title>"
        # no icon: the browser's /favicon.ico request would wait beside the page's data
        '<link rel="icon" href="data:,">'
        # the stylesheets in the page: its first paint waits for no other response
        f"<style>{inline_style('vendor/uplot/uPlot.min.css')}</style>"
        f"<style>{inline_style('ui.css')}</style>"
        f'<script src="{static_url("vendor/uplot/uPlot.iife.min.js")}" defer></script>'
        f'<script src="{static_url("ui.js")}" defer></script></head>'
        f'<body data-page="{esc(name)}"><header><a class="brand" href="/ui/experiments">'
        f'metricvault</a><nav aria-label="pages">{nav}</nav>'
        # shown by the script while a login session is open (its CSRF cookie is readable)
        '<form id="logout" method="post" action="/ui/logout" hidden>'
        '<button type="submit">Log out</button></form></header>'
        f'<main id="main"><p id="error" class="error" role="alert" hidden></p>{body}</main>'
        "</body></html>"
    )
    return HTMLResponse(text)
