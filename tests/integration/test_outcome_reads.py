"""How ``client.result()`` waits on a real Valkey: through the store's outcome read (the
four fields of a record that say how a run ended, not the whole record), unless a store
layer in between waits its own way, and with the same answers either way.

What each read costs is measured in benchmarks (``python -m benchmarks.peers``), not here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyrula.workflows import (
    RunCancelled,
    RunFailed,
    SyncWorkflowClient,
    ValkeyStore,
    WorkflowNotFound,
)
from pyrula.workflows.events import EventType
from pyrula.workflows.records import RunError, RunInfo, RunStatus
from pyrula.workflows.stores.capabilities import capabilities_of
from pyrula.workflows.stores.layer import StoreLayer
from tests.conformance.support import T0, complete, drawn, ev, running, store_loop, submit

pytestmark = pytest.mark.valkey


class _Counting(StoreLayer):
    """A layer that waits its own way: it counts the waits that pass through it."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.waits = 0

    async def wait_result(self, run_id: str, timeout: float | None) -> RunInfo:
        self.waits += 1
        return await self.inner.wait_result(run_id, timeout)


class _Plain(StoreLayer):
    """A layer that leaves waiting to the store beneath it."""


@pytest.fixture
def valkey(valkey_url: str, valkey_namespace: str) -> Iterator[ValkeyStore]:
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace)
    yield store
    store.close()


def test_a_layer_that_waits_its_own_way_is_not_gone_around(valkey: ValkeyStore) -> None:
    counting, plain = _Counting(valkey), _Plain(valkey)
    assert capabilities_of(valkey).outcomes is valkey
    assert capabilities_of(plain).outcomes is valkey
    assert capabilities_of(counting).outcomes is None
    with store_loop(valkey) as runner:
        async def ended() -> str:
            claimed = await running(valkey, now=T0)
            await complete(valkey, claimed.run_id, claimed.token, {"n": 1}, now=T0 + 1)
            return claimed.run_id

        run_id = runner.run(ended())
        assert SyncWorkflowClient(counting).result(run_id, timeout=5) == {"n": 1}
        assert counting.waits == 1
        assert SyncWorkflowClient(plain).result(run_id, timeout=5) == {"n": 1}


JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6,
)


def test_the_sync_client_answers_as_the_whole_record_says(valkey: ValkeyStore) -> None:
    """Hypothesis draws how a run ended (a chain of continues before it, or none) and its
    value; the sync client's answer through the outcome read must be the one the whole
    record gives, read through a layer that waits with ``wait_result``."""
    whole = SyncWorkflowClient(_Counting(valkey))
    cut = SyncWorkflowClient(valkey)
    with store_loop(valkey) as runner:

        @drawn(25)
        @given(how=st.sampled_from(["completed", "failed", "cancelled"]),
               continues=st.integers(0, 2), value=JSON)
        def check(how: str, continues: int, value: Any) -> None:
            async def play() -> str:
                first = claimed = await running(valkey, now=T0)
                for _ in range(continues):
                    ended = await valkey.finish(
                        claimed.run_id, claimed.token, [ev(EventType.RUN_CONTINUED, T0)],
                        now=T0, status=RunStatus.CONTINUED, successor_params=value)
                    assert ended.successor_id is not None
                    taken = await valkey.claim_run(ended.successor_id, "w", now=T0,
                                                   lock_ttl=30)
                    assert taken is not None
                    claimed = taken
                if how == "completed":
                    await complete(valkey, claimed.run_id, claimed.token, value, now=T0 + 1)
                elif how == "failed":
                    error = RunError("step_failed", "ValueError", "drawn", {"v": value})
                    await valkey.finish(claimed.run_id, claimed.token, [error.event(T0 + 1)],
                                        now=T0 + 1, status=RunStatus.FAILED,
                                        error=error.as_dict())
                else:
                    await valkey.finish(claimed.run_id, claimed.token,
                                        [ev(EventType.RUN_CANCELLED, T0 + 1)], now=T0 + 1,
                                        status=RunStatus.CANCELLED)
                return first.run_id

            run_id = runner.run(play())
            answers = []
            for client in (whole, cut):
                try:
                    answers.append(("completed", client.result(run_id, timeout=5)))
                except RunFailed as exc:
                    answers.append(("failed", exc.error))
                except RunCancelled:
                    answers.append(("cancelled", None))
            assert answers[0] == answers[1]
            assert answers[1][0] == how
            if how == "completed":
                assert answers[1][1] == value

        check()


def test_an_unknown_run_is_not_found_and_an_open_one_times_out(valkey: ValkeyStore) -> None:
    client = SyncWorkflowClient(valkey)
    with pytest.raises(WorkflowNotFound):
        client.result("f" * 40, timeout=0.1)
    with store_loop(valkey) as runner:
        queued = runner.run(submit(valkey, now=T0))
        with pytest.raises(TimeoutError):
            client.result(queued, timeout=0.05)


async def _end_as(store: ValkeyStore, run_id: str, how: str, value: Any) -> None:
    """End the queued run ``run_id`` ``how`` (``open``: leave it running)."""
    if how == "cancelled":
        assert await store.cancel(run_id, now=T0 + 1)
        return
    claimed = await store.claim_run(run_id, "w", now=T0, lock_ttl=30)
    assert claimed is not None
    if how == "completed":
        await complete(store, run_id, claimed.token, value, now=T0 + 1)
    elif how == "failed":
        error = RunError("step_failed", "ValueError", "drawn", {"v": value})
        await store.finish(run_id, claimed.token, [error.event(T0 + 1)], now=T0 + 1,
                           status=RunStatus.FAILED, error=error.as_dict())
    elif how == "continued":  # and its successor completed
        ended = await store.finish(run_id, claimed.token, [ev(EventType.RUN_CONTINUED, T0)],
                                   now=T0, status=RunStatus.CONTINUED, successor_params={})
        assert ended.successor_id is not None
        await _end_as(store, ended.successor_id, "completed", value)


def _answer(client: SyncWorkflowClient, run_id: str) -> tuple[str, Any]:
    try:
        return ("completed", client.result(run_id, timeout=0.05))
    except RunFailed as exc:
        return ("failed", exc.error)
    except RunCancelled:
        return ("cancelled", None)
    except TimeoutError:
        return ("open", None)


def test_results_read_ahead_are_the_ones_the_store_gives(valkey: ValkeyStore) -> None:
    """Hypothesis draws a batch of runs a sync client submits, how each ended (or that it
    is still open), and the order its results are asked for: mostly the order of
    submission, with jumps back and forth and repeats. Every answer must be the one a
    client that cannot read ahead gets."""
    plain = SyncWorkflowClient(_Counting(valkey))
    with store_loop(valkey) as runner:

        @drawn(20)
        @given(hows=st.lists(st.sampled_from(["completed", "completed", "failed",
                                              "cancelled", "continued", "open"]),
                             min_size=1, max_size=40),
               value=JSON, data=st.data())
        def check(hows: list[str], value: Any, data: st.DataObject) -> None:
            client = SyncWorkflowClient(valkey)
            ids = [client.submit("readahead.wf", {"i": i}).run_id for i in range(len(hows))]
            for run_id, how in zip(ids, hows, strict=True):
                runner.run(_end_as(valkey, run_id, how, value))
            at = 0
            for _ in range(len(ids) + 10):
                if data.draw(st.integers(0, 5), label="jump") == 0:
                    at = data.draw(st.integers(0, len(ids) - 1), label="to")
                run_id = ids[at]
                assert _answer(client, run_id) == _answer(plain, run_id)
                at = min(at + 1, len(ids) - 1)

        check()


def test_results_read_in_submission_order_share_round_trips(valkey: ValkeyStore) -> None:
    client = SyncWorkflowClient(valkey)
    ids = [client.submit("readahead.wf", {"i": i}).run_id for i in range(300)]
    with store_loop(valkey) as runner:
        for i, run_id in enumerate(ids):
            runner.run(_end_as(valkey, run_id, "completed", i))
        stats = valkey.reads.connection.stats
        before = stats["round_trips"]
        assert [client.result(run_id, timeout=5) for run_id in ids] == list(range(300))
        # One read, then windows of 4, 8, 16, 32 and 64 runs: ~10 round trips, not 300.
        assert stats["round_trips"] - before <= 15


@pytest.mark.parametrize("read", ["wait_result", "wait_outcome"])
def test_a_wait_costs_one_round_trip_for_an_ended_run_and_two_for_one_that_ends_later(
    valkey_url: str, valkey_namespace: str, read: str,
) -> None:
    # The runs are set up and ended through a store of their own: only the wait counts.
    waiter = ValkeyStore(url=valkey_url, namespace=valkey_namespace)
    other = ValkeyStore(url=valkey_url, namespace=valkey_namespace)
    stats = waiter.reads.connection.stats

    async def scenario() -> None:
        wait = getattr(waiter, read)
        ended = await running(other, now=T0)
        await complete(other, ended.run_id, ended.token, {"n": 1}, now=T0 + 1)
        await waiter.get_run(ended.run_id)  # the connection opened, the code loaded
        before = stats["round_trips"]
        assert (await wait(ended.run_id, 5)).status is RunStatus.COMPLETED
        assert stats["round_trips"] - before == 1  # the mark's reply is the outcome

        later = await running(other, now=T0)
        before = stats["round_trips"]
        task = asyncio.create_task(wait(later.run_id, 5))
        conn, key = other.reads.connection, other.reads.connection.keys.run(later.run_id)
        deadline = asyncio.get_running_loop().time() + 5
        while await conn.read(key, "HGET", key, "waiter") != "1":  # marked as waited on
            assert asyncio.get_running_loop().time() < deadline, "the wait never marked"
            await asyncio.sleep(0.001)
        await complete(other, later.run_id, later.token, {"n": 2}, now=T0 + 2)
        assert (await task).status is RunStatus.COMPLETED
        assert stats["round_trips"] - before == 2  # the mark, then the blocking read

    with store_loop(waiter) as runner:
        try:
            runner.run(scenario())
        finally:
            runner.run(other.aclose())
