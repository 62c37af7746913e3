"""Health probes: /livez and /readyz with their documented status words."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from typing import Any

import pytest

from pyrula.workflows import WorkflowContext, WorkflowWorker, step, workflow
from pyrula.workflows.worker import loops as loops_module
from pyrula.workflows.worker import probes as probes_module
from tests.conftest import await_until
from tests.unit.worker.worker_support import (
    Outage,
    Spy,
    fast_options,
    http_get,
    serving,
    start,
    stop,
    unique,
)

GATES: dict[str, asyncio.Event] = {}


@step(name="wprobe_hold")
async def wprobe_hold(key: str) -> str:
    await GATES[key].wait()
    return key


@workflow(name="wprobe_held")
async def wprobe_held(ctx: WorkflowContext, params: Any) -> Any:
    return await wprobe_hold(params["key"])


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loops restart after 10 ms instead of 0.5 s; the restart logic itself is unchanged."""
    monkeypatch.setattr(
        "pyrula.workflows.worker.loops.backoff_delays", lambda *a, **k: lambda: 0.01
    )


async def claim_ticks(worker: WorkflowWorker, n: int) -> None:
    """Wait for ``n`` more completed passes of the claim loop."""
    seen: list[float | None] = []

    def ticked() -> bool:
        state = worker._loops.get("claim")
        stamp = None if state is None else state.last_ok
        if stamp is not None and (not seen or seen[-1] != stamp):
            seen.append(stamp)
        return len(seen) > n

    await await_until(ticked, what=f"{n} claim ticks")


def make_worker(store: Any, **options: Any) -> WorkflowWorker:
    return WorkflowWorker(
        store=store, workflows=[wprobe_held], options=fast_options(health_port=0, **options)
    )


async def test_probes_answer_while_serving_on_localhost(store: Any) -> None:
    worker = make_worker(store)
    assert worker.health_address is None  # not bound before run()
    async with serving(worker):
        host, port = worker.health_address or ("", 0)
        assert host == "127.0.0.1" and port > 0
        assert await http_get(worker.health_address, "/livez") == (
            200, {"status": "ok", "worker_id": worker.worker_id}
        )
        status, body = await http_get(worker.health_address, "/readyz")
        assert status == 200
        assert body["status"] == "ready"
        assert body["shards"] == {}
        assert body["worker_id"] == worker.worker_id


@pytest.mark.skipif(sys.platform != "linux", reason="127.0.0.2 is a loopback address on Linux")
async def test_health_port_and_host_come_from_the_environment(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYRULA_WORKER_HEALTH_PORT", "0")
    monkeypatch.setenv("PYRULA_WORKER_HEALTH_HOST", "127.0.0.2")
    worker = WorkflowWorker(store=store, workflows=[wprobe_held], options=fast_options())
    async with serving(worker):
        assert worker.health_address is not None
        assert worker.health_address[0] == "127.0.0.2"
        assert (await http_get(worker.health_address, "/livez"))[0] == 200


async def test_no_probe_server_without_a_health_port(store: Any) -> None:
    worker = WorkflowWorker(store=store, workflows=[wprobe_held], options=fast_options())
    async with serving(worker):
        assert worker.health_address is None


async def test_readyz_says_draining_as_soon_as_stop_is_called(store: Any) -> None:
    key = unique("drain")
    GATES[key] = asyncio.Event()
    worker = make_worker(store, shutdown_grace=10.0)
    task = await start(worker)
    run = await worker.client.submit(wprobe_held, {"key": key})
    await await_until(lambda: worker.in_flight == 1, what="the run in flight")
    worker.stop()
    status, body = await http_get(worker.health_address, "/readyz")
    assert (status, body["status"]) == (503, "draining")
    assert worker.in_flight == 1  # still finishing its run
    assert (await http_get(worker.health_address, "/livez"))[0] == 200
    GATES[key].set()
    await asyncio.wait_for(task, 30)
    assert await worker.client.result(run.run_id, timeout=5) == key


async def test_the_claim_loop_is_seen_to_turn_while_idle_and_while_draining(
    store: Any,
) -> None:
    """claim_tick_age() (what a fleet's stall watchdog reads) stays a fresh age between
    polls of an idle worker and while a stopping worker drains its last run."""
    key = unique("turning")
    GATES[key] = asyncio.Event()
    worker = make_worker(store, claim_poll_interval=0.05, shutdown_grace=10.0)
    task = await start(worker)
    ages: list[float] = []

    def sampled(n: int) -> bool:
        ages.append(worker.claim_tick_age())
        return len(ages) >= n

    await await_until(lambda: sampled(10), interval=0.03, what="ages while idle")
    run = await worker.client.submit(wprobe_held, {"key": key})
    await await_until(lambda: worker.in_flight == 1, what="the run in flight")
    worker.stop()
    await await_until(lambda: sampled(20), interval=0.03, what="ages while draining")
    GATES[key].set()
    await asyncio.wait_for(task, 30)
    assert await worker.client.result(run.run_id, timeout=5) == key
    assert max(ages) < 1.0, ages


async def test_the_claim_loop_of_a_retiring_worker_is_seen_to_turn(store: Any) -> None:
    """A retiring worker (an upgrade's older generation) claims nothing new but serves on:
    its claim_tick_age() stays a fresh age, or a fleet would take it for a stalled one."""
    spy = Spy(store, "claim")
    worker = make_worker(store, claim_poll_interval=0.05)
    async with serving(worker):
        worker.retire()
        claims = spy.count("claim")
        run = await worker.client.submit(wprobe_held, {"key": "never"})
        ages: list[float] = []

        def sampled(n: int) -> bool:
            ages.append(worker.claim_tick_age())
            return len(ages) >= n

        await await_until(lambda: sampled(20), interval=0.03, what="ages while retiring")
        assert (await worker.client.get(run.run_id)).status == "queued"
    assert spy.count("claim") <= claims + 1  # one already under way when it retired
    assert max(ages) < 1.0, ages


async def test_readyz_reports_a_store_binding_mismatch(store: Any) -> None:
    await store.bind("shop", "prod")
    spy = Spy(store, "claim")
    worker = make_worker(store, project="billing", environment="prod")
    task = asyncio.create_task(worker.run())
    try:
        await await_until(lambda: worker.health_address is not None, what="probes bound")
        status, body = await http_get(worker.health_address, "/readyz")
        assert (status, body["status"]) == (503, "store_binding_mismatch")
        run = await worker.client.submit(wprobe_held, {"key": "never"})
        await claim_ticks(worker, 3)
        assert (await worker.client.get(run.run_id)).status == "queued"
        assert spy.count("claim") == 0  # a mismatched worker claims nothing
    finally:
        await stop(worker, task)


async def test_the_first_worker_records_the_binding_and_a_matching_one_is_ready(
    store: Any,
) -> None:
    first = make_worker(store, project="shop", environment="prod")
    async with serving(first):
        assert (await http_get(first.health_address, "/readyz"))[0] == 200
    assert await store.bind(None, None) == ("shop", "prod")
    second = make_worker(store, project="shop")  # environment unset: no conflict
    async with serving(second):
        assert (await http_get(second.health_address, "/readyz"))[0] == 200


async def test_readyz_reports_a_store_that_fails_its_ping(store: Any) -> None:
    worker = make_worker(store)
    outage = Outage(store, "aping")
    async with serving(worker):
        outage.active = True
        status, body = await http_get(worker.health_address, "/readyz")
        assert (status, body["status"]) == (503, "store_unreachable")
        outage.active = False
        assert (await http_get(worker.health_address, "/readyz"))[0] == 200


async def test_readyz_reports_a_store_whose_ping_hangs(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probes_module, "PING_TIMEOUT_S", 0.1)

    async def hang() -> None:
        await asyncio.Event().wait()

    worker = make_worker(store)
    async with serving(worker):
        monkeypatch.setattr(store, "aping", hang)
        status, body = await http_get(worker.health_address, "/readyz")
        assert (status, body["status"]) == (503, "store_unreachable")


async def test_livez_fails_once_a_loop_has_been_failing_too_long_and_recovers(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loops_module, "LIVENESS_FAILURE_S", 1.0)
    outage = Outage(store, "wake_due")
    worker = make_worker(store)
    async with serving(worker):
        outage.active = True
        await await_until(lambda: outage.failures >= 1, what="the timer loop failing")
        assert (await http_get(worker.health_address, "/livez"))[0] == 200  # not for long yet

        async def livez_failed() -> bool:
            return (await http_get(worker.health_address, "/livez"))[0] == 503

        await await_until(livez_failed, what="/livez to fail")
        status, body = await http_get(worker.health_address, "/livez")
        assert body["status"] == "loop_failed" and body["loop"] == "timer"
        status, body = await http_get(worker.health_address, "/readyz")
        assert (status, body["status"]) == (503, "loop_failed")
        outage.active = False

        async def livez_ok() -> bool:
            return (await http_get(worker.health_address, "/livez"))[0] == 200

        await await_until(livez_ok, what="/livez to recover on the next completed tick")
        assert (await http_get(worker.health_address, "/readyz"))[0] == 200


async def test_unknown_routes_are_404(store: Any) -> None:
    worker = make_worker(store)
    async with serving(worker):
        assert (await http_get(worker.health_address, "/nope"))[0] == 404



async def test_livez_answers_after_run_returns_until_aclose(store: Any) -> None:
    """An app that embeds the worker lives on after run() returned: /livez still answers
    (200, the worker stopped), /readyz says 503 stopped, until aclose() frees the port."""
    worker = make_worker(store)
    task = await start(worker)
    address = worker.health_address
    await stop(worker, task)
    assert worker.state == "stopped"
    assert await http_get(address, "/livez") == (
        200, {"status": "stopped", "worker_id": worker.worker_id})
    status, body = await http_get(address, "/readyz")
    assert (status, body["status"]) == (503, "stopped")
    await worker.aclose()
    assert worker.health_address is None
    with pytest.raises(ConnectionRefusedError):
        await http_get(address, "/livez")


def _serve_and_stop_in_a_loop_of_its_own(store_path: str) -> tuple[str, int]:
    """A whole program: asyncio.run() of a worker that stops, without aclose()."""
    from pyrula.workflows import SQLiteStore

    async def main() -> tuple[str, int]:
        worker = make_worker(SQLiteStore(store_path))
        task = await start(worker)
        address = worker.health_address
        await stop(worker, task)
        assert address is not None and (await http_get(address, "/livez"))[0] == 200
        return address

    return asyncio.run(main())


async def test_the_port_is_freed_when_the_event_loop_ends(tmp_path: Any) -> None:
    address = await asyncio.to_thread(_serve_and_stop_in_a_loop_of_its_own,
                                      str(tmp_path / "own.db"))
    with socket.socket() as sock:  # a listener may bind it again: nothing listens there
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen()


async def test_a_loop_that_died_reads_loop_failed_not_draining(store: Any) -> None:
    """Both probes name the dead loop, while the worker drains and after run() raised."""
    key = unique("died")
    GATES[key] = asyncio.Event()
    outage = Outage(store, "wake_due", error=lambda: RuntimeError("a bug in the timer loop"))
    worker = make_worker(store, shutdown_grace=10.0)
    task = await start(worker)
    await worker.client.submit(wprobe_held, {"key": key})
    await await_until(lambda: worker.in_flight == 1, what="the run in flight")
    outage.active = True
    await await_until(lambda: worker.state == "draining", what="the worker stopping")
    want = {"status": "loop_failed", "loop": "timer", "worker_id": worker.worker_id}
    assert await http_get(worker.health_address, "/livez") == (503, want)
    assert await http_get(worker.health_address, "/readyz") == (503, want)
    GATES[key].set()
    with pytest.raises(RuntimeError, match="a bug in the timer loop"):
        await asyncio.wait_for(task, 30)
    assert await http_get(worker.health_address, "/livez") == (503, want)
    assert await http_get(worker.health_address, "/readyz") == (503, want)


async def test_a_failure_left_by_a_loop_at_stop_does_not_fail_livez_later(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loops end at stop(): a store error one of them had then is not a loop failing
    once the liveness window has passed."""
    monkeypatch.setattr(loops_module, "LIVENESS_FAILURE_S", 0.2)
    outage = Outage(store, "wake_due")
    worker = make_worker(store)
    task = await start(worker)
    outage.active = True
    await await_until(lambda: outage.failures >= 1, what="the timer loop failing")
    await stop(worker, task)
    state = worker._loops["timer"]
    assert state.failing_since is not None
    await await_until(lambda: time.monotonic() - (state.failing_since or 0.0) > 0.2,
                      what="the liveness window passed")
    assert (await http_get(worker.health_address, "/livez"))[0] == 200
