"""The sorted sets that grow with the runs are skiplists from their first member.

A small sorted set is a listpack on the server (up to 128 members by default), where every
insert and score change walks and moves the whole set; the store's Lua makes each such set
it creates a skiplist by adding and at once removing a member too long for a listpack. What
a user would notice if that went wrong is a set that lost or gained members: the drawn
sequences of submits, claims, parks on a timer and finishes below hold each set's members
to what a small model says they are, on the function library and on the script path.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyrula.workflows import RunStatus, ValkeyStore
from tests.servers import Server

NAME = "vk.encoding"
#: The sets kept as skiplists, by key suffix.
GROWING = (":index", ":times", ":timers")

#: One op of a drawn sequence: ("submit" | "wake", 0), or ("claim" | "park" | "finish",
#: which run).
OPS = st.one_of(
    st.tuples(st.sampled_from(["submit", "wake"]), st.just(0)),
    st.tuples(st.sampled_from(["claim", "park", "finish"]), st.integers(0, 10_000)),
)


class Model:
    """Which run ids each growing set of the namespace holds."""

    def __init__(self) -> None:
        self.submitted: list[str] = []
        self.queued: list[str] = []
        self.running: dict[str, int] = {}  # run id -> its attempt's token
        self.timers: set[str] = set()
        self.ended: set[str] = set()

    def expected(self) -> dict[str, set[str]]:
        return {
            ":index": set(self.submitted),
            ":times": set(self.running) | self.ended,
            ":timers": set(self.timers),
        }


def _growing_sets(client: redis.Redis, namespace: str) -> Iterator[tuple[str, str]]:
    for suffix in GROWING:
        for key in client.scan_iter(match=f"{namespace}:*{suffix}", count=1000):
            if key.endswith(suffix):
                yield suffix, key


async def _apply(store: ValkeyStore, model: Model, op: tuple[str, int], now: float) -> None:
    kind, pick = op
    if kind == "submit":
        handle, _ = await store.submit(NAME, {}, now=now)
        model.submitted.append(handle.run_id)
        model.queued.append(handle.run_id)
    elif kind == "wake":
        # Every timer is due long after `now`: the parked runs are queued again.
        await store.wake_due(now=now + 10_000, limit=1000)
        model.queued.extend(sorted(model.timers))
        model.timers.clear()
    elif kind == "claim" and model.queued:
        run_id = model.queued.pop(pick % len(model.queued))
        claimed = await store.claim_run(run_id, "w", now=now, lock_ttl=30.0)
        assert claimed is not None
        model.running[run_id] = claimed.token
    elif kind in ("park", "finish") and model.running:
        run_id = sorted(model.running)[pick % len(model.running)]
        token = model.running.pop(run_id)
        if kind == "finish":
            await store.finish(run_id, token, [], now=now, status=RunStatus.COMPLETED,
                               result=1)
            model.ended.add(run_id)
            return
        parked = await store.park(run_id, token, [], now=now, wake_at=now + 3600,
                                  signals=[], known_seq=1)
        assert parked.parked
        model.timers.add(run_id)


@pytest.mark.parametrize("mode", ["functions", "scripts"])
def test_growing_sets_are_skiplists_holding_exactly_their_runs(
    valkey_server: Server, mode: str
) -> None:
    with asyncio.Runner() as loop, valkey_server.client(decode_responses=True) as admin:

        @settings(max_examples=8, deadline=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture,
                                         HealthCheck.too_slow])
        @given(shard_count=st.integers(1, 4), ops=st.lists(OPS, min_size=1, max_size=40))
        def check(shard_count: int, ops: list[tuple[str, int]]) -> None:
            namespace = f"t{uuid.uuid4().hex[:16]}"
            store = ValkeyStore(url=valkey_server.url, namespace=namespace,
                                shard_count=shard_count)
            store.connection.code.functions = mode == "functions"
            model = Model()
            try:
                for n, op in enumerate(ops):
                    loop.run(_apply(store, model, op, now=1_000_000.0 + n))
                held: dict[str, set[str]] = {suffix: set() for suffix in GROWING}
                for suffix, key in _growing_sets(admin, namespace):
                    assert admin.object("encoding", key) == "skiplist", key
                    held[suffix] |= set(admin.zrange(key, 0, -1))
                assert held == model.expected()
            finally:
                loop.run(store.aclose())
                for key in admin.scan_iter(match=f"{namespace}:*", count=1000):
                    admin.delete(key)

        check()


def test_a_set_emptied_and_made_again_is_a_skiplist_again(
    valkey_url: str, valkey_namespace: str
) -> None:
    """A set is deleted with its last member; the one made next is a skiplist too."""
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=1)

    async def park_then_wake(now: float) -> None:
        handle, _ = await store.submit(NAME, {}, now=now)
        claimed = await store.claim_run(handle.run_id, "w", now=now, lock_ttl=30.0)
        assert claimed is not None
        parked = await store.park(handle.run_id, claimed.token, [], now=now,
                                  wake_at=now + 60, signals=[], known_seq=1)
        assert parked.parked
        (timers,) = admin.scan_iter(match=f"{valkey_namespace}:*:timers")
        assert admin.object("encoding", timers) == "skiplist"
        assert admin.zrange(timers, 0, -1) == [handle.run_id]
        assert await store.wake_due(now=now + 61, limit=10) == 1
        assert list(admin.scan_iter(match=f"{valkey_namespace}:*:timers")) == []

    with asyncio.Runner() as loop, redis.Redis.from_url(valkey_url,
                                                        decode_responses=True) as admin:
        try:
            for n in range(3):
                loop.run(park_then_wake(1_000_000.0 + 10 * n))
        finally:
            loop.run(store.aclose())
