"""Store contract: schedules (create overwrites, list, delete, due, compare-and-set advance,
pause) and the control calls on top of them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from pyrula.errors import ScheduleNotFound, WorkflowNotFound
from pyrula.workflows.schedules import Schedule
from pyrula.workflows.schedules.control import (
    apause_schedule,
    aresume_schedule,
    arun_schedule_now,
    pause_schedule,
    resume_schedule,
    run_schedule_now,
)
from pyrula.workflows.stores.base import Store
from tests.conformance.support import T0, WF, info

HOUR = 3600.0


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def hourly(schedule_id: str | None = "s1", name: str = WF, **kwargs: object) -> Schedule:
    """Fires on the hour; created at T0 (which is 2027-01-15 08:00 UTC, on the hour)."""
    return Schedule.create(name, "0 * * * *", {"n": 1}, schedule_id=schedule_id,
                           created_at=T0, **kwargs)  # type: ignore[arg-type]


def test_create_get_list_delete(store: Store) -> None:
    stored = store.schedule_create(hourly("b"), now=T0 + 10)
    store.schedule_create(hourly("a", every=None), now=T0 + 10)
    assert stored.schedule_id == "b"
    assert stored.next_run_at == at(T0 + HOUR)
    assert stored.paused is False
    assert store.schedule_get("b") == stored
    assert [s.schedule_id for s in store.schedule_list()] == ["a", "b"]
    listed = store.schedule_list()[1]
    assert (listed.name, listed.cron, listed.every, listed.params, listed.timezone,
            listed.overlap, listed.catchup_window) == (WF, "0 * * * *", None, {"n": 1}, "UTC",
                                                     "skip", None)
    assert store.schedule_delete("b") is True
    assert store.schedule_delete("b") is False
    assert store.schedule_get("b") is None
    assert [s.schedule_id for s in store.schedule_list()] == ["a"]


async def test_async_twins(store: Store) -> None:
    sched = Schedule.create(WF, every=timedelta(minutes=5), schedule_id="i", created_at=T0,
                            timezone="Europe/Berlin", overlap="allow",
                            catchup_window=timedelta(minutes=2))
    stored = await store.aschedule_create(sched, now=T0 + 301)
    assert stored.next_run_at == at(T0 + 600)
    assert stored.every == timedelta(minutes=5) and stored.catchup_window == timedelta(minutes=2)
    assert (stored.timezone, stored.overlap) == ("Europe/Berlin", "allow")
    assert await store.aschedule_get("i") == stored
    assert await store.aschedule_list() == [stored]
    assert await store.aschedule_delete("i") is True
    assert await store.aschedule_get("i") is None


def test_params_round_trip_exactly(store: Store) -> None:
    params = {"pi": 3.141592653589793, "big": 2**53 + 1, "text": "ünï {x} \n", "none": None,
              "list": [1, 2.5, "3"], "nested": {"a": {"b": []}}}
    store.schedule_create(Schedule.create(WF, "0 * * * *", params, schedule_id="p",
                                          created_at=T0), now=T0)
    got = store.schedule_get("p")
    assert got is not None and got.params == params


async def test_create_overwrites_reenables_and_resets_next_run_at(store: Store) -> None:
    store.schedule_create(hourly("s1"), now=T0)
    assert await store.schedule_set_paused("s1", True)
    await store.schedule_advance("s1", expected_next_run_at=None, next_run_at=None,
                                 run_id="run-1", run_at=T0 + 5)
    replaced = Schedule.create(WF, "30 * * * *", {"n": 2}, schedule_id="s1", created_at=T0)
    stored = store.schedule_create(replaced, now=T0 + 2 * HOUR + 60)
    assert len(store.schedule_list()) == 1
    assert stored.paused is False
    assert stored.cron == "30 * * * *" and stored.params == {"n": 2}
    assert stored.next_run_at == at(T0 + 2 * HOUR + 1800)
    assert stored.last_run_id == "run-1"  # kept, so overlap=skip still sees it
    due = await store.schedules_due([WF], now=T0 + 3 * HOUR, limit=10)
    assert [s.schedule_id for s in due] == ["s1"]


def test_without_an_id_every_create_adds_a_schedule(store: Store) -> None:
    first = store.schedule_create(hourly(None), now=T0)
    second = store.schedule_create(hourly(None), now=T0)
    assert first.schedule_id != second.schedule_id
    assert len(store.schedule_list()) == 2


def test_create_refuses_what_is_not_a_schedule(store: Store) -> None:
    with pytest.raises(TypeError, match="Schedule"):
        store.schedule_create({"name": WF})  # type: ignore[arg-type]


async def test_due_lists_unpaused_schedules_of_the_names_most_overdue_first(
    store: Store,
) -> None:
    store.schedule_create(hourly("late"), now=T0)  # next: T0 + 1 h
    store.schedule_create(
        Schedule.create(WF, "30 * * * *", schedule_id="early", created_at=T0), now=T0
    )  # next: T0 + 30 min
    store.schedule_create(
        Schedule.create(WF, "0 0 * * *", schedule_id="tomorrow", created_at=T0), now=T0
    )
    store.schedule_create(hourly("other", name="conformance.other"), now=T0)
    store.schedule_create(hourly("paused"), now=T0)
    await store.schedule_set_paused("paused", True)

    assert await store.schedules_due([WF], now=T0 + 1799, limit=10) == []
    due = await store.schedules_due([WF], now=T0 + HOUR, limit=10)
    assert [s.schedule_id for s in due] == ["early", "late"]
    assert [s.schedule_id for s in await store.schedules_due([WF], now=T0 + HOUR, limit=1)] == [
        "early"
    ]
    both = await store.schedules_due([WF, "conformance.other"], now=T0 + HOUR, limit=10)
    assert sorted(s.schedule_id for s in both) == ["early", "late", "other"]
    assert await store.schedules_due([], now=T0 + HOUR, limit=10) == []


async def test_advance_is_a_compare_and_set(store: Store) -> None:
    store.schedule_create(hourly("s1"), now=T0)
    due_at = T0 + HOUR
    assert await store.schedule_advance("s1", expected_next_run_at=due_at,
                                        next_run_at=due_at + HOUR) is True
    # a second worker that read the old next_run_at loses
    assert await store.schedule_advance("s1", expected_next_run_at=due_at,
                                        next_run_at=due_at + HOUR) is False
    got = store.schedule_get("s1")
    assert got is not None and got.next_run_at == at(due_at + HOUR)
    assert await store.schedules_due([WF], now=due_at + 60, limit=10) == []
    assert [s.schedule_id for s in await store.schedules_due([WF], now=due_at + HOUR,
                                                             limit=10)] == ["s1"]
    assert await store.schedule_advance("nope", expected_next_run_at=due_at,
                                        next_run_at=due_at + HOUR) is False


async def test_concurrent_advances_of_one_occurrence_move_it_once(store: Store) -> None:
    store.schedule_create(hourly("s1"), now=T0)
    results = await asyncio.gather(*(
        store.schedule_advance("s1", expected_next_run_at=T0 + HOUR,
                               next_run_at=T0 + 2 * HOUR, run_id=f"run-{i}", run_at=T0 + HOUR)
        for i in range(8)
    ))
    assert results.count(True) == 1


async def test_advance_records_the_latest_submitted_run_whatever_the_compare(
    store: Store,
) -> None:
    store.schedule_create(hourly("s1"), now=T0)
    moved = await store.schedule_advance("s1", expected_next_run_at=T0, next_run_at=T0 + HOUR,
                                         run_id="run-b", run_at=T0 + 20)
    assert moved is False  # the compare failed, the run is recorded anyway
    got = store.schedule_get("s1")
    assert got is not None
    assert (got.last_run_id, got.last_run_at) == ("run-b", at(T0 + 20))
    # a run submitted earlier does not replace a later one
    await store.schedule_advance("s1", expected_next_run_at=None, next_run_at=None,
                                 run_id="run-a", run_at=T0 + 10)
    got = store.schedule_get("s1")
    assert got is not None and got.last_run_id == "run-b"
    await store.schedule_advance("s1", expected_next_run_at=None, next_run_at=None,
                                 run_id="run-c", run_at=T0 + 30)
    got = store.schedule_get("s1")
    assert got is not None and got.last_run_id == "run-c"
    assert got.next_run_at == at(T0 + HOUR)  # expected None moves nothing


async def test_pause_and_unpause(store: Store) -> None:
    store.schedule_create(hourly("s1"), now=T0)
    assert await store.schedule_set_paused("s1", True) is True
    got = store.schedule_get("s1")
    assert got is not None and got.paused is True
    assert await store.schedules_due([WF], now=T0 + 10 * HOUR, limit=10) == []
    # a paused schedule still advances (a worker that read it before the pause)
    assert await store.schedule_advance("s1", expected_next_run_at=T0 + HOUR,
                                        next_run_at=T0 + 2 * HOUR)
    assert await store.schedules_due([WF], now=T0 + 10 * HOUR, limit=10) == []
    assert await store.schedule_set_paused("s1", False, next_run_at=T0 + 5 * HOUR) is True
    got = store.schedule_get("s1")
    assert got is not None and got.paused is False and got.next_run_at == at(T0 + 5 * HOUR)
    assert await store.schedules_due([WF], now=T0 + 5 * HOUR - 1, limit=10) == []
    assert len(await store.schedules_due([WF], now=T0 + 5 * HOUR, limit=10)) == 1
    assert await store.schedule_set_paused("nope", True) is False


# --- control ------------------------------------------------------------------------------


async def test_control_pause_resume_and_run_now(store: Store) -> None:
    store.schedule_create(hourly("s1"), now=T0)
    await apause_schedule(store, "s1")
    got = store.schedule_get("s1")
    assert got is not None and got.paused

    handle = await arun_schedule_now(store, "s1")  # paused or not
    run = await info(store, handle.run_id)
    assert run.name == WF and run.params == {"n": 1} and run.status == "queued"
    assert run.idempotency_key is not None
    assert run.idempotency_key.startswith("schedule:s1:manual:")
    again = await arun_schedule_now(store, "s1")
    assert again.run_id != handle.run_id  # each call submits its own run
    got = store.schedule_get("s1")
    assert got is not None and got.last_run_id == again.run_id

    await aresume_schedule(store, "s1")
    got = store.schedule_get("s1")
    assert got is not None and not got.paused
    # resumed from the first occurrence after now: what fell while paused is not fired
    now = datetime.now(UTC)
    assert now < got.next_run_at <= now + timedelta(hours=1)


def test_control_sync_calls(store: Store) -> None:
    store.schedule_create(hourly("s1"), now=T0)
    pause_schedule(store, "s1")
    got = store.schedule_get("s1")
    assert got is not None and got.paused
    resume_schedule(store, "s1")
    got = store.schedule_get("s1")
    assert got is not None and not got.paused
    handle = run_schedule_now(store, "s1")
    assert handle.name == WF


@pytest.mark.parametrize("call", [pause_schedule, resume_schedule, run_schedule_now])
def test_control_names_an_unknown_schedule(store: Store, call: object) -> None:
    with pytest.raises(ScheduleNotFound, match="no schedule with id 'ghost'") as caught:
        call(store, "ghost")  # type: ignore[operator]
    assert isinstance(caught.value, WorkflowNotFound)
