"""Runs that need a person: the stuck ones and retrying a failed one.

Shared by ``pyrula runs stuck`` / ``pyrula runs retry`` and the dashboard, so that the
shell and the page list the same runs and a retry from either is the same run: it is
submitted with the idempotency key ``retry:<RUN_ID>``, so retrying one run twice (from
the shell, then the page) returns the run the first retry made. Store and client calls
only: the fleet's supervisor serves the dashboard and must not load the engine.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

from pyrula.workflows.client import WorkflowClient
from pyrula.workflows.events import BUILD_SIGNAL
from pyrula.workflows.records import RunHandle, RunInfo, RunStatus

logger = logging.getLogger(__name__)

#: The prefix of the idempotency key a retry is submitted with: ``retry:<original id>``,
#: so retrying the same run twice returns the same new run, and the new run names the
#: one it retries.
RETRY_KEY_PREFIX = "retry:"
#: The error codes of the failed runs ``stuck`` lists, and why each is stuck.
STUCK_CODES = {"stranded": "failed: no live worker served its workflow in time",
               "max_retries": "quarantined: crashed more often than its poison policy allows"}


class NotRetryable(ValueError):
    """The run asked to be retried has not failed (only a failed run is retried)."""


def retries_of(info: RunInfo) -> str | None:
    """The id of the run ``info`` retries, if it is a retry."""
    key = info.idempotency_key or ""
    return key[len(RETRY_KEY_PREFIX):] if key.startswith(RETRY_KEY_PREFIX) else None


async def retry_run(client: WorkflowClient, run_id: str) -> RunHandle:
    """Submit a failed (or quarantined) run again from its params, workflow and owner.

    Raises ``WorkflowNotFound`` for an unknown run and :class:`NotRetryable` for one that
    has not failed."""
    info = await client.get(run_id)
    if info.status is not RunStatus.FAILED:
        why = ("has not ended" if not info.status.terminal
               else f"is {info.status.value}, not failed")
        raise NotRetryable(f"run {run_id} {why}; only a failed run can be retried")
    return await client.submit(info.name, info.params, owner=info.owner,
                               idempotency_key=f"{RETRY_KEY_PREFIX}{run_id}",
                               priority=info.priority)


async def stuck_runs(store: Any, limit: int, now: float) -> list[dict[str, Any]]:
    """Runs that will not finish by themselves, up to ``limit`` of each kind: queued for
    a workflow no live worker serves, failed as stranded, quarantined, or parked waiting
    for a build that can replay them. Each a dict: run_id, workflow, status, owner,
    updated_at (epoch seconds), why."""
    client = WorkflowClient(store)
    found: list[dict[str, Any]] = []
    for name in sorted(await store.stranded(now=now)):
        page = await store.list_runs(name=name, status=RunStatus.QUEUED, limit=limit)
        found.extend(stuck_row(info, f"queued: no live worker serves {name!r}")
                     for info in page)
    found.extend(await _failed_stuck(client, limit))
    found.extend(await _build_stuck(client, limit))
    return found


async def _failed_stuck(client: WorkflowClient, limit: int) -> list[dict[str, Any]]:
    """The failed runs ``stuck`` lists, newest first, up to ``limit`` of each code: the
    scan of the failed runs stops once both kinds are full."""
    seen = dict.fromkeys(STUCK_CODES, 0)
    found: list[dict[str, Any]] = []
    failed = client.list_runs(status=RunStatus.FAILED)
    try:
        async for info in failed:
            code = (info.error or {}).get("code")
            if code in STUCK_CODES and seen[code] < limit:
                seen[code] += 1
                found.append(stuck_row(info, STUCK_CODES[code]))
            if all(count >= limit for count in seen.values()):
                break
    finally:
        if isinstance(failed, AsyncGenerator):  # left early: end the page reader now
            await failed.aclose()
    return found


async def _build_stuck(client: WorkflowClient, limit: int) -> list[dict[str, Any]]:
    """Runs parked because no live worker's code can replay them (an upgrade changed their
    workflow incompatibly and the old code is gone): waiting for ``pyrula.build``."""
    found: list[dict[str, Any]] = []
    waiting = client.list_runs(status=RunStatus.WAITING)
    try:
        async for info in waiting:
            if BUILD_SIGNAL not in info.waiting_for:
                continue
            events = await client.events(info.run_id)
            last = next((e for e in reversed(events) if e.get("signal") == BUILD_SIGNAL), {})
            found.append(stuck_row(info, f"waiting for build {last.get('build')}: the code "
                                         f"served now cannot replay it ({last.get('message')})"))
            if len(found) >= limit:
                break
    finally:
        if isinstance(waiting, AsyncGenerator):
            await waiting.aclose()
    return found


def stuck_row(info: RunInfo, why: str) -> dict[str, Any]:
    return {"run_id": info.run_id, "workflow": info.name, "status": info.status.value,
            "owner": info.owner, "updated_at": info.updated_at, "why": why}
