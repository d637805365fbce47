"""The experiments API: ``GET /api/v1/experiments[/{id}]``, ``POST /api/v1/experiments``,
``PATCH /api/v1/experiments/{id}`` — the registry over HTTP, for training jobs that reach only
the gateway — with a typed request schema and tenant scoping.

A request body is checked field by field against :data:`FIELDS` (unknown field, wrong type:
400 naming it), so nothing the client sends reaches the registry as an unchecked keyword
(``now`` or ``created_ms`` cannot forge the creation time). A credential with a tenant sees,
creates and changes only its tenant's experiments, and every selector it stores is confined
to its tenant: ``tenant_label="<tenant>"`` is ANDed into each ``or`` part, so the experiment
cannot reach another tenant's series.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from metricvault.credentials import Principal
from metricvault.errors import InputError, NotFoundError
from metricvault.experiment import EDITABLE, Experiment, unknown_message
from metricvault.selector import Matcher, Selector, SelectorUnion, parse_selectors
from metricvault.server.api import ServerAPI

if TYPE_CHECKING:
    from metricvault.server.app import Gateway

_TIME = "a time (ISO 8601 string, epoch milliseconds or a relative time like '-1h')"
# field -> (accepted JSON types, how the error names them)
FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "id": ((str,), "a string (a slug such as 'llama-70b-r3')"),
    "selector": ((str,), "a string (a PromQL series selector)"),
    "name": ((str,), "a string"),
    "start": ((str, int, float), _TIME),
    "end": ((str, int, float, type(None)), _TIME + " or null (running)"),
    "git_repo": ((str,), "a string"),
    "git_sha": ((str,), "a string (a commit id)"),
    "owner": ((str,), "a string"),
    "tags": ((list,), "a list of strings"),
    "notes": ((str,), "a string"),
    "params": ((dict,), "a JSON object"),
}
CREATE_FIELDS = tuple(FIELDS)
UPDATE_FIELDS = EDITABLE


def checked_fields(body: dict[str, Any], allowed: tuple[str, ...]) -> dict[str, Any]:
    """The fields of a request body, each of a known name and type, else InputError."""
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise InputError(
            f"unknown experiment field(s) {', '.join(map(repr, unknown))}; the fields are "
            f"{', '.join(allowed)}"
        )
    fields: dict[str, Any] = {}
    for name, value in body.items():
        types, expected = FIELDS[name]
        # JSON true/false arrive as bool, a subclass of int: never a time
        if isinstance(value, bool) or not isinstance(value, types):
            raise InputError(
                f"experiment field {name!r} must be {expected}, got {type(value).__name__} "
                f"{str(value)[:60]!r}"
            )
        if isinstance(value, list):  # tags
            if not all(isinstance(tag, str) for tag in value):
                raise InputError(f"experiment field 'tags' must be {expected}, got {value!r:.80}")
            value = tuple(value)
        fields[name] = value
    return fields


def confine(selector: str, label: str, tenant: str) -> str:
    """``selector`` with ``label="tenant"`` ANDed into every ``or`` part (none: unchanged)."""
    if not tenant:
        return selector
    own = Matcher(label, "=", tenant)
    parts = [
        p if own in p.matchers else Selector((*p.matchers, own))
        for p in parse_selectors(selector).parts
    ]
    return str(SelectorUnion(tuple(parts)))


def visible(experiments: list[Experiment], tenant: str) -> list[Experiment]:
    return [e for e in experiments if e.tenant == tenant]


def own(exp: Experiment, tenant: str, ids: list[str]) -> Experiment:
    """``exp`` if it belongs to ``tenant``; otherwise 404 exactly as for an unknown id (the
    answer must not tell another tenant's ids from free ones)."""
    if exp.tenant != tenant:
        raise NotFoundError(unknown_message(exp.id, ids, "this gateway"))
    return exp


class ExperimentsAPI(ServerAPI):
    name = "experiments"
    summary = "`GET`/`POST /api/v1/experiments`, `GET`/`PATCH /api/v1/experiments/{id}`"

    def routes(self, gateway: Gateway) -> list[Route]:
        endpoint = Experiments(gateway).answer
        return [
            Route("/api/v1/experiments", endpoint, methods=["GET", "POST"]),
            Route("/api/v1/experiments/{experiment_id}", endpoint, methods=["GET", "PATCH"]),
        ]


API = ExperimentsAPI()


class Experiments:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def answer(self, request: Request) -> Response:
        """``POST``: a new record (id, selector and the optional fields); ``PATCH``: the
        changed fields. Errors answer with the registry's own status and message."""
        return await self.gateway.handle(request, "/api/v1/experiments", self.work)

    async def work(self, req: Request, who: Principal) -> Response:
        registry, tenant = self.gateway.vault.experiments, who.tenant
        label = self.gateway.settings.tenant_label
        experiment_id = req.path_params.get("experiment_id")
        if req.method == "GET" and experiment_id is None:
            records = visible(await run_in_threadpool(registry.list), tenant)
            return JSONResponse([e.to_record() for e in records])
        if req.method == "POST":
            fields = checked_fields(await self.json_body(req), CREATE_FIELDS)
            new_id, selector = fields.pop("id", None), fields.pop("selector", None)
            if new_id is None or selector is None:
                raise InputError("a new experiment needs 'id' and 'selector' (strings)")
            selector = confine(selector, label, tenant)
            exp = await run_in_threadpool(
                lambda: registry.create(new_id, selector, tenant=tenant, **fields)
            )
            return JSONResponse(exp.to_record(), status_code=201)
        # the body first: an oversized one is 413 whoever owns the id
        changes = {} if req.method == "GET" else await self.json_body(req)
        exp = await run_in_threadpool(self.owned_experiment, str(experiment_id), tenant)
        if req.method == "GET":
            return JSONResponse(exp.to_record())
        changes = checked_fields(changes, UPDATE_FIELDS)
        if "selector" in changes:
            changes["selector"] = confine(changes["selector"], label, tenant)
        exp = await run_in_threadpool(lambda: registry.update(exp.id, **changes))
        return JSONResponse(exp.to_record())

    async def json_body(self, request: Request) -> dict[str, Any]:
        try:
            fields = json.loads(await self.gateway.body(request) or b"{}")
        except json.JSONDecodeError as exc:
            raise InputError(f"the request body is not JSON: {exc}") from exc
        if not isinstance(fields, dict):
            raise InputError("the request body must be a JSON object of experiment fields")
        return fields

    def owned_experiment(self, experiment_id: str, tenant: str) -> Experiment:
        """The experiment if ``tenant`` owns it; another tenant's answers 404 exactly as an
        unknown id does, listing only the caller's ids (blocking)."""
        registry = self.gateway.vault.experiments
        try:
            exp = registry.get(experiment_id)
            if exp.tenant == tenant:
                return exp
        except NotFoundError:
            pass
        ids = [e.id for e in visible(registry.list(), tenant)]
        raise NotFoundError(unknown_message(experiment_id, ids, "this gateway"))
