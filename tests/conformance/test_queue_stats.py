"""Store contract: queue_stats (QueueStats), the depth of each workflow's queue and when
its longest-waiting run became claimable."""

from __future__ import annotations

from pyrula.workflows.events import EventType
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import QueueStat, QueueStats, capabilities_of
from tests.conformance.support import (
    T0,
    TTL,
    WF,
    WORKER,
    ev,
    orphan,
    running,
    sleep,
    submit,
    take,
    wait_for,
)

OTHER = "conformance.other"
EMPTY = QueueStat(0, None)


def _stats(store: Store) -> QueueStats:
    stats = capabilities_of(store).queue_stats
    assert stats is not None, f"{store!r} does not offer queue_stats"
    return stats


async def test_an_empty_queue_has_depth_0_for_every_name_asked(store: Store) -> None:
    assert await _stats(store).queue_stats([WF, OTHER]) == {WF: EMPTY, OTHER: EMPTY}
    assert await _stats(store).queue_stats([]) == {}


async def test_submits_count_per_name_with_the_oldest_submit_time(store: Store) -> None:
    await submit(store, WF, now=T0 + 2, owner="tenant-b")
    await submit(store, WF, now=T0 + 1, owner="tenant-a")
    await submit(store, WF, now=T0 + 3, owner="tenant-a")
    await submit(store, OTHER, now=T0 + 5)
    await submit(store, "conformance.unasked", now=T0)

    stats = await _stats(store).queue_stats([WF, OTHER])

    # Names not asked for are not in the answer.
    assert stats == {WF: QueueStat(3, T0 + 1), OTHER: QueueStat(1, T0 + 5)}


async def test_a_claimed_run_leaves_the_count(store: Store) -> None:
    first = await submit(store, now=T0)
    await submit(store, now=T0 + 4)

    await take(store, first, now=T0 + 8)

    assert await _stats(store).queue_stats([WF]) == {WF: QueueStat(1, T0 + 4)}
    [claimed] = await store.claim(WORKER, [WF], limit=10, now=T0 + 9, lock_ttl=TTL)
    assert await _stats(store).queue_stats([WF]) == {WF: EMPTY}
    assert claimed.run_id != first


async def test_a_requeued_run_counts_again_from_its_requeue_time(store: Store) -> None:
    claimed = await running(store, now=T0)
    assert await _stats(store).queue_stats([WF]) == {WF: EMPTY}

    await store.requeue(claimed.run_id, claimed.token, now=T0 + 10, reason="shutdown")

    assert await _stats(store).queue_stats([WF]) == {WF: QueueStat(1, T0 + 10)}
    again = await take(store, claimed.run_id, now=T0 + 11)
    # A run whose worker died is back in the queue from when the orphan scan requeued it.
    await orphan(store, again.run_id, now=T0 + 11 + TTL + 1)
    assert await _stats(store).queue_stats([WF]) == {WF: QueueStat(1, T0 + 11 + TTL + 1)}


async def test_a_run_on_a_future_timer_is_not_counted_until_it_wakes(store: Store) -> None:
    claimed = await running(store, now=T0)
    await sleep(store, claimed.run_id, claimed.token, T0 + 60, now=T0 + 1)
    await submit(store, now=T0 + 2)

    assert await _stats(store).queue_stats([WF]) == {WF: QueueStat(1, T0 + 2)}
    assert await store.wake_due(now=T0 + 59, limit=10) == 0
    assert await _stats(store).queue_stats([WF]) == {WF: QueueStat(1, T0 + 2)}

    assert await store.wake_due(now=T0 + 60, limit=10) == 1

    assert await _stats(store).queue_stats([WF]) == {WF: QueueStat(2, T0 + 2)}
    [queued] = await store.claim(WORKER, [WF], limit=1, now=T0 + 61, lock_ttl=TTL)
    if queued.run_id == claimed.run_id:
        assert await _stats(store).queue_stats([WF]) == {WF: QueueStat(1, T0 + 2)}
    else:  # the woken run is the one left: counted from when it woke, not its submit
        assert await _stats(store).queue_stats([WF]) == {WF: QueueStat(1, T0 + 60)}


async def test_a_run_waiting_for_a_signal_counts_from_when_the_signal_came(
    store: Store,
) -> None:
    claimed = await running(store, now=T0)
    await wait_for(store, claimed.run_id, claimed.token, "approve", now=T0 + 1)
    assert await _stats(store).queue_stats([WF]) == {WF: EMPTY}

    await store.signal(claimed.run_id, "approve", {"ok": True}, now=T0 + 20)

    assert await _stats(store).queue_stats([WF]) == {WF: QueueStat(1, T0 + 20)}


async def test_a_signal_to_a_queued_run_does_not_make_it_younger(store: Store) -> None:
    run_id = await submit(store, now=T0)

    await store.signal(run_id, "note", None, now=T0 + 30)

    assert await _stats(store).queue_stats([WF]) == {WF: QueueStat(1, T0)}


async def test_runs_held_back_by_flow_control_still_count(store: Store) -> None:
    await store.aflow_control_set("tenant-1", max_concurrent=1)
    submitted = {
        await submit(store, now=T0, owner="tenant-1"): T0,
        await submit(store, now=T0 + 1, owner="tenant-1"): T0 + 1,
    }

    [claimed] = await store.claim(WORKER, [WF], limit=10, now=T0 + 2, lock_ttl=TTL)

    assert await store.claim(WORKER, [WF], limit=10, now=T0 + 3, lock_ttl=TTL) == []
    # (On a sharded store either run may be the one claimed.)
    [(_, left_at)] = [(r, t) for r, t in submitted.items() if r != claimed.run_id]
    assert await _stats(store).queue_stats([WF]) == {WF: QueueStat(1, left_at)}


async def test_a_cancelled_queued_run_leaves_the_count(store: Store) -> None:
    run_id = await submit(store, now=T0)
    await submit(store, now=T0 + 1)

    assert await store.cancel(run_id, now=T0 + 2) is True

    assert await _stats(store).queue_stats([WF]) == {WF: QueueStat(1, T0 + 1)}


async def test_a_continued_run_s_successor_counts_from_its_creation(store: Store) -> None:
    claimed = await running(store, now=T0)

    await store.finish(
        claimed.run_id, claimed.token, [ev(EventType.RUN_CONTINUED, T0 + 7)],
        now=T0 + 7, status=RunStatus.CONTINUED, successor_params={"n": 2},
    )

    assert await _stats(store).queue_stats([WF]) == {WF: QueueStat(1, T0 + 7)}
