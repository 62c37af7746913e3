"""A minimal asyncio HTTP/1.1 server for probes: GET only, JSON or text bodies.

Shared by the worker and the fleet supervisor (which must not import the engine), so it
imports nothing of pyrula.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger(__name__)

#: A route returns (HTTP status, body); a dict/list body is sent as JSON, a str as text.
Handler = Callable[[], Awaitable[tuple[int, Any]]]

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable",
            500: "Internal Server Error", 400: "Bad Request"}


def bind_failure(host: str, port: int, exc: OSError) -> str:
    """Why the probes cannot listen on ``host``:``port``, and what to do, in one line."""
    if exc.errno == errno.EADDRINUSE:
        return (f"health port {port} is already in use on {host}: pick another --health-port "
                "or stop what holds it")
    if exc.errno == errno.EACCES:
        return (f"health port {port} on {host} needs privileges this process lacks: pick a "
                "port above 1023 with --health-port")
    return (f"cannot listen on {host}:{port} ({exc.strerror or exc}): check --health-host, "
            "or pick another --health-port")


class ProbeServer:
    def __init__(self, routes: dict[str, Handler], host: str, port: int,
                 index: Handler | None = None) -> None:
        self.routes = routes
        #: What ``/`` answers, if anything (not listed among the routes of a 404).
        self.index = index
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self.address: tuple[str, int] | None = None

    async def start(self, sock: socket.socket | None = None) -> tuple[str, int]:
        """Serve on ``host``:``port``, or on ``sock`` (bound and listening) if given."""
        if sock is not None:
            self._server = await asyncio.start_server(self._handle, sock=sock)
        else:
            self._server = await asyncio.start_server(self._handle, self.host, self.port)
        name = self._server.sockets[0].getsockname()
        self.address = (str(name[0]), int(name[1]))
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
            line = request.split(b"\r\n", 1)[0].decode("latin-1")
            parts = line.split()
            if len(parts) < 2:
                status, body = 400, {"status": "bad_request"}
            elif parts[0] not in ("GET", "HEAD"):
                status, body = 405, {"status": "method_not_allowed"}
            else:
                path = parts[1].split("?", 1)[0]
                handler = self.index if path == "/" else None
                handler = handler or self.routes.get(path)
                if handler is None:
                    status, body = 404, {"status": "not_found", "routes": ",".join(self.routes)}
                else:
                    try:
                        status, body = await handler()
                    except Exception:  # a probe must answer, whatever broke
                        logger.exception("probe handler for %s failed", parts[1])
                        status, body = 500, {"status": "error"}
            if isinstance(body, str):
                payload, kind = body.encode(), "text/plain; version=0.0.4; charset=utf-8"
            else:
                payload, kind = json.dumps(body).encode(), "application/json"
            head = (
                f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\n"
                f"Content-Type: {kind}\r\nContent-Length: {len(payload)}\r\n"
                "Connection: close\r\n\r\n"
            ).encode()
            writer.write(head + (b"" if parts and parts[0] == "HEAD" else payload))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
