"""The dashboard as an ASGI app: its page, its two assets and its JSON routes.

Mounted by the fleet (``pyrula.supervisor.web``: the page at ``/``, this app under
``/dashboard``) and by ``RunRouter(store)`` (under ``<mount>/dashboard``).
The page is one HTML file and a small hand-written script and stylesheet shipped in the
package: no build step, nothing fetched from elsewhere at run time. The script finds
the JSON routes from the page's ``data-base``, the path this app is mounted at.

Read-only unless built with ``actions=True`` (the fleet's ``--dashboard-actions``): the
action routes then retry (``pyrula runs retry``'s run, same idempotency key), cancel and
signal runs; without it they answer 403 naming the flag.
"""

from __future__ import annotations

import html
import logging
import math
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from pyrula.dashboard.data import DashboardData, run_row
from pyrula.dashboard.series import Series
from pyrula.workflows.answers import (
    ApiError,
    decode_cursor,
    encode_cursor,
    error_response,
    http_error_response,
    json_response,
)
from pyrula.workflows.errors import PayloadTooLarge, RunNotActive, WorkflowNotFound
from pyrula.workflows.records import RunStatus
from pyrula.workflows.triage import NotRetryable, retry_run

logger = logging.getLogger(__name__)

ACTIONS_FLAG = "--dashboard-actions"
ACTIONS_ENV = "PYRULA_DASHBOARD_ACTIONS"
DEFAULT_PAGE = 25
MAX_PAGE = 200
ASSETS = {"dashboard.js": "text/javascript; charset=utf-8",
          "dashboard.css": "text/css; charset=utf-8"}


def _asset(name: str) -> str:
    return resources.files("pyrula.dashboard").joinpath("static", name).read_text("utf-8")


def read_only_message(flag: str = ACTIONS_FLAG) -> str:
    return (f"the dashboard is read-only: start the fleet with {flag} (or "
            f"{ACTIONS_ENV}=1) to retry, cancel or signal runs from it")


def page(base: str, actions: bool, fleet: bool) -> str:
    """The page, pointed at the JSON routes under ``base`` (ends with ``/``)."""
    return (_asset("index.html")
            .replace("{{BASE}}", html.escape(base, quote=True))
            .replace("{{ACTIONS}}", "true" if actions else "false")
            .replace("{{FLEET}}", "true" if fleet else "false")
            .replace("{{MODE_CLASS}}", "actions" if actions else "read-only")
            .replace("{{MODE_TEXT}}", "actions enabled" if actions else "read-only")
            .replace("{{MODE_TITLE}}", html.escape(
                "retry, cancel and signal are enabled (--dashboard-actions)" if actions
                else read_only_message(), quote=True)))


def page_response(base: str, actions: bool, fleet: bool) -> HTMLResponse:
    return HTMLResponse(page(base, actions, fleet), headers={"Cache-Control": "no-store"})


Handler = Callable[[Request], Awaitable[Response]]


class Dashboard:
    """The dashboard of ``store``; ``status`` (the fleet's /status body), ``series`` (its
    throughput and latency) and ``names`` (the workflows it serves) come from a fleet,
    and are None without one."""

    def __init__(self, store: Any, *, actions: bool = False,
                 status: Callable[[], dict[str, Any]] | None = None,
                 series: Series | None = None,
                 names: Callable[[], list[str]] | None = None) -> None:
        self.data = DashboardData(store)
        self.actions = actions
        self.status = status
        self.series = series
        self.names = names
        get, post = ["GET"], ["POST"]
        routes = [
            Route("/", self.index, methods=get),
            Route("/static/{name}", self.static, methods=get),
            Route("/api/overview", self._guard(self.overview), methods=get),
            Route("/api/series", self._guard(self.chart), methods=get),
            Route("/api/queues", self._guard(self.queues), methods=get),
            Route("/api/shards", self._guard(self.shards), methods=get),
            Route("/api/stuck", self._guard(self.stuck), methods=get),
            Route("/api/projections", self._guard(self.projections), methods=get),
            Route("/api/projections/{name:path}", self._guard(self.projection), methods=get),
            Route("/api/runs", self._guard(self.runs), methods=get),
            Route("/api/runs/{run_id}", self._guard(self.run), methods=get),
            Route("/api/runs/{run_id}/retry", self._guard(self.retry), methods=post),
            Route("/api/runs/{run_id}/cancel", self._guard(self.cancel), methods=post),
            Route("/api/runs/{run_id}/signal", self._guard(self.signal), methods=post),
        ]
        self.app = Starlette(routes=routes, exception_handlers={HTTPException: http_error_response})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    @staticmethod
    def _guard(handler: Handler) -> Handler:
        """``handler`` with refusals as JSON errors and anything unforeseen logged and
        answered as a 500 (the page then shows its banner)."""

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except ApiError as exc:
                return error_response(exc.status, exc.code, exc.message)
            except WorkflowNotFound as exc:
                return error_response(404, "run_not_found", str(exc))
            except TimeoutError:
                return error_response(504, "store_timeout", "the store did not answer in time")
            except Exception:
                logger.exception("dashboard request failed: %s", request.url.path)
                return error_response(500, "internal", "the dashboard failed; see the server's log")

        return guarded

    # --- the page -----------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        base = request.scope.get("root_path", "").rstrip("/") + "/"
        return page_response(base, self.actions, self.status is not None)

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            return error_response(404, "not_found", f"no asset {name!r}")
        return Response(_asset(name), media_type=ASSETS[name],
                        headers={"Cache-Control": "no-cache"})

    # --- reads ----------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        return json_response({"actions": self.actions,
                      "read_only": None if self.actions else read_only_message(),
                      "fleet": None if self.status is None else self.status()})

    async def chart(self, request: Request) -> Response:
        if self.series is None:
            return json_response({"available": False, "points": [],
                          "why": "no fleet here: throughput is sampled by a fleet"})
        return json_response({"available": True, **self.series.body()})

    async def queues(self, request: Request) -> Response:
        names = self.names() if self.names is not None else await self.data.recent_names()
        return json_response(await self.data.queues(names))

    async def shards(self, request: Request) -> Response:
        return json_response(await self.data.shards())

    async def stuck(self, request: Request) -> Response:
        return json_response({"runs": await self.data.stuck()})

    async def runs(self, request: Request) -> Response:
        query = request.query_params
        limit = _integer(query.get("limit"), "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        status = None
        if query.get("status"):
            try:
                status = RunStatus(query["status"])
            except ValueError:
                valid = ", ".join(s.value for s in RunStatus)
                raise ApiError(422, "invalid_input",
                              f"status: {query['status']!r} is not one of {valid}") from None
        cursor = query.get("cursor") or None
        try:
            before = None if cursor is None else decode_cursor(cursor)
        except Exception:
            raise ApiError(422, "invalid_input", "cursor: not a cursor this API returned") \
                from None
        page = await self.data.runs(workflow=query.get("workflow") or None, status=status,
                                    owner=query.get("owner") or None, limit=limit,
                                    before=before)
        after = encode_cursor(page[-1]) if len(page) == limit else None
        return json_response({"runs": [run_row(info) for info in page], "cursor": after})

    async def projections(self, request: Request) -> Response:
        return json_response({"projections": await self.data.projections()})

    async def projection(self, request: Request) -> Response:
        name = request.path_params["name"]
        found = await self.data.projection(name, request.query_params.get("key"))
        if found is None:
            raise ApiError(404, "projection_not_found",
                           f"no projection named {name!r} was folded yet")
        return json_response(found)

    async def run(self, request: Request) -> Response:
        return json_response(await self.data.run(request.path_params["run_id"]))

    # --- actions --------------------------------------------------------------------

    def _allowed(self) -> None:
        if not self.actions:
            raise ApiError(403, "read_only", read_only_message())

    async def retry(self, request: Request) -> Response:
        self._allowed()
        run_id = request.path_params["run_id"]
        try:
            handle = await retry_run(self.data.client, run_id)
        except NotRetryable as exc:
            raise ApiError(409, "not_failed", str(exc)) from None
        return json_response({"run_id": handle.run_id, "workflow": handle.name, "retries": run_id})

    async def cancel(self, request: Request) -> Response:
        self._allowed()
        run_id = request.path_params["run_id"]
        await self.data.client.get(run_id)
        return json_response({"run_id": run_id, "cancelled": await self.data.client.cancel(run_id)})

    async def signal(self, request: Request) -> Response:
        self._allowed()
        run_id = request.path_params["run_id"]
        try:
            body = await request.json()
        except ValueError:
            raise ApiError(422, "invalid_input", "body: not valid JSON") from None
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise ApiError(422, "invalid_input", "name: required, a non-empty string")
        try:
            await self.data.client.signal(run_id, name, body.get("payload"))
        except (PayloadTooLarge, RunNotActive) as exc:
            raise ApiError(409, "refused", str(exc)) from None
        return json_response({"run_id": run_id, "signal": name})


def _integer(text: str | None, field: str, default: int, low: int, high: int) -> int:
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ApiError(422, "invalid_input", f"{field}: {text!r} is not an integer") from None
    if not math.isfinite(value) or value != int(value) or not low <= value <= high:
        raise ApiError(422, "invalid_input", f"{field}: must be {low}..{high}, got {text!r}")
    return int(value)
