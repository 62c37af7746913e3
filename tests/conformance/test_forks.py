"""Forks on every store: ``client.fork(run_id, from_step=K, params=None)`` starts a new run
that reuses what the run recorded before step K (step results, recorded values, the
signals its waits took) and runs the rest on today's code, with new params if given."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from pyrula.workflows import (
    InlineWorkflowRunner,
    RunStatus,
    WorkflowContext,
    WorkflowNotFound,
    step,
    workflow,
)
from pyrula.workflows.stores.base import Store
from tests.conformance.support import drawn, store_loop

RAN: list[str] = []


@step(name="forks.reserve")
def reserve(sku: str) -> str:
    RAN.append("reserve")
    return f"r-{sku}"


@step(name="forks.charge")
def charge(amount: int) -> int:
    RAN.append("charge")
    if amount < 0:
        raise ValueError(f"cannot charge {amount}")
    return amount


@step(name="forks.ship")
def ship(reservation: str) -> str:
    RAN.append("ship")
    return f"shipped {reservation}"


@workflow(name="forks.order")
async def order(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, Any]:
    token = str(ctx.uuid4())
    reservation = await reserve(params["sku"])
    approver = await ctx.wait_for_signal("approved")
    charged = await charge(params["amount"])
    return {"token": token, "approver": approver, "charged": charged,
            "shipped": await ship(reservation)}


@pytest.fixture
def runner(store: Store) -> Iterator[InlineWorkflowRunner]:
    r = InlineWorkflowRunner(store=store, workflows=["forks.order"], cloud=False)
    RAN.clear()
    yield r
    asyncio.run(r.aclose())


async def _ran_to_end(runner: InlineWorkflowRunner, params: dict[str, Any]) -> str:
    """A run of ``forks.order`` approved by ``ann``, run to its end (it may fail)."""
    run = await runner.client.submit("forks.order", params, owner="tenant-1")
    await runner.run(run.name, run.run_id)
    await runner.client.signal(run.run_id, "approved", "ann")
    await runner.run(run.name, run.run_id)
    return run.run_id


async def test_a_fork_reuses_the_steps_before_its_point_and_runs_the_rest(
    runner: InlineWorkflowRunner,
) -> None:
    failed = await _ran_to_end(runner, {"sku": "a1", "amount": -5})
    assert (await runner.client.get(failed)).status is RunStatus.FAILED
    source = await runner.client.events(failed)
    token = next(e["result"] for e in source if e.get("step") == "pyrula.uuid4")
    RAN.clear()

    fork = await runner.client.fork(failed, from_step="forks.charge",
                                    params={"sku": "a1", "amount": 7})
    await runner.run(fork.name, fork.run_id)

    info = await runner.client.get(fork.run_id)
    assert info.status is RunStatus.COMPLETED, info.error
    assert info.result == {"token": token, "approver": "ann", "charged": 7,
                           "shipped": "shipped r-a1"}
    assert RAN == ["charge", "ship"], "reserve was reused, not run again"
    assert info.owner == "tenant-1" and info.params == {"sku": "a1", "amount": 7}
    events = await runner.client.events(fork.run_id)
    assert events[0]["idempotency_key"].startswith(f"fork:{failed}:4:")
    forked = next(e for e in events if e["type"] == "run:forked")
    assert {k: forked[k] for k in ("from_run", "from_step", "from_call", "reused")} == {
        "from_run": failed, "from_step": "forks.charge", "from_call": 4, "reused": 1}
    assert [e["type"] for e in events[:3]] == ["run:submitted", "run:started", "run:forked"]


async def test_a_fork_by_position_keeps_the_runs_params_by_default(
    runner: InlineWorkflowRunner,
) -> None:
    done = await _ran_to_end(runner, {"sku": "b2", "amount": 3})
    RAN.clear()

    fork = await runner.client.fork(done, from_step=3)  # reserve, charge, ship: ship
    await runner.run(fork.name, fork.run_id)

    assert await runner.client.result(fork.run_id, timeout=5) == \
        await runner.client.result(done, timeout=5)
    assert RAN == ["ship"]
    again = await runner.client.fork(done, from_step=1)  # before reserve: it waits again
    await runner.run(again.name, again.run_id)
    assert (await runner.client.get(again.run_id)).status is RunStatus.WAITING
    assert RAN == ["ship", "reserve"]


async def test_what_cannot_be_forked_is_named(runner: InlineWorkflowRunner) -> None:
    done = await _ran_to_end(runner, {"sku": "c3", "amount": 1})

    with pytest.raises(ValueError, match=r"never called a step named 'forks\.pack' "
                                         r"\(its steps: forks\.reserve, forks\.charge, "
                                         r"forks\.ship\)"):
        await runner.client.fork(done, from_step="forks.pack")
    for position in (0, 4):
        with pytest.raises(ValueError, match=rf"made 3 step call\(s\); from_step {position} "
                                             r"is not a position among them \(1\.\.3\)"):
            await runner.client.fork(done, from_step=position)
    with pytest.raises(TypeError, match="from_step must be a step name"):
        await runner.client.fork(done, from_step=True)
    with pytest.raises(WorkflowNotFound, match="no run with id 'nope'"):
        await runner.client.fork("nope", from_step=1)
    assert [info.run_id async for info in runner.client.list_runs(limit=10)] == [done], \
        "no fork was submitted"


def _started(events: list[Any]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "run:started"]


async def test_a_forks_first_run_started_names_the_run_and_call_it_was_forked_from(
    runner: InlineWorkflowRunner,
) -> None:
    from pyrula.cli.timeline import describe, timeline

    done = await _ran_to_end(runner, {"sku": "d4", "amount": 2})
    assert all("forked_from" not in e for e in _started(await runner.client.events(done)))

    # Forked before reserve: its first attempt parks on the signal, a second one ends it.
    fork = await runner.client.fork(done, from_step=1)
    await runner.run(fork.name, fork.run_id)
    await runner.client.signal(fork.run_id, "approved", "bob")
    await runner.run(fork.name, fork.run_id)
    assert (await runner.client.get(fork.run_id)).status is RunStatus.COMPLETED
    events = await runner.client.events(fork.run_id)
    first, second = _started(events)
    assert (first["attempt"], first["forked_from"], first["from_call"], first["from_step"]) \
        == (1, done, 2, "forks.reserve")
    assert second["attempt"] == 2 and "forked_from" not in second and "from_call" not in second
    assert "from_step" not in second
    lines = [describe(entry) for entry in timeline(events) if entry["kind"] == "attempt"]
    assert lines[0].endswith(f"attempt 1 on {first['worker']}, forked from {done} at step "
                             "forks.reserve (call 2)")
    assert "forked from" not in lines[1]

    # A fork signalled before its first claim: that claim writes its run:started after
    # the signal (on Valkey, the claim script's own event, not the one the record implies).
    early = await runner.client.fork(done, from_step="forks.charge")
    await runner.client.signal(early.run_id, "unrelated", 1)
    await runner.run(early.name, early.run_id)
    journal = await runner.client.events(early.run_id)
    assert [e["type"] for e in journal[:3]] == ["run:submitted", "signal:received",
                                                "run:started"]
    (started,) = _started(journal)
    assert (started["forked_from"], started["from_call"], started["from_step"]) == (
        done, 4, "forks.charge")

    # A client's own key that only looks like a fork's is no fork, and no claim fails on it.
    for key in ("fork:nope", "fork:r:x:n"):
        other = await runner.client.submit("forks.order", {"sku": "e5", "amount": 1},
                                           idempotency_key=key)
        await runner.run(other.name, other.run_id)
        (started,) = _started(await runner.client.events(other.run_id))
        assert "forked_from" not in started


# Step names a fork's key carries in hex, and keys whose tail only looks like one (bad hex,
# upper case, odd length, bytes that are no UTF-8: an overlong form, a surrogate, past
# U+10FFFF): every store's claim reads them as forks.fork_origin does.
_LOOKALIKES = (
    *(f"fork:r:3:n.{name.encode().hex()}" for name in ("a", "café ☕", "𝄞 \"q\"", "x:y.z")),
    "fork:r:3:n", "fork:r:3:n.", "fork:r:3:n.abc", "fork:r:3:n.AB", "fork:r:3:n.6g",
    "fork:r:3:n.ff", "fork:r:3:n.c0af", "fork:r:3:n.eda080", "fork:r:3:n.f4908080",
    "fork:r:3:n.e080af", "fork:r:3:a.b.6161", "fork:r:3:.6161",
)


async def test_every_store_reads_the_step_of_a_forks_key_as_the_code_does(
    runner: InlineWorkflowRunner,
) -> None:
    from pyrula.workflows.forks import fork_origin

    store = runner.store
    for n, key in enumerate(_LOOKALIKES):
        handle, _ = await store.submit("forks.order", {"sku": "f6"}, now=1000.0 + n,
                                       owner=None, idempotency_key=key)
        assert await store.claim_run(handle.run_id, "w", now=1000.0 + n, lock_ttl=30.0)
        (started,) = _started(await store.read_events(handle.run_id))
        written = {k: started[k] for k in ("forked_from", "from_call", "from_step")
                   if k in started}
        assert written == fork_origin(key), key


def test_any_step_name_in_a_forks_key_reaches_its_run_started_on_every_store(
    store: Any,
) -> None:
    """Drawn step names (any text) and tails after them (a client's look-alike keys):
    every store's claim names the same origin as forks.fork_origin reads from the key."""
    from hypothesis import given
    from hypothesis import strategies as st

    from pyrula.workflows.forks import ForkPoint, fork_origin

    with store_loop(store) as loop:
        clock = iter(range(10_000))

        async def started_of(key: str) -> dict[str, Any]:
            now = 1000.0 + next(clock)
            handle, _ = await store.submit("forks.order", {}, now=now, owner=None,
                                           idempotency_key=key)
            assert await store.claim_run(handle.run_id, "w", now=now, lock_ttl=30.0)
            (started,) = _started(await store.read_events(handle.run_id))
            return {k: started[k] for k in ("forked_from", "from_call", "from_step")
                    if k in started}

        @drawn(30)
        @given(name=st.text(min_size=1, max_size=30), tail=st.text(max_size=6))
        def check(name: str, tail: str) -> None:
            key = ForkPoint("r:1", 3, name).key() + tail
            assert loop.run(started_of(key)) == (fork_origin(key) or {}), key

        check()
