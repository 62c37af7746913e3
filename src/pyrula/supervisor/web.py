"""The fleet's health port: the probes, and the dashboard where ``pyrula[http]`` is installed.

With Starlette and uvicorn importable, the port is served by uvicorn in the supervisor's
own event loop (``Server.startup`` on a socket bound here, no thread, no signal handlers of
its own: the supervisor keeps its signals): the probe routes answer exactly as the
hand-written server does (same codes, same bodies), the dashboard's page is at ``/`` and
its assets and JSON routes under ``/dashboard``. Without them the hand-written server
(``pyrula.health_http``) serves the probes, and ``/`` says how to get the dashboard.

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
        use fails the fleet before it forks anything, while serving it (``start``: the
        dashboard's imports) waits until the children are on their way. A probe that
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
        config = uvicorn.Config(self.app(sampler), lifespan="off", log_config=None,
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

    def app(self, sampler: Any) -> Any:
        """The Starlette app of the port: the probes, the dashboard's page and routes."""
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import BaseRoute, Mount, Route

        from pyrula.dashboard.app import Dashboard, page_response

        probes = probe_routes(self.supervisor)
        actions = self.supervisor.options.dashboard_actions
        dashboard = Dashboard(self.supervisor.store, actions=actions,
                              status=self.supervisor.status, series=sampler.series,
                              names=self.supervisor.served_workflows)

        def answer(status: int, body: Any) -> Response:
            if isinstance(body, str):
                return Response(body.encode(), status, media_type=PROMETHEUS_TEXT)
            return Response(json.dumps(body).encode(), status, media_type="application/json")

        def route(path: str, handler: Handler) -> Route:
            async def endpoint(request: Request) -> Response:
                try:
                    status, body = await handler()
                except Exception:  # a probe must answer, whatever broke
                    logger.exception("probe handler for %s failed", path)
                    status, body = 500, {"status": "error"}
                return answer(status, body)

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
