"""The collector's HTTP side: ingest and submits for connectors, JSON for scripts, a page.

Every route but ``/healthz`` needs a key made by ``pyrula cloud keys create``: the API
as ``Authorization: Bearer KEY`` (401 without one or with a key it does not know); the
page also takes ``?key=KEY`` once and keeps it in a cookie. A key's environment labels
what it reports and is where the runs it submits go.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from pyrula.cloud.collector import records
from pyrula.cloud.collector.page import login_page, render_page
from pyrula.cloud.collector.sql import Database
from pyrula.timestamps import iso_utc as iso

COOKIE = "pyrula_cloud_key"


class _Unauthorized(Exception):
    pass


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _run(row: dict[str, Any]) -> dict[str, Any]:
    return {"run_id": row["run_id"], "workflow": row["workflow"], "status": row["status"],
            "environment": row["environment"], "updated_at": iso(float(row["updated_at"])),
            "worker_id": row["worker_id"], "fleet": row["fleet"], "error": row["error"]}


def _worker(row: dict[str, Any]) -> dict[str, Any]:
    return {"worker_id": row["worker_id"], "kind": row["kind"], "host": row["host"],
            "pid": row["pid"], "state": row["state"], "live": row["live"],
            "in_flight": row["in_flight"], "runs_done": row["runs_done"],
            "workflows": [w for w in (row["workflows"] or "").split(",") if w],
            "last_seen": iso(float(row["last_seen"]))}


def build_app(db: Database) -> Starlette:
    """The collector over ``db`` (opened by the app's lifespan, closed at its end)."""
    c = Collector(db)
    return Starlette(routes=[
        Route("/", c.page), Route("/healthz", c.healthz),
        Route("/api/ingest", c.ingest, methods=["POST"]),
        Route("/api/fleets", c.api_fleets), Route("/api/runs", c.api_runs),
        Route("/api/submits", c.api_submit, methods=["POST"]),
        Route("/api/submits/take", c.take, methods=["POST"]),
        Route("/api/submits/ack", c.ack, methods=["POST"]),
    ], exception_handlers={_Unauthorized: _unauthorized}, lifespan=c.lifespan)


class Collector:
    """The collector's routes over one database, with the keys it has already checked."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.keys: dict[str, str] = {}

    async def environment(self, key: str | None) -> str:
        """The environment of API key ``key``; _Unauthorized for none or an unknown one."""
        if key is None:
            raise _Unauthorized
        if key not in self.keys:
            found = await records.environment_of(self.db, key)
            if found is None:
                raise _Unauthorized
            self.keys[key] = found
        return self.keys[key]

    async def authorized(self, request: Request) -> str:
        return await self.environment(_bearer(request))

    async def ingest(self, request: Request) -> Response:
        env = await self.authorized(request)
        data = await _body(request)
        if not isinstance(data, dict) or not isinstance(data.get("events"), list):
            return JSONResponse({"error": "expected {source, events: [...]}"}, 400)
        applied = await records.ingest(self.db, env, dict(data.get("source") or {}),
                                       data["events"])
        return JSONResponse({"received": len(data["events"]), "applied": applied})

    async def api_fleets(self, request: Request) -> Response:
        await self.authorized(request)
        fleets = await records.fleets(self.db)
        return JSONResponse({"fleets": [
            {**f, "last_seen": iso(f["last_seen"]), "workers": [_worker(w) for w in f["workers"]]}
            for f in fleets]})

    async def api_runs(self, request: Request) -> Response:
        await self.authorized(request)
        q = request.query_params
        try:
            limit = max(1, min(int(q.get("limit", "1000")), 100_000))
        except ValueError:
            return JSONResponse({"error": "limit must be an integer"}, 400)
        rows = await records.runs(self.db, q.get("workflow") or None, q.get("status") or None,
                                  limit)
        return JSONResponse({"runs": [_run(r) for r in rows]})

    async def api_submit(self, request: Request) -> Response:
        env = await self.authorized(request)
        data = await _body(request)
        if not isinstance(data, dict) or not isinstance(data.get("workflow"), str):
            return JSONResponse({"error": "expected {workflow, params}"}, 400)
        submit_id = await records.queue_submit(self.db, env, data["workflow"],
                                               data.get("params") or {})
        return JSONResponse({"submit_id": submit_id, "environment": env}, 201)

    async def take(self, request: Request) -> Response:
        env = await self.authorized(request)
        data = await _body(request) or {}
        taken = await records.take_submits(self.db, env, str(data.get("worker_id")),
                                           list(data.get("workflows") or []))
        return JSONResponse({"submits": taken})

    async def ack(self, request: Request) -> Response:
        env = await self.authorized(request)
        data = await _body(request) or {}
        await records.ack_submits(self.db, env, list(data.get("acks") or []))
        return JSONResponse({"ok": True})

    async def page(self, request: Request) -> Response:
        given = request.query_params.get("key")
        key = given or _bearer(request) or request.cookies.get(COOKIE)
        try:
            await self.environment(key)
        except _Unauthorized:
            return HTMLResponse(login_page(bad=key is not None), 401)
        q = request.query_params
        response = HTMLResponse(await render_page(self.db, q.get("workflow"), q.get("status")))
        if given:
            response.set_cookie(COOKIE, given, httponly=True, samesite="strict")
        return response

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        opener = getattr(self.db, "open", None)
        if opener is not None:
            await opener()
        try:
            yield
        finally:
            await self.db.close()


async def _body(request: Request) -> Any:
    """The request's JSON body, None when it is not JSON."""
    try:
        return orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return None


async def _unauthorized(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": "a valid API key is required: Authorization: Bearer KEY"},
                        401, headers={"WWW-Authenticate": "Bearer"})
