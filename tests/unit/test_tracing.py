"""A run's journal as an OpenTelemetry trace: the span tree of real runs on the embedded
stores (a manual clock makes every timing exact), the same ids on every export, recovery
facts as span events, the worker's exporter hook, and pyrula without the extra."""

from __future__ import annotations

import asyncio
import builtins
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from pyrula.errors import ConfigurationError
from pyrula.workflows import (
    InlineWorkflowRunner,
    MemoryStore,
    SQLiteStore,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    step,
    workflow,
)
from pyrula.workflows.clock import ManualClock
from pyrula.workflows.records import PoisonPolicy
from pyrula.workflows.tracing import (
    TraceExportFailed,
    export_run,
    export_run_sync,
    plan_spans,
    run_spans,
    span_id_of,
    trace_id_of,
)
from tests.conftest import await_until
from tests.golden.harness import Drain

NS = 1_000_000_000
CLOCK: list[ManualClock] = []


def _tick(seconds: float) -> None:
    """Let ``seconds`` pass on the test's clock, inside a step."""
    CLOCK[0].advance(seconds)


@step
def charge(amount: float) -> float:
    _tick(2)
    return amount


@step
def decline(amount: float) -> float:
    _tick(1)
    raise ValueError(f"card declined for {amount}")


FLAKY: dict[str, int] = {}


@step(retries=2, retry_backoff=0)
def flaky(key: str) -> str:
    _tick(1)
    FLAKY[key] = FLAKY.get(key, 0) + 1
    if FLAKY[key] < 2:
        raise RuntimeError("try again")
    return "ok"


@workflow(name="tracing.pay")
async def pay(ctx: WorkflowContext, params: dict[str, Any]) -> float:
    return await charge(params["amount"])


@workflow(name="tracing.declined")
async def declined(ctx: WorkflowContext, params: dict[str, Any]) -> float:
    return await decline(params["amount"])


@workflow(name="tracing.flaky")
async def flaky_run(ctx: WorkflowContext, params: dict[str, Any]) -> str:
    return await flaky(params["key"])


@workflow(name="tracing.nap")
async def nap(ctx: WorkflowContext, params: None) -> float:
    await ctx.sleep(60)
    return await charge(1.0)


@workflow(name="tracing.approval")
async def approval(ctx: WorkflowContext, params: None) -> Any:
    return await ctx.wait_for_signal("approved", timeout=3600)


@workflow(name="tracing.patched")
async def patched(ctx: WorkflowContext, params: Any) -> bool:
    await ctx.sleep(1)
    return ctx.patched("fix-rounding")


@workflow(name="tracing.chain")
async def chain(ctx: WorkflowContext, params: int) -> int:
    await charge(float(params))
    if params > 0:
        ctx.continue_as_new(params - 1)
    return params


@workflow(name="tracing.kid")
async def kid(ctx: WorkflowContext, params: int) -> int:
    return params * 2


@workflow(name="tracing.parent")
async def parent(ctx: WorkflowContext, params: Any) -> list[int]:
    one = await ctx.child("tracing.kid", 1)
    many = await ctx.gather_children([("tracing.kid", 2), ("tracing.kid", 3)])
    return [one, *many]


@workflow(name="tracing.tally")
async def tally(ctx: WorkflowContext, params: Any) -> int:
    total = [0]

    def add(n: int) -> int:
        if n <= 0:
            raise ValueError("add a positive number")
        total[0] += n
        return total[0]

    ctx.set_update_handler("add", add)
    await ctx.wait_for_signal("done", timeout=3600)
    return total[0]


@pytest.fixture
def clock() -> Iterator[ManualClock]:
    c = ManualClock()
    CLOCK[:] = [c]
    yield c
    CLOCK.clear()


@pytest.fixture(params=["memory", "sqlite"])
def runner(request: pytest.FixtureRequest, tmp_path: Path,
           clock: ManualClock) -> Iterator[InlineWorkflowRunner]:
    store: Any = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "t.db")
    r = InlineWorkflowRunner(store=store, clock=clock, cloud=False)
    try:
        yield r
    finally:
        asyncio.run(r.aclose())
        store.close()


def _tree(spans: list[ReadableSpan]) -> list[tuple[str, str | None]]:
    """(name, parent's name) of each span, in the order given."""
    names = {s.context.span_id: s.name for s in spans if s.context is not None}
    return [(s.name, names.get(s.parent.span_id) if s.parent is not None else None)
            for s in spans]


def _one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def _offset(clock_start: float, span: ReadableSpan) -> tuple[float, float]:
    """The span's start and end in seconds after the clock's start."""
    assert span.start_time is not None and span.end_time is not None
    return (round(span.start_time / NS - clock_start, 3),
            round(span.end_time / NS - clock_start, 3))


async def _spans(runner: InlineWorkflowRunner, run_id: str) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    returned = await export_run(runner.store, run_id, exporter)
    exported = list(exporter.get_finished_spans())
    assert [s.context.span_id for s in exported] == [s.context.span_id for s in returned]
    return exported


async def test_a_completed_run_is_a_root_an_attempt_and_its_step(
    runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    t0 = clock.now()
    run = await runner.client.submit("tracing.pay", {"amount": 5.0})
    clock.advance(1)
    await runner.run(run.name, run.run_id)
    spans = await _spans(runner, run.run_id)

    assert _tree(spans) == [("run tracing.pay", None), ("attempt 1", "run tracing.pay"),
                            ("step charge", "attempt 1")]
    root, attempt, charged = spans
    assert {s.context.trace_id for s in spans} == {trace_id_of(run.run_id)}
    assert root.context.span_id == span_id_of(run.run_id, "run")
    assert _offset(t0, root) == (0.0, 3.0)
    assert _offset(t0, attempt) == (1.0, 3.0)
    assert _offset(t0, charged) == (1.0, 3.0)
    assert root.status.status_code is StatusCode.OK
    assert dict(root.attributes or {}) == {
        "pyrula.run_id": run.run_id, "pyrula.workflow": "tracing.pay",
        "pyrula.status": "completed", "pyrula.attempts": 1}
    assert (attempt.attributes or {})["pyrula.worker"] == runner.worker_id
    assert "pyrula.after" not in (attempt.attributes or {})
    assert dict(charged.attributes or {}) == {
        "pyrula.step": "charge", "pyrula.call": 1, "pyrula.try": 1,
        "pyrula.outcome": "completed"}
    assert root.resource.attributes["service.name"] == "pyrula"
    assert root.instrumentation_scope is not None
    assert root.instrumentation_scope.name == "pyrula"


async def test_a_failed_run_and_its_failed_step_are_errors(
    runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    run = await runner.client.submit("tracing.declined", {"amount": 9.0})
    await runner.run(run.name, run.run_id)
    spans = await _spans(runner, run.run_id)

    root, attempt, declined_try = (_one(spans, n) for n in
                                   ("run tracing.declined", "attempt 1", "step decline"))
    assert root.status.status_code is StatusCode.ERROR
    assert "card declined for 9.0" in (root.status.description or "")
    assert (root.attributes or {})["pyrula.status"] == "failed"
    assert attempt.status.status_code is StatusCode.ERROR
    assert declined_try.status.status_code is StatusCode.ERROR
    assert declined_try.status.description == "ValueError: card declined for 9.0"
    assert (declined_try.attributes or {})["pyrula.will_retry"] is False
    assert (declined_try.attributes or {})["error.type"] == "ValueError"


async def test_each_try_of_a_retried_step_is_a_span_of_its_own(
    runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    t0 = clock.now()
    run = await runner.client.submit("tracing.flaky", {"key": f"k-{os.urandom(8).hex()}"})
    await runner.run(run.name, run.run_id)
    spans = await _spans(runner, run.run_id)

    tries = [s for s in spans if s.name == "step flaky"]
    assert [(s.attributes or {})["pyrula.try"] for s in tries] == [1, 2]
    assert [s.status.status_code for s in tries] == [StatusCode.ERROR, StatusCode.UNSET]
    assert [(s.attributes or {})["pyrula.outcome"] for s in tries] == ["retrying", "completed"]
    assert [_offset(t0, s) for s in tries] == [(0.0, 1.0), (1.0, 2.0)]
    assert {_tree(spans)[spans.index(s)][1] for s in tries} == {"attempt 1"}
    assert _one(spans, "run tracing.flaky").status.status_code is StatusCode.OK


async def test_a_sleep_is_a_park_between_two_attempts(
    runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    t0 = clock.now()
    run = await runner.client.submit("tracing.nap")
    await runner.run(run.name, run.run_id)
    clock.advance(60)
    assert await runner.store.wake_due(now=clock.now(), limit=10) == 1
    clock.advance(1)
    await runner.run(run.name, run.run_id)
    spans = await _spans(runner, run.run_id)

    assert _tree(spans) == [
        ("run tracing.nap", None), ("attempt 1", "run tracing.nap"),
        ("attempt 2", "run tracing.nap"), ("step charge", "attempt 2"),
        ("parked sleeping", "run tracing.nap")]
    root, first, second, charged, parked = spans
    assert _offset(t0, first) == (0.0, 0.0)
    assert _offset(t0, parked) == (0.0, 60.0)
    assert _offset(t0, second) == (61.0, 63.0)
    assert _offset(t0, root) == (0.0, 63.0)
    assert (parked.attributes or {})["pyrula.why"] == "sleeping"
    assert (parked.attributes or {})["pyrula.ended_by"] == "run:woken"
    assert "pyrula.after" not in (second.attributes or {}), "woken, not requeued"
    assert (root.attributes or {})["pyrula.attempts"] == 2


async def test_a_wait_is_a_park_ended_by_its_signal(
    runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    t0 = clock.now()
    run = await runner.client.submit("tracing.approval")
    await runner.run(run.name, run.run_id)
    clock.advance(5)
    await runner.client.signal(run.run_id, "approved", True)
    await runner.run(run.name, run.run_id)
    spans = await _spans(runner, run.run_id)

    parked = _one(spans, "parked waiting")
    assert _offset(t0, parked) == (0.0, 5.0)
    assert (parked.attributes or {})["pyrula.signal"] == "approved"
    assert (parked.attributes or {})["pyrula.ended_by"] == "signal:received"
    root = _one(spans, "run tracing.approval")
    assert [(e.name, dict(e.attributes or {})) for e in root.events] == [
        ("signal_received", {"pyrula.signal": "approved"})]
    assert (root.attributes or {})["pyrula.status"] == "completed"


async def test_a_patch_marker_is_an_event_of_the_attempt_that_recorded_it(
    runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    run = await runner.client.submit("tracing.patched")
    await runner.run(run.name, run.run_id)
    clock.advance(1)
    await runner.client.wake(run.run_id)
    await runner.run(run.name, run.run_id)
    spans = await _spans(runner, run.run_id)

    first, second = _one(spans, "attempt 1"), _one(spans, "attempt 2")
    assert [e.name for e in first.events] == []
    assert [(e.name, dict(e.attributes or {})) for e in second.events] == [
        ("patch_applied", {"pyrula.patch": "fix-rounding", "pyrula.call": 2})]


async def test_a_fork_names_the_run_and_step_it_reuses(
    runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    run = await runner.client.submit("tracing.chain", 0)
    await runner.run(run.name, run.run_id)
    fork = await runner.client.fork(run.run_id, from_step=1)
    await runner.run(fork.name, fork.run_id)
    root = _one(await _spans(runner, fork.run_id), "run tracing.chain")

    assert (root.attributes or {})["pyrula.forked_from"] == run.run_id
    assert [(e.name, dict(e.attributes or {})) for e in root.events] == [
        ("run_forked", {"pyrula.from_run": run.run_id, "pyrula.from_step": "charge",
                        "pyrula.from_call": 1})]


async def test_a_parents_trace_shows_its_children_and_a_childs_names_its_parent(
    runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    run = await runner.client.submit("tracing.parent")
    await Drain()(runner, clock, run.run_id)  # the parent and its children, as a fleet would
    assert await runner.client.result(run.run_id, timeout=1) == [2, 4, 6]
    root = _one(await _spans(runner, run.run_id), "run tracing.parent")
    events = [(e.name, dict(e.attributes or {})) for e in root.events]
    started = [facts for name, facts in events if name == "children_started"]
    assert started[0]["pyrula.children"] == 1
    assert started[0]["pyrula.child_workflow"] == "tracing.kid"
    assert started[1] == {"pyrula.call": 2, "pyrula.children": 2,
                          "pyrula.child_workflow": "tracing.kid"}
    ended = [facts["pyrula.children"] for name, facts in events if name == "children_ended"]
    assert sum(ended) == 2
    child = str(started[0]["pyrula.child_run"])
    kid_root = _one(await _spans(runner, child), "run tracing.kid")
    assert (kid_root.attributes or {})["pyrula.parent_id"] == run.run_id
    assert "pyrula.parent_id" not in (root.attributes or {})


async def test_an_applied_update_is_an_event_of_the_runs_trace(
    runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    from pyrula.workflows.events import UPDATE_SIGNAL

    run = await runner.client.submit("tracing.tally")
    await runner.run(run.name, run.run_id)
    for update_id, n in (("u-1", 5), ("u-2", 0)):
        await runner.store.signal(run.run_id, UPDATE_SIGNAL,
                                  {"id": update_id, "name": "add", "payload": n},
                                  now=clock.now())
    await runner.run(run.name, run.run_id)
    await runner.client.signal(run.run_id, "done", True)
    await runner.run(run.name, run.run_id)
    assert await runner.client.result(run.run_id, timeout=1) == 5
    root = _one(await _spans(runner, run.run_id), "run tracing.tally")
    updates = [dict(e.attributes or {}) for e in root.events if e.name == "update_applied"]
    assert updates == [
        {"pyrula.update": "add", "pyrula.update_id": "u-1"},
        {"pyrula.update": "add", "pyrula.update_id": "u-2", "pyrula.error_type": "ValueError"}]


async def test_a_continued_run_links_to_the_trace_of_its_successor(
    runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    run = await runner.client.submit("tracing.chain", 1)
    await runner.run(run.name, run.run_id)
    successor = (await runner.client.get(run.run_id)).successor_id
    assert successor is not None
    await runner.run(run.name, successor)
    first, second = await _spans(runner, run.run_id), await _spans(runner, successor)

    root = _one(first, "run tracing.chain")
    assert (root.attributes or {})["pyrula.status"] == "continued"
    assert root.status.status_code is StatusCode.UNSET
    assert [(link.context.trace_id, link.context.span_id) for link in root.links] == [
        (trace_id_of(successor), span_id_of(successor, "run"))]
    assert {s.context.trace_id for s in second} == {trace_id_of(successor)}
    assert _one(second, "run tracing.chain").status.status_code is StatusCode.OK


async def test_exporting_again_gives_the_same_ids(
    runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    run = await runner.client.submit("tracing.nap")
    await runner.run(run.name, run.run_id)
    parked_only = await _spans(runner, run.run_id)
    clock.advance(60)
    await runner.store.wake_due(now=clock.now(), limit=10)
    await runner.run(run.name, run.run_id)
    once, twice = await _spans(runner, run.run_id), await _spans(runner, run.run_id)

    def ids(spans: list[ReadableSpan]) -> list[tuple[str, int, int, int | None]]:
        return [(s.name, s.context.trace_id, s.context.span_id, s.end_time) for s in spans]

    assert ids(once) == ids(twice)
    # A span exported while the run was parked keeps its id once the run has ended.
    assert {s.context.span_id for s in parked_only} <= {s.context.span_id for s in once}
    exporter = InMemorySpanExporter()
    assert ids(export_run_sync(runner.store, run.run_id, exporter)) == ids(once)
    assert ids(list(exporter.get_finished_spans())) == ids(once)


async def test_a_dead_childs_requeue_and_a_quarantine_are_events_of_the_attempt(
    clock: ManualClock,
) -> None:
    store = MemoryStore()
    runner = InlineWorkflowRunner(store=store, clock=clock, cloud=False)
    try:
        evidence = {"exit": "signal SIGKILL", "exit_code": -9, "exit_signal": "SIGKILL",
                    "pid": 4242, "rss_bytes": 52_428_800, "killed_for": None}
        run = await runner.client.submit("tracing.pay", {"amount": 1.0})
        assert await store.claim_run(run.run_id, "child-1", now=clock.now(), lock_ttl=15)
        clock.advance(1)
        await store.reclaim_worker("child-1", now=clock.now(), poison=PoisonPolicy(),
                                   crash_detail=evidence)
        clock.advance(1)
        await runner.run(run.name, run.run_id)
        spans = await _spans(runner, run.run_id)

        first, second = _one(spans, "attempt 1"), _one(spans, "attempt 2")
        assert (second.attributes or {})["pyrula.after"] == "orphaned"
        assert _offset(clock.now() - 4, first) == (0.0, 1.0), "ends at its requeue"
        by_name = {e.name: dict(e.attributes or {}) for e in first.events}
        assert list(by_name) == ["run_requeued", "run_reclaimed", "child_killed"]
        assert by_name["run_requeued"] == {"pyrula.reason": "orphaned", "pyrula.crashes": 1}
        assert by_name["child_killed"]["pyrula.pid"] == 4242
        assert by_name["child_killed"]["pyrula.exit_signal"] == "SIGKILL"
        assert by_name["child_killed"]["pyrula.rss_bytes"] == 52_428_800
        assert "pyrula.killed_for" not in by_name["child_killed"]
        assert by_name["run_reclaimed"]["pyrula.worker"] == "child-1"

        doomed = await runner.client.submit("tracing.pay", {"amount": 2.0})
        await store.claim_run(doomed.run_id, "child-2", now=clock.now(), lock_ttl=15)
        await store.reclaim_worker("child-2", now=clock.now(), poison=PoisonPolicy(0),
                                   crash_detail=evidence)
        spans = await _spans(runner, doomed.run_id)
        attempt = _one(spans, "attempt 1")
        assert [e.name for e in attempt.events] == ["run_quarantined", "child_killed"]
        assert attempt.status.status_code is StatusCode.ERROR
        root = _one(spans, "run tracing.pay")
        assert root.status.status_code is StatusCode.ERROR
        assert (root.attributes or {})["pyrula.error_code"] == "max_retries"
    finally:
        await runner.aclose()
        store.close()


def test_an_empty_journal_has_no_spans_and_a_failed_export_says_so() -> None:
    assert plan_spans([], "r") == []
    assert run_spans([], run_id="r") == []

    class Refusing(InMemorySpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.FAILURE

    store = MemoryStore()
    try:
        run = asyncio.run(_submit(store))
        with pytest.raises(TraceExportFailed, match=run):
            export_run_sync(store, run, Refusing())
    finally:
        store.close()


async def _submit(store: MemoryStore) -> str:
    from pyrula.workflows import WorkflowClient

    return (await WorkflowClient(store).submit("tracing.pay", {"amount": 1.0})).run_id


def test_without_the_extra_tracing_says_which_package_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_import = builtins.__import__

    def no_otel(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("opentelemetry"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_otel)
    with pytest.raises(ConfigurationError, match=r"pip install 'pyrula\[otel\]'"):
        run_spans([], run_id="r")
    store = MemoryStore()
    try:
        with pytest.raises(ConfigurationError, match=r"pip install 'pyrula\[otel\]'"):
            WorkflowWorker(store=store, workflows=["tracing.pay"], cloud=False,
                           span_exporter=InMemorySpanExporter())
        # The journal's pure reading needs no OpenTelemetry.
        assert plan_spans([{"type": "run:submitted", "ts": 1.0, "name": "w", "seq": 1}],
                          "r")[0].name == "run w"
    finally:
        store.close()


async def test_a_worker_with_a_span_exporter_exports_each_run_it_ends() -> None:
    store = MemoryStore()
    exporter = InMemorySpanExporter()
    worker = WorkflowWorker(store=store, workflows=["tracing.pay", "tracing.declined"],
                            options=WorkerOptions(claim_poll_interval=0.01), cloud=False,
                            span_exporter=exporter)
    CLOCK[:] = [ManualClock()]
    serving = asyncio.create_task(worker.run())
    try:
        ok = await worker.client.submit("tracing.pay", {"amount": 3.0})
        bad = await worker.client.submit("tracing.declined", {"amount": 4.0})

        def roots() -> dict[str, ReadableSpan]:
            return {str((s.attributes or {})["pyrula.run_id"]): s
                    for s in exporter.get_finished_spans() if s.parent is None}

        found = await await_until(lambda: len(roots()) == 2 and roots(),
                                  what="both runs' traces")
        assert found[ok.run_id].status.status_code is StatusCode.OK
        assert found[bad.run_id].status.status_code is StatusCode.ERROR
        names = sorted(s.name for s in exporter.get_finished_spans())
        assert names == ["attempt 1", "attempt 1", "run tracing.declined", "run tracing.pay",
                         "step charge", "step decline"]
    finally:
        worker.stop()
        await serving
        store.close()
        CLOCK.clear()
