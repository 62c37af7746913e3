"""Fairness across owners on a sharded ValkeyStore (default 64 shards): one owner's backlog
does not delay another owner's runs submitted after it.

Deficit round robin holds per shard (the conformance suite checks it on one shard); here
the whole path runs: A's 1,000 runs spread over all 64 shards, B's 10 submitted after them
on ten of those shards, one worker claiming 20 at a time. On a shard where both wait, B
enters level with A and the older head breaks the tie, so B's run comes out on the second
visit; the worker visits the rung shards in turn, so every shard is visited about once per
64 runs claimed, and B is done after about two rounds: ~128 of A's runs. Without fairness
(FIFO per shard) B's last run would wait for its whole shard of A's: after ~950 of them.
"""

from __future__ import annotations

import asyncio

from pyrula.workflows import RunStatus, ValkeyStore
from tests.conftest import await_until
from tests.integration.valkey_support import (
    LEDGER,
    all_ended,
    keys_on_shards,
    make_worker,
    one_step,
    opened,
    serving,
    statuses,
)

A_RUNS = 1000
B_SHARDS = [3, 9, 17, 22, 30, 38, 41, 50, 57, 63]
#: Two rounds over the 64 shards, plus one round of slack (runs in flight, claims that
#: take a second run from a shard whose neighbour ran dry).
BOUND = 3 * 64


async def test_a_backlog_of_one_owner_does_not_delay_another_owner(
    valkey_url: str, valkey_namespace: str
) -> None:
    LEDGER.clear()
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace)  # 64 shards
    a_tags = [f"{valkey_namespace}-A{i}" for i in range(A_RUNS)]
    b_tags = [f"{valkey_namespace}-B{i}" for i in range(len(B_SHARDS))]
    async with opened(store):
        worker = make_worker(store, [one_step], max_concurrent_runs=20)
        client = worker.client
        a_runs: list[str] = []
        for start in range(0, A_RUNS, 100):
            a_runs += [h.run_id for h in await asyncio.gather(*(
                client.submit(one_step, {"tag": t}, owner="A")
                for t in a_tags[start:start + 100]))]
        b_runs = [(await client.submit(one_step, {"tag": t}, owner="B",
                                       idempotency_key=key)).run_id
                  for t, key in zip(b_tags, keys_on_shards(B_SHARDS, 64), strict=True)]
        assert [int(r[12:16], 16) for r in b_runs] == B_SHARDS
        assert len({int(r[12:16], 16) for r in a_runs}) == 64  # A's backlog is everywhere

        async with serving(worker):
            await all_ended(store, b_runs, timeout=30)
            await await_until(lambda: len(LEDGER.order) == A_RUNS + len(b_tags), timeout=30,
                              what="every run's step")
            await all_ended(store, a_runs, timeout=30)
        assert await statuses(store, [*a_runs, *b_runs]) == {
            RunStatus.COMPLETED: A_RUNS + len(b_tags)}

    order = [tag for _, tag in LEDGER.order]
    assert sorted(order) == sorted(a_tags + b_tags)  # every step ran exactly once
    b_set = set(b_tags)
    last_b = max(i for i, tag in enumerate(order) if tag in b_set)
    a_before_last_b = last_b + 1 - len(b_tags)
    # When B's last run started, most of A's runs had not (read from the ledger's order,
    # not from when the test saw B done: its polling lets A's runs go on meanwhile).
    assert a_before_last_b < BOUND, f"B's last run started after {a_before_last_b} of A's"
