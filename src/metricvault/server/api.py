"""What one API of the server is: the routes it answers and the background tasks it runs.

Each API module exposes one :class:`ServerAPI` object; :data:`metricvault.server.apis.APIS`
lists them and ``create_app`` mounts each, so adding an API is adding a module (and its line
in that list), never editing ``create_app``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from starlette.routing import Route

if TYPE_CHECKING:
    from metricvault.server.app import Gateway

BackgroundTask = Callable[[], Coroutine[Any, Any, None]]


class ServerAPI:
    """One API: ``name`` and ``summary`` say what it serves (``serve --help``, the docs);
    :meth:`routes` and :meth:`background_tasks` are called once per app, with its gateway."""

    name = ""
    summary = ""

    def routes(self, gateway: Gateway) -> list[Route]:
        return []

    def background_tasks(self, gateway: Gateway) -> list[BackgroundTask]:
        return []
