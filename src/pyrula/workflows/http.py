"""RunRouter: the run operations of ``WorkflowClient`` as a JSON HTTP API (an ASGI app).

``app.mount("/runs", RunRouter(store))`` in any Starlette or FastAPI app, or
``RunRouter(store).mount("/runs")`` as a route, which answers ``POST /runs`` without its
slash too. Every answer is JSON; every refusal is ``{"error": {"code", "message"}}`` with
404 for an unknown run, 422 for bad input (the message names the field), 413 for a payload
over the client's limit and 409 for a run that has ended (or has not, for ``result``).
Instants are ISO-8601 UTC strings (``pyrula.timestamps``). The optional extra
``pyrula[http]`` installs Starlette; ``import pyrula.workflows`` never imports this module.

The module runs past 400 lines because a third of it is the OpenAPI description, kept
beside the routes it describes so that the two change together.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

try:
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import RedirectResponse, Response
    from starlette.routing import BaseRoute, Match, Mount, Route
    from starlette.types import Receive, Scope, Send
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "pyrula.workflows.http needs Starlette: pip install 'pyrula[http]'"
    ) from exc

from pyrula.timestamps import EVENT_TIMES, readable_event
from pyrula.workflows.answers import (
    RUN_TIMES,
    ApiError,
    bad_input,
    decode_cursor,
    encode_cursor,
    error_response,
    http_error_response,
    info_json,
    json_response,
)
from pyrula.workflows.client import WorkflowClient
from pyrula.workflows.definition import check_workflow_name, unknown_name
from pyrula.workflows.errors import (
    PayloadTooLarge,
    QueryFailed,
    RunCancelled,
    RunFailed,
    RunNotActive,
    UpdateFailed,
    WorkflowNotFound,
)
from pyrula.workflows.priority import MAX_PRIORITY, MIN_PRIORITY, check_priority
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.base import Store

logger = logging.getLogger(__name__)

DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 1000
#: The longest ``GET /{run_id}/result?timeout=`` wait, in seconds: a request holds a
#: connection, so it is bounded rather than left to the caller.
MAX_RESULT_TIMEOUT_S = 300.0
#: How long ``POST /{run_id}/update/{name}`` waits for the reply unless told (seconds).
DEFAULT_UPDATE_TIMEOUT_S = 30.0
#: A query refused (``QueryFailed.error_type``) -> the answer's status and code; any
#: other (the handler's own error) is a 422 ``query_failed``.
_QUERY_REFUSALS = {
    "RunNotActive": (409, "run_not_active"),
    "NoQueryHandler": (404, "query_not_found"),
    "WorkflowNotFound": (424, "workflow_not_loaded"),
    "ReplayFailed": (424, "replay_failed"),
}
#: Room for the JSON around a request's payloads (field names, escapes, whitespace).
BODY_OVERHEAD_BYTES = 64 * 1024


async def _body(request: Request, cap: int) -> dict[str, Any]:
    """The request body as a JSON object, refused with a 413 once it passes ``cap`` bytes
    (from its Content-Length, else as it streams in), so that an oversized body is never
    held in memory whole. Read leniently (``NaN``, ``1e400`` and integers past 64 bits
    parse) so that such a value reaches the client's own payload check and is refused
    naming the field that holds it."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise _too_large(int(declared), cap)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise _too_large(size, cap)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise bad_input("body", "not valid JSON") from None
    if not isinstance(value, dict):
        raise bad_input("body", "must be a JSON object")
    return value


def _too_large(size: int, cap: int) -> ApiError:
    return ApiError(413, "payload_too_large",
                    f"the request body is over {cap} bytes (at least {size}); the payloads it "
                    "carries are limited by max_payload_bytes")


def _priority(body: dict[str, Any]) -> int:
    """The body's ``priority`` (0 when absent); 422 naming it for anything but an int in
    0..9."""
    try:
        return check_priority(body.get("priority", 0))
    except (TypeError, ValueError) as exc:
        raise bad_input("priority", str(exc)) from None


def _optional_str(body: dict[str, Any], field: str) -> str | None:
    value = body.get(field)
    if value is not None and (not isinstance(value, str) or not value):
        raise bad_input(field, "must be a non-empty string or null")
    return value


def _number(request: Request, field: str, default: float, low: float, high: float) -> float:
    text = request.query_params.get(field)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise bad_input(field, f"{text!r} is not a number") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise bad_input(field, f"must be between {low:g} and {high:g}, got {text!r}")
    return value


def _integer(request: Request, field: str, default: int, low: int, high: int) -> int:
    text = request.query_params.get(field)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise bad_input(field, f"{text!r} is not an integer") from None
    if not low <= value <= high:
        raise bad_input(field, f"must be between {low} and {high}, got {value}")
    return value


def _status(request: Request) -> RunStatus | None:
    text = request.query_params.get("status")
    if text is None:
        return None
    try:
        return RunStatus(text)
    except ValueError:
        valid = ", ".join(s.value for s in RunStatus)
        raise bad_input("status", f"{text!r} is not a run status; use one of: {valid}") from None


def _client_call(field: str, exc: ValueError) -> ApiError:
    return bad_input(field, str(exc))


def _param(name: str, where: str, schema: dict[str, Any], about: str) -> dict[str, Any]:
    return {"name": name, "in": where, "required": where == "path", "schema": schema,
            "description": about}


def _answer(about: str, schema: str = "Object") -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {"description": about, "content": {"application/json": {"schema": ref}}}


def _body_of(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": required}
    return {"required": True, "content": {"application/json": {"schema": schema}}}


#: An instant as every answer writes it: ISO-8601 UTC, milliseconds, ``Z``.
_INSTANT: dict[str, Any] = {"type": ["string", "null"], "format": "date-time",
                            "examples": ["2026-12-01T16:40:00.123Z"]}
_RUN_ID = _param("run_id", "path", {"type": "string"}, "the run's id")
_ANY: dict[str, Any] = {"description": "any JSON value"}
_OPTIONAL_STR: dict[str, Any] = {"type": ["string", "null"], "minLength": 1}
_PRIORITY: dict[str, Any] = {"type": "integer", "minimum": MIN_PRIORITY,
                             "maximum": MAX_PRIORITY, "default": 0}
_REFUSALS = {
    "404": _answer("no run with this id", "Error"),
    "422": _answer("bad input; the message names the field (unknown_workflow: a workflow "
                   "no worker of the store has served, with the known ones)", "Error"),
}
_PAYLOAD_REFUSALS = {**_REFUSALS, "413": _answer("payload over the limit", "Error"),
                     "409": _answer("the run has ended", "Error")}


def _operation(summary: str, ok: dict[str, Any], refusals: dict[str, Any],
               parameters: list[dict[str, Any]] | None = None,
               body: dict[str, Any] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "parameters": parameters or [],
                          "responses": {**ok, **refusals}}
    if body is not None:
        op["requestBody"] = body
    return op


#: The API's OpenAPI 3.1 description, served at ``GET /openapi.json``.
OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "pyrula runs", "version": "1"},
    "paths": {
        "/": {
            "post": _operation(
                "Submit a run",
                {"201": _answer("the run is queued", "Submitted")},
                {**_REFUSALS, "413": _PAYLOAD_REFUSALS["413"]},
                body=_body_of(
                    {"workflow": {"type": "string", "minLength": 1}, "params": _ANY,
                     "owner": _OPTIONAL_STR, "idempotency_key": _OPTIONAL_STR,
                     "priority": _PRIORITY},
                    ["workflow"],
                ),
            ),
            "get": _operation(
                "List runs, newest first (keyset pages)",
                {"200": _answer("a page of runs", "RunPage")},
                {"422": _REFUSALS["422"]},
                [
                    _param("workflow", "query", {"type": "string"}, "workflow name"),
                    _param("status", "query", {"type": "string",
                           "enum": [s.value for s in RunStatus]}, "run status"),
                    _param("owner", "query", {"type": "string"}, "run owner"),
                    _param("limit", "query", {"type": "integer", "minimum": 1,
                           "maximum": MAX_LIST_LIMIT}, "page size"),
                    _param("cursor", "query", {"type": "string"},
                           "the cursor of the previous page"),
                ],
            ),
        },
        "/events": {"post": _operation(
            "Emit an event (workflows with a BatchTrigger on its topic get it in a run)",
            {"201": _answer("the event is recorded", "Emitted"),
             "200": _answer("an event with this key was emitted on the topic before: its "
                            "id", "Emitted")},
            {"422": _REFUSALS["422"], "413": _PAYLOAD_REFUSALS["413"]},
            body=_body_of({"topic": {"type": "string", "minLength": 1}, "payload": _ANY,
                           "key": _OPTIONAL_STR, "owner": _OPTIONAL_STR},
                          ["topic", "payload"]),
        )},
        "/projections/{name}": {"get": _operation(
            "A projection's state (a keyed one: every key's, or key's)",
            {"200": _answer("the projection and its state", "Projection")},
            {"404": _answer("no projection of this name was folded yet", "Error"),
             "422": _answer("a key for a projection that is not keyed", "Error")},
            [_param("name", "path", {"type": "string"}, "the projection's name"),
             _param("key", "query", {"type": "string"}, "the key of a keyed projection")],
        )},
        "/openapi.json": {"get": _operation(
            "This description", {"200": _answer("OpenAPI 3 document")}, {})},
        "/{run_id}": {"get": _operation(
            "A run's state", {"200": _answer("the run", "Run")}, _REFUSALS, [_RUN_ID])},
        "/{run_id}/result": {"get": _operation(
            "Wait for a run's result",
            {"200": _answer("the run completed", "Result"),
             "409": _answer("not ended after the timeout", "Error"),
             "424": _answer("the run failed or was cancelled", "Object")},
            _REFUSALS,
            [_RUN_ID, _param("timeout", "query", {"type": "number", "minimum": 0,
                             "maximum": MAX_RESULT_TIMEOUT_S}, "seconds to wait")],
        )},
        "/{run_id}/events": {"get": _operation(
            "A run's journal", {"200": _answer("its events", "Events")}, _REFUSALS,
            [_RUN_ID, _param("after_seq", "query", {"type": "integer", "minimum": 0},
                             "only events after this seq")],
        )},
        "/{run_id}/signal": {"post": _operation(
            "Send a signal", {"200": _answer("delivered")}, _PAYLOAD_REFUSALS, [_RUN_ID],
            _body_of({"name": {"type": "string", "minLength": 1}, "payload": _ANY},
                     ["name"]),
        )},
        "/{run_id}/query/{name}": {"get": _operation(
            "Query a run (its journal replayed by this server with the workflow's code)",
            {"200": _answer("the query handler's answer", "Answer")},
            {**_REFUSALS, "404": _answer("no run with this id, or no query handler of "
                                         "this name (query_not_found)", "Error"),
             "409": _answer("the run has ended", "Error"),
             "422": _answer("bad args, or the handler raised (query_failed)", "Error"),
             "424": _answer("this server has not loaded the run's workflow, or cannot "
                            "replay the run", "Error")},
            [_RUN_ID, _param("name", "path", {"type": "string"}, "the query's name"),
             _param("args", "query", {"type": "string"}, "a JSON list of its arguments")],
        )},
        "/{run_id}/update/{name}": {"post": _operation(
            "Update a run and wait for its handler's reply",
            {"200": _answer("the update handler's reply", "Answer")},
            {**_PAYLOAD_REFUSALS,
             "422": _answer("bad input, or the update failed (update_failed: the "
                            "handler raised, or the run has no such handler)", "Error"),
             "504": _answer("no reply within the timeout", "Error")},
            [_RUN_ID, _param("name", "path", {"type": "string"}, "the update's name")],
            _body_of({"payload": _ANY, "timeout": {"type": "number", "exclusiveMinimum": 0,
                      "maximum": MAX_RESULT_TIMEOUT_S}}, []),
        )},
        "/{run_id}/resume": {"post": _operation(
            "Answer the run's interrupt", {"200": _answer("delivered")},
            _PAYLOAD_REFUSALS, [_RUN_ID], _body_of({"value": _ANY}, []),
        )},
        "/{run_id}/fork": {"post": _operation(
            "Fork a run: a new run that reuses the run's steps before from_step",
            {"201": _answer("the fork is queued", "Forked")},
            {**_REFUSALS, "413": _PAYLOAD_REFUSALS["413"]}, [_RUN_ID],
            _body_of({"from_step": {"type": ["string", "integer"], "minLength": 1,
                                    "minimum": 1, "description": "a step name (the run's "
                                    "first call of it) or a 1-based position among the "
                                    "run's step calls"},
                      "params": {"description": "the fork's params (default: the run's)"}},
                     ["from_step"]),
        )},
        "/{run_id}/cancel": {"post": _operation(
            "Cancel a run", {"200": _answer("cancelled, or false if it had ended")},
            _REFUSALS, [_RUN_ID],
        )},
    },
    "components": {"schemas": {
        "Object": {"type": "object"},
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"},
                           "known": {"type": "array", "items": {"type": "string"},
                                     "description": "unknown_workflow: the names workers "
                                     "of the store have served"}}}}},
        "Projection": {"type": "object", "required": ["name", "state"], "properties": {
            "name": {"type": "string"}, "keyed": {"type": "boolean"},
            "version": {"type": "integer"}, "folded": {"type": "integer"},
            "checkpoint": {"type": ["object", "null"]}, "fingerprint": {"type": "string"},
            "updated_at": {"type": "string"}, "key": _OPTIONAL_STR, "state": _ANY}},
        "Answer": {"type": "object", "required": ["run_id", "result"], "properties": {
            "run_id": {"type": "string"}, "query": {"type": "string"},
            "update": {"type": "string"}, "result": _ANY}},
        "Emitted": {"type": "object", "required": ["event_id"], "properties": {
            "event_id": {"type": "string"}}},
        "Forked": {"type": "object", "required": ["run_id", "workflow", "forks", "from_step"],
                   "properties": {"run_id": {"type": "string"}, "workflow": {"type": "string"},
                                  "forks": {"type": "string"},
                                  "from_step": {"type": ["string", "integer"]}}},
        "Submitted": {"type": "object", "required": ["run_id", "workflow"], "properties": {
            "run_id": {"type": "string"}, "workflow": {"type": "string"}}},
        "Run": {"type": "object", "required": ["run_id", "name", "status"], "properties": {
            "run_id": {"type": "string"}, "name": {"type": "string"},
            "status": {"type": "string", "enum": [s.value for s in RunStatus]},
            "priority": _PRIORITY, **{key: _INSTANT for key in RUN_TIMES}}},
        "RunPage": {"type": "object", "required": ["runs", "cursor"], "properties": {
            "runs": {"type": "array", "items": {"$ref": "#/components/schemas/Run"}},
            "cursor": {"type": ["string", "null"]}}},
        "Result": {"type": "object", "required": ["result"]},
        "Events": {"type": "object", "required": ["events"], "properties": {
            "events": {"type": "array", "items": {"$ref": "#/components/schemas/Event"}}}},
        "Event": {"type": "object", "required": ["seq", "type", "ts"], "properties": {
            "seq": {"type": "integer"}, "type": {"type": "string"},
            **{key: _INSTANT for key in EVENT_TIMES}}},
    }},
}


Handler = Callable[[Request], Awaitable[Response]]


class RunRouter:
    """An ASGI app serving the runs of ``store``: submit, list, inspect, signal, cancel."""

    def __init__(self, store: Store, *, max_payload_bytes: int | None = None,
                 dashboard: bool = True, dashboard_actions: bool = False,
                 check_names: bool = True) -> None:
        """The router also serves the HTML dashboard of ``store`` at ``/dashboard/``,
        read-only unless ``dashboard_actions`` (``dashboard=False``: the API alone).

        ``check_names``: a submit of a workflow no worker of the store has ever served
        (once any has served one) is refused with 422 ``unknown_workflow``, naming the
        known ones; False accepts it (the run waits for a worker that serves it), for an
        API deployed ahead of the workers that bring a new workflow."""
        self.client = WorkflowClient(store, max_payload_bytes=max_payload_bytes)
        self.check_names = check_names
        #: The largest request body read: the payload limit plus room for the JSON around
        #: it. A payload under the limit may still be refused by the client's own check.
        self.body_cap = 2 * self.client.max_payload_bytes + BODY_OVERHEAD_BYTES
        routes: list[BaseRoute] = [
            Route("/", self._guard(self.submit), methods=["POST"]),
            Route("/events", self._guard(self.emit), methods=["POST"]),
            Route("/", self._guard(self.list_runs), methods=["GET"]),
            Route("/openapi.json", self._guard(self.openapi), methods=["GET"]),
            Route("/projections/{name:path}", self._guard(self.projection), methods=["GET"]),
            Route("/{run_id}", self._guard(self.show), methods=["GET"]),
            Route("/{run_id}/result", self._guard(self.result), methods=["GET"]),
            Route("/{run_id}/events", self._guard(self.events), methods=["GET"]),
            Route("/{run_id}/signal", self._guard(self.signal), methods=["POST"]),
            Route("/{run_id}/query/{name}", self._guard(self.query), methods=["GET"]),
            Route("/{run_id}/update/{name}", self._guard(self.update), methods=["POST"]),
            Route("/{run_id}/resume", self._guard(self.resume), methods=["POST"]),
            Route("/{run_id}/cancel", self._guard(self.cancel), methods=["POST"]),
            Route("/{run_id}/fork", self._guard(self.fork), methods=["POST"]),
        ]
        if dashboard:  # before /{run_id}, which would take "dashboard" for a run id
            from pyrula.dashboard.app import Dashboard

            routes[:0] = [Route("/dashboard", _to_dashboard, methods=["GET"]),
                          Mount("/dashboard", Dashboard(store, actions=dashboard_actions))]
        self.app = Starlette(routes=routes, exception_handlers={HTTPException: http_error_response})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    def mount(self, path: str) -> Mount:
        """This router as a route of an enclosing app at ``path`` that answers ``path``
        itself too: ``Starlette(routes=[RunRouter(store).mount("/runs")])`` (FastAPI:
        ``app.router.routes.append(...)``) serves ``POST /runs`` as ``POST /runs/``.

        A plain ``Mount("/runs", router)`` matches only ``/runs/...``: the enclosing router
        answers ``/runs`` with an empty 307 to ``/runs/``, which a client posting a run
        does not follow by default."""
        return _SlashlessMount(path, self)

    @staticmethod
    def _guard(handler: Handler) -> Handler:
        """``handler`` with the client's refusals turned into JSON errors, and anything
        unforeseen logged and answered as a 500 rather than a traceback page."""

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except ApiError as exc:
                return error_response(exc.status, exc.code, exc.message, exc.extra)
            except WorkflowNotFound as exc:
                return error_response(404, "run_not_found", str(exc))
            except PayloadTooLarge as exc:
                return error_response(413, "payload_too_large", str(exc))
            except RunNotActive as exc:
                return error_response(409, "run_not_active", str(exc))
            except Exception:
                logger.exception("http.request_failed path=%s", request.url.path)
                return error_response(500, "internal", "the server failed; see its log")

        return guarded

    async def openapi(self, request: Request) -> Response:
        return json_response(OPENAPI)

    async def submit(self, request: Request) -> Response:
        body = await _body(request, self.body_cap)
        workflow = body.get("workflow")
        if not isinstance(workflow, str) or not workflow:
            raise bad_input("workflow", "required, a non-empty string")
        try:
            check_workflow_name(workflow)
        except ValueError as exc:
            raise bad_input("workflow", str(exc)) from None
        if self.check_names:
            served = await self.client.served_names()
            mistyped = unknown_name(workflow, served)
            if mistyped is not None:
                raise ApiError(422, "unknown_workflow", f"workflow: {mistyped}",
                               {"known": served})
        owner = _optional_str(body, "owner")
        key = _optional_str(body, "idempotency_key")
        priority = _priority(body)
        try:
            handle = await self.client.submit(
                workflow, body.get("params"), owner=owner, idempotency_key=key,
                priority=priority,
            )
        except (PayloadTooLarge, RunNotActive):
            raise  # ValueErrors with answers of their own (413, 409)
        except ValueError as exc:
            raise _client_call("params", exc) from None
        return json_response({"run_id": handle.run_id, "workflow": handle.name}, 201)

    async def emit(self, request: Request) -> Response:
        """``POST /events``: 201 with the new event's id, 200 with the first one's when its
        ``key`` was emitted on the topic before."""
        body = await _body(request, self.body_cap)
        topic = body.get("topic")
        if not isinstance(topic, str) or not topic:
            raise bad_input("topic", "required, a non-empty string")
        if "payload" not in body:
            raise bad_input("payload", "required, any JSON value")
        key = _optional_str(body, "key")
        owner = _optional_str(body, "owner")
        try:
            event_id, created = await self.client.emit_event(
                topic, body["payload"], key=key, owner=owner
            )
        except PayloadTooLarge:
            raise
        except ValueError as exc:
            raise _client_call("payload" if str(exc).startswith("payload") else "topic",
                               exc) from None
        return json_response({"event_id": event_id}, 201 if created else 200)

    async def projection(self, request: Request) -> Response:
        """``GET /projections/{name}``: the projection's head and its state (``?key=``)."""
        from pyrula.workflows.projections import head_document

        name = request.path_params["name"]
        key = request.query_params.get("key")
        try:
            head = await self.client.projection_info(name)
        except ValueError as exc:
            raise _client_call("name", exc) from None
        if head is None:
            raise ApiError(404, "projection_not_found",
                           f"no projection named {name!r} was folded yet")
        try:
            state = await self.client.projection(name, key)
        except ValueError as exc:
            raise _client_call("key", exc) from None
        return json_response({**head_document(head), "key": key, "state": state})

    async def list_runs(self, request: Request) -> Response:
        limit = _integer(request, "limit", DEFAULT_LIST_LIMIT, 1, MAX_LIST_LIMIT)
        status = _status(request)
        cursor = request.query_params.get("cursor")
        before = None if cursor is None else decode_cursor(cursor)
        page = await self.client.store.list_runs(
            name=request.query_params.get("workflow"),
            status=status,
            owner=request.query_params.get("owner"),
            limit=limit,
            before=before,
        )
        after = encode_cursor(page[-1]) if len(page) == limit else None
        return json_response({"runs": [info_json(info) for info in page], "cursor": after})

    async def show(self, request: Request) -> Response:
        return json_response(info_json(await self.client.get(request.path_params["run_id"])))

    async def result(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        timeout = _number(request, "timeout", 0.0, 0.0, MAX_RESULT_TIMEOUT_S)
        try:
            value = await self.client.result(run_id, timeout)
        except TimeoutError:
            raise ApiError(
                409, "run_not_ended", f"run {run_id!r} has not ended after {timeout:g}s"
            ) from None
        except RunFailed as exc:
            return json_response({"error": exc.error}, 424)
        except RunCancelled:
            error = {"code": "cancelled", "message": f"run {run_id!r} was cancelled"}
            return json_response({"error": error}, 424)
        return json_response({"result": value})

    async def events(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        after = _integer(request, "after_seq", 0, 0, 2**62)
        await self.client.get(run_id)
        events = await self.client.events(run_id, after)
        return json_response({"events": [readable_event(event) for event in events]})

    async def signal(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        body = await _body(request, self.body_cap)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise bad_input("name", "required, a non-empty string")
        try:
            await self.client.signal(run_id, name, body.get("payload"))
        except (PayloadTooLarge, RunNotActive):
            raise  # ValueErrors with answers of their own (413, 409)
        except ValueError as exc:
            field = "payload" if str(exc).startswith("payload") else "name"
            raise _client_call(field, exc) from None
        return json_response({"run_id": run_id, "signal": name})

    async def query(self, request: Request) -> Response:
        run_id, name = request.path_params["run_id"], request.path_params["name"]
        raw = request.query_params.get("args", "[]")
        try:
            args = json.loads(raw)
        except ValueError:
            raise bad_input("args", "a JSON list of the query's arguments") from None
        if not isinstance(args, list):
            raise bad_input("args", "a JSON list of the query's arguments")
        try:
            value = await self.client.query(run_id, name, *args)
        except QueryFailed as exc:
            status, code = _QUERY_REFUSALS.get(exc.error_type, (422, "query_failed"))
            raise ApiError(status, code, str(exc), {"error_type": exc.error_type}) from None
        return json_response({"run_id": run_id, "query": name, "result": value})

    async def update(self, request: Request) -> Response:
        run_id, name = request.path_params["run_id"], request.path_params["name"]
        body = await _body(request, self.body_cap)
        timeout = body.get("timeout", DEFAULT_UPDATE_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
            0 < timeout <= MAX_RESULT_TIMEOUT_S
        ):
            raise bad_input("timeout", f"seconds, above 0 and at most {MAX_RESULT_TIMEOUT_S:g}")
        try:
            value = await self.client.update(run_id, name, body.get("payload"),
                                             timeout=float(timeout))
        except UpdateFailed as exc:
            raise ApiError(422, "update_failed", str(exc), {"error_type": exc.error_type,
                                                            "detail": exc.message}) from None
        except TimeoutError as exc:
            raise ApiError(504, "update_timeout", str(exc)) from None
        except (PayloadTooLarge, RunNotActive):
            raise  # ValueErrors with answers of their own (413, 409)
        except ValueError as exc:
            raise _client_call("payload", exc) from None
        return json_response({"run_id": run_id, "update": name, "result": value})

    async def resume(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        body = await _body(request, self.body_cap)
        try:
            await self.client.resume(run_id, body.get("value"))
        except (PayloadTooLarge, RunNotActive):
            raise  # ValueErrors with answers of their own (413, 409)
        except ValueError as exc:
            raise _client_call("value", exc) from None
        return json_response({"run_id": run_id, "resumed": True})

    async def cancel(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        await self.client.get(run_id)
        return json_response({"run_id": run_id, "cancelled": await self.client.cancel(run_id)})


    async def fork(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        body = await _body(request, self.body_cap)
        from_step = body.get("from_step")
        if isinstance(from_step, bool) or not (
            (isinstance(from_step, str) and from_step) or isinstance(from_step, int)
        ):
            raise bad_input("from_step", "required, a step name or a 1-based position")
        await self.client.get(run_id)
        try:
            handle = await self.client.fork(run_id, from_step=from_step,
                                            params=body.get("params"))
        except PayloadTooLarge:
            raise  # a ValueError with an answer of its own (413)
        except ValueError as exc:
            field = "params" if str(exc).startswith("params") else "from_step"
            raise _client_call(field, exc) from None
        return json_response({"run_id": handle.run_id, "workflow": handle.name,
                              "forks": run_id, "from_step": from_step}, 201)


class _SlashlessMount(Mount):
    """A Mount that takes its own path without the slash (``/runs``) as ``/runs/``."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.NONE or scope["type"] not in ("http", "websocket"):
            return match, child
        root_path = scope.get("root_path", "")
        if not self.path or scope["path"] != root_path + self.path:
            return match, child
        slashed = {**scope, "path": scope["path"] + "/"}
        if isinstance(scope.get("raw_path"), bytes):
            slashed["raw_path"] = scope["raw_path"] + b"/"
        match, child = super().matches(slashed)
        if match is not Match.NONE:
            child = {**child, "path": slashed["path"]}
            if "raw_path" in slashed:
                child["raw_path"] = slashed["raw_path"]
        return match, child


async def _to_dashboard(request: Request) -> Response:
    """``/dashboard`` without its slash: the page's relative routes need the slash."""
    return RedirectResponse(request.url.path + "/")
