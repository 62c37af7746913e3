"""What a connector sends a collector, and how: JSON over HTTP with the stdlib.

``urllib`` runs on a thread (``asyncio.to_thread``), so a slow collector never holds the
event loop and no HTTP client package is needed. Each event a connector reports gets the
id ``<run_id>:<seq>``: the same journal entry always has the same id, whoever reports it
and however often, and the collector applies an id once.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from typing import Any

import orjson

from pyrula.workflows.events import TERMINAL_EVENTS, Event, EventType

#: Routes of the collector a connector calls.
INGEST_PATH = "/api/ingest"
TAKE_SUBMITS_PATH = "/api/submits/take"
ACK_SUBMITS_PATH = "/api/submits/ack"
#: The events a spool keeps: a run's terminal events and its errors.
CRITICAL_EVENTS = frozenset({*TERMINAL_EVENTS, EventType.STEP_FAILED})


class SendFailed(Exception):
    """The collector could not be reached or refused the request."""


def shaped(run_id: str, workflow: str, event: Event) -> dict[str, Any] | None:
    """The report of one journal entry (None for an entry without a ``seq``)."""
    seq = event.get("seq")
    if seq is None:
        return None
    report: dict[str, Any] = {"id": f"{run_id}:{seq}", "run_id": run_id,
                              "workflow": workflow, "seq": int(seq),
                              "type": str(event.get("type")), "ts": event.get("ts")}
    if event.get("name") is not None:
        report["name"] = str(event["name"])
    error = event.get("error")
    message = event.get("message") or (error.get("message") if isinstance(error, dict) else None)
    if message is not None:
        report["error"] = str(message)[:500]
    return report


def is_critical(report: dict[str, Any]) -> bool:
    return report.get("type") in CRITICAL_EVENTS


def _post(url: str, key: str, body: dict[str, Any], timeout: float) -> Any:
    request = urllib.request.Request(
        url, data=orjson.dumps(body), method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return orjson.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        raise SendFailed(f"the collector answered {exc.code} to {url}") from None
    except (OSError, ValueError) as exc:  # refused, reset, timed out, not JSON
        raise SendFailed(f"{url}: {exc}") from None


async def post(base: str, key: str, path: str, body: dict[str, Any], timeout: float) -> Any:
    """POST ``body`` as JSON to ``base + path``; its JSON answer. Raises SendFailed."""
    return await asyncio.to_thread(_post, base + path, key, body, max(timeout, 0.05))
