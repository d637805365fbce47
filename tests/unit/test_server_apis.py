"""The server package: each API module registers its own routes and background tasks, the
app mounts every API listed in ``server/apis.py``, and ``serve --help`` names each route."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
import re

from starlette.responses import PlainTextResponse
from starlette.routing import Route
from typer.testing import CliRunner

import metricvault.server
from metricvault.cli.main import app as cli
from metricvault.config import BearerToken
from metricvault.credentials import hash_secret
from metricvault.server import apis
from metricvault.server.api import ServerAPI


def _api_modules() -> dict[str, ServerAPI]:
    found = {}
    for info in pkgutil.iter_modules(metricvault.server.__path__):
        module = importlib.import_module(f"metricvault.server.{info.name}")
        if isinstance(getattr(module, "API", None), ServerAPI):
            found[info.name] = module.API
    return found


def test_every_api_module_is_mounted():
    modules = _api_modules()
    assert modules, "no module of metricvault.server exposes an API"
    missing = sorted(name for name, api in modules.items() if api not in apis.APIS)
    assert not missing, f"API modules not listed in server/apis.py APIS: {missing}"


def test_each_route_belongs_to_exactly_one_api(make_client):
    client, _ = make_client()
    served = [r.path for r in client.app.routes]
    assert len(served) == len(set(served)), "a path is registered twice"
    gateway = client.app.state.gateway
    from_apis = [r.path for api in apis.APIS for r in api.routes(gateway)]
    assert served == from_apis


def test_serve_help_names_every_route(make_client):
    client, _ = make_client()
    result = CliRunner().invoke(cli, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for route in client.app.routes:
        # path parameters are written <name> in the help: /api/v1/label/<name>/values
        pattern = re.escape(re.sub(r"\{[^}]*\}", "\0", route.path)).replace("\0", "<[a-z_]+>")
        assert re.search(pattern, text), f"serve --help does not name {route.path}"


class _EchoAPI(ServerAPI):
    """An API added as a module would add one: a route and a background task."""

    name = "echo"

    def __init__(self) -> None:
        self.ticks = 0

    def routes(self, gateway):
        async def echo(request):
            return await gateway.handle(request, "/echo", self.answer)

        return [Route("/echo", echo, methods=["GET"])]

    async def answer(self, request, who):
        return PlainTextResponse(f"echo for tenant {who.tenant!r}, ticks {self.ticks}")

    def background_tasks(self, gateway):
        async def tick():
            while True:
                self.ticks += 1
                await asyncio.sleep(0.01)

        return [tick]


def test_a_new_api_is_mounted_with_its_routes_and_tasks_without_editing_create_app(
    make_client, monkeypatch
):
    echo = _EchoAPI()
    monkeypatch.setattr("metricvault.server.app.APIS", (*apis.APIS, echo))
    client, _ = make_client(auth_bearer_tokens=(BearerToken(hash_secret("t0k"), "acme"),))
    assert client.get("/echo").status_code == 401  # the gateway's auth applies to it
    for _ in range(1000):  # its background task runs: wait for the state, not a time
        if echo.ticks:
            break
        client.get("/-/healthy")
    response = client.get("/echo", headers={"Authorization": "Bearer t0k"})
    assert response.status_code == 200
    assert "tenant 'acme'" in response.text
    assert echo.ticks > 0
