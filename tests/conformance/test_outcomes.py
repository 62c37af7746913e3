"""Store contract: a store's outcome reader (``wait_outcome``, what ``client.result()``
waits with where a store has one) answers exactly as ``wait_result`` does, cut to a
``RunOutcome``: the same status, result, error and successor, the same waits, the same
errors. A store without one is waited on through ``wait_result`` itself."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyrula.errors import WorkflowNotFound
from pyrula.workflows.events import EventType
from pyrula.workflows.records import RunError, RunOutcome, RunStatus
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import capabilities_of
from tests.conformance.support import (
    T0,
    complete,
    drawn,
    ev,
    running,
    store_loop,
    submit,
)

#: How long a test waits for a wake-up the store owes it.
WAKE_DEADLINE = 10.0

JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6,
)


def reader(store: Store) -> Callable[[str, float | None], Coroutine[Any, Any, RunOutcome]]:
    """The store's outcome read, or ``wait_result`` cut to an outcome where it has none."""
    outcomes = capabilities_of(store).outcomes
    if outcomes is not None:
        return outcomes.wait_outcome

    async def via_wait_result(run_id: str, timeout: float | None) -> RunOutcome:
        return RunOutcome.of(await store.wait_result(run_id, timeout))

    return via_wait_result


async def _end(store: Store, how: str, value: Any) -> str:
    """A run ended ``how`` (with ``value`` as its result, or in its error's message)."""
    if how == "cancelled":
        run_id = await submit(store, now=T0)
        assert await store.cancel(run_id, now=T0 + 1)
        return run_id
    claimed = await running(store, now=T0)
    if how == "completed":
        await complete(store, claimed.run_id, claimed.token, value, now=T0 + 1)
    elif how == "failed":
        error = RunError("step_failed", "ValueError", repr(value), {"drawn": value})
        await store.finish(claimed.run_id, claimed.token, [error.event(T0 + 1)], now=T0 + 1,
                           status=RunStatus.FAILED, error=error.as_dict())
    else:
        await store.finish(claimed.run_id, claimed.token, [ev(EventType.RUN_CONTINUED, T0 + 1)],
                           now=T0 + 1, status=RunStatus.CONTINUED, successor_params=value)
    return claimed.run_id


def test_an_ended_run_reads_as_wait_result_says(store: Store) -> None:
    """Hypothesis draws how each run ended and the value it ended with."""
    read = reader(store)
    with store_loop(store) as runner:

        @drawn(25)
        @given(how=st.sampled_from(["completed", "failed", "cancelled", "continued"]),
               value=JSON)
        def check(how: str, value: Any) -> None:
            async def play() -> None:
                run_id = await _end(store, how, value)
                whole = await store.wait_result(run_id, WAKE_DEADLINE)
                outcome = await read(run_id, WAKE_DEADLINE)
                assert outcome == RunOutcome.of(whole)
                assert outcome.status is RunStatus(how)
                if how == "completed":
                    assert outcome.result == value
                if how == "continued":
                    assert outcome.successor_id is not None
            runner.run(play())

        check()


async def test_a_wait_for_the_outcome_is_woken_by_the_finish(store: Store) -> None:
    claimed = await running(store, now=T0)
    waiters = [asyncio.create_task(reader(store)(claimed.run_id, None)) for _ in range(3)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)

    await complete(store, claimed.run_id, claimed.token, {"total": 3}, now=T0 + 1)

    done = await asyncio.wait_for(asyncio.gather(*waiters), WAKE_DEADLINE)
    assert done == [RunOutcome(RunStatus.COMPLETED, {"total": 3})] * 3


async def test_a_wait_for_the_outcome_times_out_and_changes_nothing(store: Store) -> None:
    run_id = await submit(store, now=T0)

    with pytest.raises(TimeoutError):
        await reader(store)(run_id, 0.05)

    after = await store.get_run(run_id)
    assert after is not None and after.status == RunStatus.QUEUED


def test_the_outcome_of_an_unknown_run_is_not_found(store: Store) -> None:
    """Hypothesis draws the ids: any text, and ids shaped like the store's own."""
    read = reader(store)
    with store_loop(store) as runner:

        @drawn(25)
        @given(run_id=st.one_of(st.text(min_size=1, max_size=50),
                                st.from_regex(r"[0-9a-f]{40}", fullmatch=True)))
        def check(run_id: str) -> None:
            with pytest.raises(WorkflowNotFound):
                runner.run(read(run_id, 0.05))

        check()


async def test_outcomes_read_at_once_are_the_records_own(store: Store) -> None:
    """``read_outcomes`` (a sync client's read-ahead): each run's outcome as it stands,
    ended or not, None for a run the store does not hold; nothing waits. A store
    without an outcome reader is read through ``wait_result`` instead."""
    outcomes = capabilities_of(store).outcomes
    done = await _end(store, "completed", {"n": 1})
    failed = await _end(store, "failed", "boom")
    queued = await submit(store, now=T0)
    ids = [done, "f" * 40, queued, failed, done]
    if outcomes is None:
        return  # nothing reads ahead on this store: client.result() waits on wait_result
    read = await asyncio.wait_for(outcomes.read_outcomes(ids), WAKE_DEADLINE)
    expected = []
    for run_id in ids:
        info = await store.get_run(run_id)
        expected.append(None if info is None else RunOutcome.of(info))
    assert read == expected
    assert read[2] is not None and read[2].status is RunStatus.QUEUED
    assert await outcomes.read_outcomes([]) == []
