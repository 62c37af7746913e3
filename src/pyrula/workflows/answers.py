"""The JSON answers and refusals of pyrula's HTTP surfaces, shared by RunRouter
(``pyrula.workflows.http``) and the dashboard (``pyrula.dashboard``): the error shape
``{"error": {"code", "message"}}``, a RunInfo as JSON (instants in ISO-8601 UTC) and the
keyset cursor of a listing. Both import this module; the dashboard does not import the
router, and the router mounts the dashboard only when asked to. Needs Starlette
(``pyrula[http]``)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import asdict
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from pyrula.timestamps import iso_utc_or_none
from pyrula.workflows.events import dumps
from pyrula.workflows.records import RunInfo


class ApiError(Exception):
    """A refusal the router answers as ``{"error": {"code", "message"}}`` with ``status``."""

    def __init__(self, status: int, code: str, message: str,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        #: More members of the ``error`` object (``known`` for an unknown workflow).
        self.extra = extra or {}


def bad_input(field: str, message: str) -> ApiError:
    return ApiError(422, "invalid_input", f"{field}: {message}")


def json_response(value: Any, status: int = 200) -> Response:
    return Response(dumps(value), status_code=status, media_type="application/json")


def error_response(status: int, code: str, message: str,
                   extra: dict[str, Any] | None = None) -> Response:
    """The API's error shape, ``{"error": {"code", "message", ...extra}}``, with ``status``;
    ``extra``'s members are also given beside ``error``."""
    extra = extra or {}
    return json_response({"error": {"code": code, "message": message, **extra}, **extra},
                         status)


#: The instants of a RunInfo, answered as ISO-8601 UTC (``2026-12-01T16:40:00.123Z``).
RUN_TIMES = ("created_at", "updated_at", "started_at", "finished_at", "wake_at")


def info_json(info: RunInfo) -> dict[str, Any]:
    """A RunInfo as JSON: its fields, the status as its string value, its instants as
    ISO-8601 UTC (the store keeps epoch seconds)."""
    data = asdict(info)
    data["status"] = info.status.value
    data["waiting_for"] = list(info.waiting_for)
    for key in RUN_TIMES:
        data[key] = iso_utc_or_none(data[key])
    return data


def encode_cursor(info: RunInfo) -> str:
    """The opaque keyset cursor after ``info``: its (created_at, run_id), base64url."""
    raw = orjson.dumps([info.created_at, info.run_id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        created_at, run_id = orjson.loads(raw)
    except (binascii.Error, ValueError, TypeError):
        raise bad_input("cursor", "not a cursor this API returned") from None
    if (
        not isinstance(created_at, int | float)
        or isinstance(created_at, bool)
        or not isinstance(run_id, str)
    ):
        raise bad_input("cursor", "not a cursor this API returned")
    return float(created_at), run_id


async def http_error_response(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route, wrong method) in the API's error shape."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
    detail = exc.detail if isinstance(exc, HTTPException) else "the server failed"
    return error_response(status, code, f"{request.method} {request.url.path}: {detail}")
