"""The sorted sets of runs are skiplists from their first member, and hold exactly their
runs.

A small sorted set is a listpack on the server (up to 128 members by default), where every
insert and score change walks the whole set; the store's Lua makes each set of runs it
creates a skiplist, by adding and at once removing a member too long for a listpack. What
a user would notice if that went wrong is a set that lost or gained members. The drawn
sequences of submits, claims (by id, and a worker's batches), parks on a timer, wakes and
finishes below hold each set's members to a small model, and its encoding to a skiplist,
after every step, on the function library and on the script path.
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
#: The sets of runs, by key suffix.
GROWING = (":index", ":times", ":timers")

#: One op of a drawn sequence: ("submit" | "wake", 0), ("claim" | "park" | "finish", which
#: run), or ("claim_many", how many: a worker's claim, which chooses the runs).
OPS = st.one_of(
    st.tuples(st.sampled_from(["submit", "wake"]), st.just(0)),
    st.tuples(st.sampled_from(["claim", "park", "finish"]), st.integers(0, 10_000)),
    st.tuples(st.just("claim_many"), st.integers(1, 8)),
)


class Model:
    """The runs each set of runs holds."""

    def __init__(self, store: ValkeyStore) -> None:
        self.keys = store.connection.keys
        self.queued: list[str] = []
        self.running: dict[str, int] = {}  # run id -> its attempt's token
        self.parked: set[str] = set()
        self.sets: dict[str, set[str]] = {}

    def key(self, run_id: str, suffix: str) -> str:
        return f"{self.keys.base_of_run(run_id)}{suffix}"

    def put(self, run_id: str, suffix: str) -> None:
        key = self.key(run_id, suffix)
        self.sets.setdefault(key, set()).add(run_id)

    def take(self, run_id: str, suffix: str) -> None:
        key = self.key(run_id, suffix)
        self.sets[key].discard(run_id)
        if not self.sets[key]:  # the server deletes an emptied set
            del self.sets[key]


def _sets_of_runs(client: redis.Redis, namespace: str) -> Iterator[str]:
    for key in client.scan_iter(match=f"{namespace}:*", count=1000):
        if key.endswith(GROWING):
            yield key


async def _apply(store: ValkeyStore, model: Model, op: tuple[str, int], now: float) -> None:
    kind, pick = op
    if kind == "submit":
        handle, _ = await store.submit(NAME, {}, now=now)
        model.queued.append(handle.run_id)
        model.put(handle.run_id, ":index")
    elif kind == "wake":
        # Every timer is due long after `now`: the parked runs are queued again.
        await store.wake_due(now=now + 10_000, limit=1000)
        for run_id in sorted(model.parked):
            model.take(run_id, ":timers")
            model.queued.append(run_id)
        model.parked.clear()
    elif kind == "claim_many":
        for claimed in await store.claim("w", [NAME], limit=pick, now=now, lock_ttl=30.0):
            model.queued.remove(claimed.run_id)
            model.running[claimed.run_id] = claimed.token
            model.put(claimed.run_id, ":times")
    elif kind == "claim" and model.queued:
        run_id = model.queued.pop(pick % len(model.queued))
        claimed = await store.claim_run(run_id, "w", now=now, lock_ttl=30.0)
        assert claimed is not None
        model.running[run_id] = claimed.token
        model.put(run_id, ":times")
    elif kind in ("park", "finish") and model.running:
        run_id = sorted(model.running)[pick % len(model.running)]
        token = model.running.pop(run_id)
        if kind == "finish":  # its lock's entry becomes its end's: a score change
            await store.finish(run_id, token, [], now=now, status=RunStatus.COMPLETED,
                               result=1)
            return
        parked = await store.park(run_id, token, [], now=now, wake_at=now + 3600,
                                  signals=[], known_seq=1)
        assert parked.parked
        model.take(run_id, ":times")
        model.put(run_id, ":timers")
        model.parked.add(run_id)


@pytest.mark.parametrize("mode", ["functions", "scripts"])
def test_sets_of_runs_are_skiplists_holding_exactly_their_runs(
    valkey_server: Server, mode: str
) -> None:
    with asyncio.Runner() as loop, valkey_server.client(decode_responses=True) as admin:

        @settings(max_examples=12, deadline=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture,
                                         HealthCheck.too_slow])
        @given(shard_count=st.integers(1, 4), ops=st.lists(OPS, min_size=1, max_size=40))
        def check(shard_count: int, ops: list[tuple[str, int]]) -> None:
            namespace = f"t{uuid.uuid4().hex[:16]}"
            store = ValkeyStore(url=valkey_server.url, namespace=namespace,
                                shard_count=shard_count)
            store.connection.code.functions = mode == "functions"
            model = Model(store)
            try:
                for n, op in enumerate(ops):
                    loop.run(_apply(store, model, op, now=1_000_000.0 + n))
                    held = {key: set(admin.zrange(key, 0, -1))
                            for key in _sets_of_runs(admin, namespace)}
                    assert held == model.sets
                    assert {key: admin.object("encoding", key) for key in held} == \
                        dict.fromkeys(held, "skiplist")
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
