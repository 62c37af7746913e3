"""The fleet's health port: the probes, and the dashboard where ``pyrula[http]`` is installed.

With Starlette and uvicorn importable, the port is served by uvicorn in the supervisor's
own event loop (``Server.startup`` on a socket bound here, no thread, no signal handlers of
its own: the supervisor keeps its signals): the probe routes answer exactly as the
hand-written server does (same codes, same bodies), the dashboard's page is at ``/`` and
its assets and JSON routes under ``/dashboard``. Without them the hand-written server
(``pyrula.health_http``) serves the probes, and ``/`` says how to get the dashboard.

A fleet starts while its children take their first runs, often under a backlog: the
port's ``GET`` probes are answered by a few lines of ASGI here, and the dashboard's
Starlette app (its imports: Starlette, the dashboard, the client) is built at the first
request for anything else, not at the start, where it cost the two cores ~0.1 s in the
first second of a fleet's work.

A second-by-second sampler of the fleet's counters feeds the dashboard's charts; it runs
only while the dashboard is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from pyrula.health_http import Handler, ProbeServer
from pyrula.logs import FLEET_LOGGER
from pyrula.supervisor.health import probe_routes, probe_server
from pyrula.supervisor.supervisor import Supervisor

logger = logging.getLogger(FLEET_LOGGER)

#: Where the dashboard's assets and JSON routes are mounted on the health port.
DASHBOARD_PREFIX = "/dashboard"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def dashboard_installed() -> bool:
    """Whether Starlette and uvicorn (``pyrula[http]``) can be imported here."""
    try:
        return all(importlib.util.find_spec(name) is not None
                   for name in ("starlette", "uvicorn"))
    except (ImportError, ValueError):  # an import hook that refuses them
        return False


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (raises OSError as asyncio's server does)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=100)


class HealthPort:
    """The server of the fleet's health port, whichever it is."""

    def __init__(self, supervisor: Supervisor, host: str, port: int,
                 with_dashboard: bool | None = None) -> None:
        self.supervisor = supervisor
        self.host = host
        self.port = port
        self.dashboard = dashboard_installed() if with_dashboard is None else with_dashboard
        self._probes: ProbeServer | None = None
        self._server: Any = None
        self._socket: socket.socket | None = None
        self._sampler: asyncio.Task[None] | None = None

    def bind(self) -> tuple[str, int]:
        """Take the port now (raises OSError if it cannot be had): cheap, so that a port in
        use fails the fleet before it forks anything, while serving it (``start``: uvicorn's
        imports) waits until the children are on their way. A probe that
        connects meanwhile waits in the socket's backlog, it is not refused."""
        if self._socket is None:
            self._socket = listen(self.host, self.port)
        name = self._socket.getsockname()
        return str(name[0]), int(name[1])

    async def start(self) -> tuple[str, int]:
        """Serve the port (binding it first if ``bind`` was not called)."""
        address = self.bind()
        if not self.dashboard:
            self._probes = probe_server(self.supervisor, self.host, self.port)
            return await self._probes.start(self._socket)
        import uvicorn

        from pyrula.dashboard.series import Sampler

        sampler = Sampler(self.supervisor.families)
        probes = probe_routes(self.supervisor)
        app = PortApp(probes, lambda: self.app(sampler, probes))
        config = uvicorn.Config(app, lifespan="off", log_config=None,
                                access_log=False, date_header=False, server_header=False,
                                timeout_graceful_shutdown=1, ws="none")
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        assert self._socket is not None  # bound above
        await server.startup(sockets=[self._socket])
        self._server = server
        self._sampler = asyncio.get_running_loop().create_task(sampler.run(),
                                                               name="dashboard-sampler")
        return address

    def app(self, sampler: Any, probes: dict[str, Handler]) -> Any:
        """The Starlette app of the port: the probes, the dashboard's page and routes."""
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import BaseRoute, Mount, Route

        from pyrula.dashboard.app import Dashboard, page_response

        actions = self.supervisor.options.dashboard_actions
        dashboard = Dashboard(self.supervisor.store, actions=actions,
                              status=self.supervisor.status, series=sampler.series,
                              names=self.supervisor.served_workflows)

        def answer(status: int, body: Any) -> Response:
            payload, media_type = encoded(body)
            return Response(payload, status, media_type=media_type)

        def route(path: str, handler: Handler) -> Route:
            async def endpoint(request: Request) -> Response:
                return answer(*await answered(path, handler))

            return Route(path, endpoint, methods=["GET"])

        async def index(request: Request) -> Response:
            return page_response(DASHBOARD_PREFIX + "/", actions, True)

        async def refused(request: Request, exc: Exception) -> Response:
            code = exc.status_code if isinstance(exc, HTTPException) else 500
            if code == 405:
                return answer(405, {"status": "method_not_allowed"})
            return answer(404, {"status": "not_found", "routes": ",".join(probes)})

        routes: list[BaseRoute] = [route(path, handler) for path, handler in probes.items()]
        routes += [Route("/", index, methods=["GET"]), Mount(DASHBOARD_PREFIX, app=dashboard)]
        return Starlette(routes=routes, exception_handlers={HTTPException: refused})

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            await asyncio.gather(self._sampler, return_exceptions=True)
        if self._probes is not None:
            await self._probes.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.shutdown(), 2.0)
            self._server = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def encoded(body: Any) -> tuple[bytes, str]:
    """A probe's answer as (bytes, media type): text is the Prometheus exposition, anything
    else JSON."""
    if isinstance(body, str):
        return body.encode(), PROMETHEUS_TEXT
    return json.dumps(body).encode(), "application/json"


async def answered(path: str, handler: Handler) -> tuple[int, Any]:
    """(status, body) of a probe: a probe must answer, whatever broke (500)."""
    try:
        return await handler()
    except Exception:
        logger.exception("probe handler for %s failed", path)
        return 500, {"status": "error"}


class PortApp:
    """The port's ASGI app: a ``GET`` of a probe answered here, anything else handed to the
    app ``build`` returns, built at the first such request (the dashboard's imports are
    not on the way to a fleet's first runs, nor on a probe's)."""

    def __init__(self, probes: dict[str, Handler], build: Callable[[], Any]) -> None:
        self._probes = probes
        self._build: Callable[[], Any] | None = build
        self._app: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        path = scope.get("path", "")
        handler = self._probes.get(path) if scope.get("method") == "GET" else None
        if handler is not None and scope["type"] == "http":
            status, body = await answered(path, handler)
            payload, media_type = encoded(body)
            await send({"type": "http.response.start", "status": status, "headers": [
                (b"content-length", str(len(payload)).encode()),
                (b"content-type", media_type.encode()),
            ]})
            await send({"type": "http.response.body", "body": payload})
            return
        await self.dashboard()(scope, receive, send)

    def dashboard(self) -> Any:
        """The app of every other request, built the first time."""
        if self._app is None:
            assert self._build is not None
            self._app, self._build = self._build(), None
        return self._app
