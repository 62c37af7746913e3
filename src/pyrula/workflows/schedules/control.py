"""Pause, resume and trigger schedules from scripts (sync) or from a loop (``a``-prefixed).

Each takes any store (``ScheduleStore``) and raises ``ScheduleNotFound`` (a
``WorkflowNotFound``) naming an unknown id. ``now`` (epoch seconds, default the system
clock) is for tests that drive a worker with a manual clock.
"""

from __future__ import annotations

import time
import uuid

from pyrula.errors import ScheduleNotFound
from pyrula.workflows.records import RunHandle
from pyrula.workflows.stores.admin import run_for
from pyrula.workflows.stores.base import ScheduleStore, Store


async def apause_schedule(store: ScheduleStore, schedule_id: str) -> None:
    """Stop the schedule from firing until ``resume_schedule``; a run in flight goes on."""
    if not await store.schedule_set_paused(schedule_id, True):
        raise _unknown(schedule_id)


async def aresume_schedule(
    store: Store, schedule_id: str, *, now: float | None = None
) -> None:
    """Let a paused schedule fire again, from its first occurrence after now: occurrences
    that fell while it was paused are not fired."""
    sched = await store.aschedule_get(schedule_id)
    if sched is None:
        raise _unknown(schedule_id)
    following = sched.next_after(time.time() if now is None else now).timestamp()
    if not await store.schedule_set_paused(schedule_id, False, next_run_at=following):
        raise _unknown(schedule_id)


async def arun_schedule_now(
    store: Store, schedule_id: str, *, now: float | None = None
) -> RunHandle:
    """Submit one run of the schedule at once (paused or not, whatever its overlap
    policy). It becomes the schedule's last run, which its ``overlap="skip"`` check sees."""
    sched = await store.aschedule_get(schedule_id)
    if sched is None:
        raise _unknown(schedule_id)
    if now is None:
        now = time.time()
    # A key that names the schedule but never matches an occurrence's: triggering by hand
    # must not swallow (or be swallowed by) the run of an occurrence.
    key = f"schedule:{schedule_id}:manual:{uuid.uuid4().hex}"
    handle, _ = await store.submit(sched.name, sched.params, now=now, idempotency_key=key)
    await store.schedule_advance(
        schedule_id, expected_next_run_at=None, next_run_at=None, run_id=handle.run_id,
        run_at=now,
    )
    return handle


def pause_schedule(store: ScheduleStore, schedule_id: str) -> None:
    run_for(store, apause_schedule(store, schedule_id))


def resume_schedule(
    store: Store, schedule_id: str, *, now: float | None = None
) -> None:
    run_for(store, aresume_schedule(store, schedule_id, now=now))


def run_schedule_now(
    store: Store, schedule_id: str, *, now: float | None = None
) -> RunHandle:
    return run_for(store, arun_schedule_now(store, schedule_id, now=now))


def _unknown(schedule_id: str) -> ScheduleNotFound:
    return ScheduleNotFound(f"no schedule with id {schedule_id!r}")


__all__ = [
    "apause_schedule",
    "aresume_schedule",
    "arun_schedule_now",
    "pause_schedule",
    "resume_schedule",
    "run_schedule_now",
]
