"""Store contract: claims are fair across owners (deficit round robin), FIFO within one."""

from __future__ import annotations

from pyrula.workflows.stores.base import Store
from tests.conformance.support import T0, TTL, WF, WORKER, complete, require_global_order, submit


async def _claim_one_at_a_time(store: Store, count: int, now: float) -> list[str]:
    order = []
    for _ in range(count):
        batch = await store.claim(WORKER, [WF], limit=1, now=now, lock_ttl=TTL)
        assert len(batch) == 1
        order.append(batch[0].run_id)
    return order


async def test_a_late_small_owner_is_not_stuck_behind_a_big_one(store: Store) -> None:
    require_global_order(store)
    big = [await submit(store, owner="big", now=T0 + i) for i in range(50)]
    small = [await submit(store, owner="small", now=T0 + 50 + i) for i in range(5)]

    first = await _claim_one_at_a_time(store, 10, T0 + 100)

    assert set(small) <= set(first), "the small owner's runs waited behind the big one's"
    rest = await _claim_one_at_a_time(store, 45, T0 + 100)
    order = first + rest
    assert [r for r in order if r in set(big)] == big  # FIFO within each owner
    assert [r for r in order if r in set(small)] == small


async def test_a_newcomer_does_not_starve_an_owner_already_served(store: Store) -> None:
    """A new owner starts level with the others, not at zero ahead of their history."""
    require_global_order(store)
    big = [await submit(store, owner="big", now=T0 + i) for i in range(50)]
    assert await _claim_one_at_a_time(store, 20, T0 + 60) == big[:20]
    for i in range(20):
        await submit(store, owner="new", now=T0 + 70 + i)

    after = await _claim_one_at_a_time(store, 10, T0 + 100)

    assert len([r for r in after if r in set(big)]) >= 4, "the newcomer took over the queue"
    assert len([r for r in after if r not in set(big)]) >= 4


async def test_a_batch_claim_is_fair_too(store: Store) -> None:
    require_global_order(store)
    for i in range(50):
        await submit(store, owner="big", now=T0 + i)
    small = [await submit(store, owner="small", now=T0 + 50 + i) for i in range(5)]

    batch = await store.claim(WORKER, [WF], limit=10, now=T0 + 100, lock_ttl=TTL)

    assert set(small) <= {c.run_id for c in batch}


async def test_runs_without_owner_share_one_tenant(store: Store) -> None:
    require_global_order(store)
    for i in range(20):
        await submit(store, now=T0 + i)
    tenant = [await submit(store, owner="tenant-x", now=T0 + 20 + i) for i in range(3)]

    first = await _claim_one_at_a_time(store, 6, T0 + 100)

    assert set(tenant) <= set(first)


async def test_an_owner_is_not_charged_for_runs_served_while_nobody_else_waited(
    store: Store,
) -> None:
    """An owner whose queue emptied comes back level with the others, not behind its past."""
    require_global_order(store)
    history = [await submit(store, owner="a", now=T0 + i) for i in range(20)]
    for run_id in await _claim_one_at_a_time(store, 20, T0 + 30):
        assert run_id in history
    b = [await submit(store, owner="b", now=T0 + 40 + i) for i in range(20)]
    a = [await submit(store, owner="a", now=T0 + 60 + i) for i in range(5)]

    first = await _claim_one_at_a_time(store, 10, T0 + 100)

    assert set(a) <= set(first), "owner a waited behind b for the runs a had before b came"
    assert [r for r in first if r in set(b)] == b[:5]


async def test_fairness_holds_across_finished_runs(store: Store) -> None:
    """Claims interleave owners while runs keep finishing, one worker slot at a time."""
    require_global_order(store)
    ids = {
        owner: [await submit(store, owner=owner, now=T0 + i * 0.25) for i in range(6)]
        for owner in ("x", "y", "z")
    }
    owner_of = {run_id: owner for owner, runs in ids.items() for run_id in runs}

    served = []
    for step in range(18):
        [claimed] = await store.claim(WORKER, [WF], limit=1, now=T0 + 10 + step, lock_ttl=TTL)
        served.append(owner_of[claimed.run_id])
        await complete(store, claimed.run_id, claimed.token, now=T0 + 10 + step)

    for start in range(0, 18, 3):
        assert sorted(served[start:start + 3]) == ["x", "y", "z"], served
