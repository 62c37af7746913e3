"""Shared vocabulary of the store contract suite.

Every test takes the ``store`` fixture (tests/conftest.py) and talks to it only through
the Store protocol (pyrula.workflows.stores.base), so the same tests hold any backend; a
backend joins the suite as one more param of that fixture. Time is a fake: tests pass
``now=`` from a local variable based on ``T0``, and no test sleeps to let time pass.
Fake times are whole or binary fractions of seconds so that every backend stores them
exactly (Lua's cjson keeps 14 significant digits).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from pyrula.workflows.events import Event, EventType, make_event
from pyrula.workflows.records import ClaimedRun, PoisonPolicy, RunInfo, RunStatus
from pyrula.workflows.stores.base import Store

#: The fake epoch every test starts from (2027-01-15).
T0 = 1_800_000_000.0
#: The lock TTL tests claim with, in fake seconds.
TTL = 30.0
#: The workflow name tests use when the name does not matter.
WF = "conformance.wf"
WORKER = "worker-1"


def ev(type_: EventType, ts: float, **fields: Any) -> Event:
    """An event as the engine would write it (the store assigns ``seq``)."""
    return make_event(type_, ts, **fields)


def types(events: list[Event]) -> list[str]:
    return [str(e["type"]) for e in events]


def seqs(events: list[Event]) -> list[int]:
    return [int(e["seq"]) for e in events]


def last_seq(claimed: ClaimedRun) -> int:
    """The seq of the claim's ``run:started``: what the new attempt knows of its journal."""
    return int(claimed.journal[-1]["seq"])


async def submit(
    store: Store,
    name: str = WF,
    params: Any = None,
    *,
    now: float = T0,
    owner: str | None = None,
    key: str | None = None,
) -> str:
    """Submit a run that must be new; return its id."""
    handle, created = await store.submit(
        name, params, now=now, owner=owner, idempotency_key=key
    )
    assert created, f"submit of {name!r} with key {key!r} did not create a run"
    return handle.run_id


async def take(
    store: Store, run_id: str, *, now: float = T0, worker: str = WORKER, ttl: float = TTL
) -> ClaimedRun:
    """Claim this queued run (``claim_run``), failing the test if it cannot be claimed."""
    claimed = await store.claim_run(run_id, worker, now=now, lock_ttl=ttl)
    assert claimed is not None, f"run {run_id} could not be claimed"
    assert claimed.run_id == run_id
    return claimed


async def running(
    store: Store,
    name: str = WF,
    params: Any = None,
    *,
    now: float = T0,
    owner: str | None = None,
    worker: str = WORKER,
    ttl: float = TTL,
) -> ClaimedRun:
    """A freshly submitted run, claimed: attempt 1 holds its lock until ``now + ttl``."""
    run_id = await submit(store, name, params, now=now, owner=owner)
    return await take(store, run_id, now=now, worker=worker, ttl=ttl)


async def info(store: Store, run_id: str) -> RunInfo:
    found = await store.get_run(run_id)
    assert found is not None, f"run {run_id} is unknown to the store"
    return found


async def journal(store: Store, run_id: str) -> list[Event]:
    return await store.read_events(run_id)


async def complete(
    store: Store, run_id: str, token: int, result: Any = None, *, now: float = T0
) -> None:
    """End a claimed run as the engine does on success."""
    await store.finish(
        run_id,
        token,
        [ev(EventType.RUN_COMPLETED, now, result=result)],
        now=now,
        status=RunStatus.COMPLETED,
        result=result,
    )


async def sleep(store: Store, run_id: str, token: int, wake_at: float, *, now: float) -> None:
    """Park a claimed run on a timer, as ``ctx.sleep`` does."""
    parked = await store.park(
        run_id,
        token,
        [ev(EventType.RUN_SLEEPING, now, wake_at=wake_at)],
        now=now,
        wake_at=wake_at,
        signals=[],
        known_seq=len(await journal(store, run_id)),
    )
    assert parked.parked


async def wait_for(
    store: Store,
    run_id: str,
    token: int,
    signal: str,
    *,
    now: float,
    wake_at: float | None = None,
) -> None:
    """Park a claimed run until ``signal`` arrives, as ``ctx.wait_for_signal`` does."""
    parked = await store.park(
        run_id,
        token,
        [ev(EventType.RUN_WAITING, now, signal=signal)],
        now=now,
        wake_at=wake_at,
        signals=[signal],
        known_seq=len(await journal(store, run_id)),
    )
    assert parked.parked


async def orphan(store: Store, run_id: str, *, now: float) -> None:
    """Make a running run's lock lapse and let the orphan scan requeue it."""
    outcomes = await store.reclaim(None, now=now, limit=1000, poison=PoisonPolicy())
    assert run_id in {o.run_id for o in outcomes}


def require_global_order(store: Any) -> None:
    """Skip on a store whose ordering holds per shard only (Valkey with shard_count > 1):
    there deficit round robin and FIFO hold within each shard, as docs/valkey.md says, and
    tests/integration/test_valkey_fairness.py checks fairness across shards."""
    if getattr(store, "shard_count", 1) > 1:
        pytest.skip("ordering is per shard on a sharded store")


def drawn(max_examples: int) -> settings:
    """Hypothesis settings for a test that draws operations on the (function-scoped)
    ``store``: no deadline, the store's own latency is not the test's."""
    return settings(max_examples=max_examples, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@contextlib.contextmanager
def store_loop(store: Any) -> Iterator[asyncio.Runner]:
    """One event loop for a synchronous Hypothesis test of the async ``store`` (every
    example runs its coroutines on it); the store's connections on it are closed after."""
    with asyncio.Runner() as runner:
        try:
            yield runner
        finally:
            aclose = getattr(store, "aclose", None)
            if aclose is not None:
                runner.run(aclose())
