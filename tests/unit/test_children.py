"""Child workflows in the engine: what the parent journals, replay never starting a child
twice, ChildFailed, the lost-nudge re-check, and the cancel cascade."""

from __future__ import annotations

from typing import Any

import pytest

from pyrula.workflows import (
    ChildFailed,
    ChildHandle,
    InlineWorkflowRunner,
    RunStatus,
    WorkflowContext,
    workflow,
)
from pyrula.workflows import family as family_module
from pyrula.workflows.clock import ManualClock
from pyrula.workflows.events import CHILD_SIGNAL, child_key
from tests.unit.journal import of_type


@workflow(name="kids.double")
async def double(ctx: WorkflowContext, params: int) -> int:
    return params * 2


@workflow(name="kids.fail")
async def fail(ctx: WorkflowContext, params: Any) -> None:
    raise ValueError(f"bad {params}")


@workflow(name="kids.wait")
async def wait(ctx: WorkflowContext, params: Any) -> Any:
    return await ctx.wait_for_signal("go")


@workflow(name="kids.one")
async def one(ctx: WorkflowContext, params: int) -> dict[str, Any]:
    handle = await ctx.start_child(double, params)
    assert isinstance(handle, ChildHandle)
    return {"child": handle.run_id, "result": await handle}


@workflow(name="kids.catch")
async def catch(ctx: WorkflowContext, params: Any) -> dict[str, Any]:
    try:
        await ctx.child("kids.fail", params)
    except ChildFailed as exc:
        return {"run_id": exc.run_id, "type": exc.error_type, "message": exc.message,
                "status": exc.status}
    return {}


@workflow(name="kids.uncaught")
async def uncaught(ctx: WorkflowContext, params: Any) -> None:
    await ctx.child("kids.fail", params)


@workflow(name="kids.fan")
async def fan(ctx: WorkflowContext, params: dict[str, Any]) -> list[Any]:
    specs = [("kids.fail" if i in params["fail"] else "kids.double", i)
             for i in range(params["n"])]
    return await ctx.gather_children(specs, max_concurrency=params["limit"])


@workflow(name="kids.cancel")
async def cancels(ctx: WorkflowContext, params: Any) -> Any:
    kept = await ctx.start_child(wait, "kept", on_parent_cancel="abandon")
    gone = await ctx.start_child(wait, "gone")
    return [await gone, await kept]


async def drain(runner: InlineWorkflowRunner, *, rounds: int = 50) -> None:
    """Run every queued run until none is queued, as a fleet of workers would."""
    for _ in range(rounds):
        queued = [i async for i in runner.client.list_runs(status=RunStatus.QUEUED)]
        if not queued:
            return
        for info in queued:
            await runner.run(info.name, info.run_id)
    raise AssertionError("runs still queued")


async def children_of(runner: InlineWorkflowRunner, parent: str) -> list[Any]:
    return [i async for i in runner.client.list_runs() if i.parent_id == parent]


async def test_a_parent_parks_until_its_child_ends_and_journals_only_its_id(
    timed_runner: InlineWorkflowRunner,
) -> None:
    runner = timed_runner
    run = await runner.client.submit("kids.one", 21)
    events = await runner.run(run.name, run.run_id)
    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.WAITING and CHILD_SIGNAL in info.waiting_for
    (started,) = of_type(events, "child:started")
    await drain(runner)
    result = await runner.client.result(run.run_id, timeout=5)
    assert result == {"child": started["child"], "result": 42}
    (child,) = await children_of(runner, run.run_id)
    assert child.run_id == started["child"] and child.parent_id == run.run_id
    journal = await runner.store.read_events(run.run_id)
    assert not [e for e in journal if e.get("result") == 42]  # not copied into the parent


async def test_a_replay_never_starts_a_child_twice(
    timed_runner: InlineWorkflowRunner, clock: ManualClock,
) -> None:
    runner = timed_runner
    run = await runner.client.submit("kids.one", 1)
    for _ in range(3):  # the parent woken again and again before its child ran
        await runner.run(run.name, run.run_id)
        await runner.store.wake_run(run.run_id, now=clock.now())
        await runner.client.signal(run.run_id, CHILD_SIGNAL, None)
    await drain(runner)
    assert (await runner.client.result(run.run_id, timeout=5))["result"] == 2
    assert len(await children_of(runner, run.run_id)) == 1


async def test_a_child_submitted_before_the_journal_record_is_found_again(
    timed_runner: InlineWorkflowRunner, clock: ManualClock,
) -> None:
    """A crash between the submit and the child:started record: the next attempt submits
    with the same key, and finds that child."""
    runner = timed_runner
    run = await runner.client.submit("kids.one", 5)
    handle, created = await runner.store.submit(
        "kids.double", 5, now=clock.now(),
        idempotency_key=child_key(run.run_id, "call:1"),
    )
    assert created
    await drain(runner)
    assert await runner.client.result(run.run_id, timeout=5) == {
        "child": handle.run_id, "result": 10,
    }
    assert len(await children_of(runner, run.run_id)) == 1


async def test_a_child_failure_is_raised_in_the_parent_as_child_failed(
    timed_runner: InlineWorkflowRunner,
) -> None:
    runner = timed_runner
    run = await runner.client.submit("kids.catch", "x")
    await drain(runner)
    caught = await runner.client.result(run.run_id, timeout=5)
    (child,) = await children_of(runner, run.run_id)
    assert caught == {"run_id": child.run_id, "type": "ValueError", "message": "bad x",
                      "status": "failed"}


async def test_an_uncaught_child_failure_fails_the_parent(
    timed_runner: InlineWorkflowRunner,
) -> None:
    runner = timed_runner
    run = await runner.client.submit("kids.uncaught", "y")
    await drain(runner)
    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.FAILED
    assert info.error is not None and info.error["code"] == "child_failed"
    assert info.error["detail"]["error_type"] == "ValueError"


@pytest.mark.parametrize(("n", "limit", "failing"), [
    (7, 3, ()), (5, 1, (3,)), (6, 10, (1, 4)), (1, 1, ()),
])
async def test_gather_children_returns_results_in_order_keeping_to_the_limit(
    timed_runner: InlineWorkflowRunner, n: int, limit: int, failing: tuple[int, ...],
) -> None:
    runner = timed_runner
    run = await runner.client.submit("kids.fan", {"n": n, "limit": limit, "fail": failing})
    most_live = 0
    for _ in range(4 * n + 4):
        queued = [i async for i in runner.client.list_runs(status=RunStatus.QUEUED)]
        live = [i for i in queued if i.name != "kids.fan"]
        most_live = max(most_live, len(live))
        if not queued:
            break
        for info in queued:
            await runner.run(info.name, info.run_id)
    assert most_live <= limit
    info = await runner.client.get(run.run_id)
    kids = await children_of(runner, run.run_id)
    assert len(kids) == n  # every child started once
    if failing:
        assert info.status is RunStatus.FAILED
        first = min(failing)
        assert info.error is not None and f"bad {first}" in info.error["detail"]["message"]
    else:
        assert info.result == [2 * i for i in range(n)]
    journal = await runner.store.read_events(run.run_id)
    started = [c for e in of_type(journal, "child:started") for c in e["children"]]
    assert sorted(i for i, _, _ in started) == list(range(n))


async def test_a_lost_nudge_is_found_by_the_re_check_timer(
    timed_runner: InlineWorkflowRunner, clock: ManualClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child's worker dies between the child's end and the nudge: the parent, parked
    on its timer, looks at the child's run and goes on."""
    runner = timed_runner

    async def lost(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr("pyrula.workflows.engine.nudge_parent", lost)
    assert family_module.nudge_parent is not lost
    run = await runner.client.submit("kids.one", 4)
    await drain(runner)
    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.WAITING and info.wake_at is not None
    clock.advance(info.wake_at - clock.now())
    assert await runner.store.wake_due(now=clock.now(), limit=10) == 1
    await drain(runner)
    assert (await runner.client.result(run.run_id, timeout=5))["result"] == 8


async def test_a_child_ending_between_the_parents_look_and_its_park_is_not_missed(
    timed_runner: InlineWorkflowRunner, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child ends after the parent looked at it and before the parent parks: its
    nudge marks the running parent, whose park is refused; the parent looks again and
    completes in the same attempt, with nothing of the nudge in its journal."""
    runner = timed_runner
    store = runner.store
    park = store.park
    parks: list[bool] = []

    async def child_ends_first(run_id: str, token: int, events: Any, **kw: Any) -> Any:
        if not parks and CHILD_SIGNAL in kw["signals"]:
            (child,) = await children_of(runner, run_id)
            await runner.run(child.name, child.run_id)  # its end nudges the parent
        result = await park(run_id, token, events, **kw)
        parks.append(result.parked)
        return result

    monkeypatch.setattr(store, "park", child_ends_first)
    run = await runner.client.submit("kids.one", 4)
    await runner.run(run.name, run.run_id)

    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.COMPLETED and info.attempt == 1
    assert info.result["result"] == 8
    assert parks == [False]
    assert not of_type(await store.read_events(run.run_id), "signal:received")


async def test_nudges_written_as_signals_still_wake_the_parent_and_replay(
    timed_runner: InlineWorkflowRunner, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Children of an older pyrula nudged their parent with a ``pyrula.child`` signal in
    its journal (a fleet mid-upgrade still may): the parent wakes on it and every later
    attempt replays a journal holding them."""
    runner = timed_runner

    async def as_a_signal(store: Any, run_id: str, parent: str | None, *, now: float) -> None:
        if parent is not None and not (await store.get_run(parent)).status.terminal:
            await store.signal(parent, CHILD_SIGNAL, {"child": run_id}, now=now)

    monkeypatch.setattr(family_module, "_nudge", as_a_signal)
    run = await runner.client.submit("kids.fan", {"n": 6, "limit": 2, "fail": []})
    await drain(runner)

    assert await runner.client.result(run.run_id, timeout=5) == [2 * i for i in range(6)]
    journal = await runner.store.read_events(run.run_id)
    assert [e for e in of_type(journal, "signal:received") if e["name"] == CHILD_SIGNAL]
    assert len(of_type(journal, "run:started")) > 2


async def test_cancelling_a_parent_cancels_its_children_unless_abandoned(
    timed_runner: InlineWorkflowRunner,
) -> None:
    runner = timed_runner
    run = await runner.client.submit("kids.cancel", None)
    await drain(runner)
    kids = {i.params: i for i in await children_of(runner, run.run_id)}
    assert {k.status for k in kids.values()} == {RunStatus.WAITING}
    assert await runner.client.cancel(run.run_id)
    assert (await runner.client.get(run.run_id)).status is RunStatus.CANCELLED
    assert (await runner.client.get(kids["gone"].run_id)).status is RunStatus.CANCELLED
    assert (await runner.client.get(kids["kept"].run_id)).status is RunStatus.WAITING


async def test_cancel_children_cancels_only_those_the_journal_names_for_cancel(
    timed_runner: InlineWorkflowRunner, clock: ManualClock,
) -> None:
    runner = timed_runner
    run = await runner.client.submit("kids.cancel", None)
    await runner.run(run.name, run.run_id)
    kids = {i.params: i for i in await children_of(runner, run.run_id)}
    from pyrula.workflows.family import cancel_children

    journal = await runner.store.read_events(run.run_id)
    assert await cancel_children(runner.store, journal, now=clock.now()) == [
        kids["gone"].run_id
    ]
    assert (await runner.client.get(kids["gone"].run_id)).status is RunStatus.CANCELLED


async def test_runs_show_draws_a_parent_and_its_children_as_a_tree(tmp_path: Any) -> None:
    from click.testing import CliRunner

    from pyrula.cli.runs import runs
    from pyrula.workflows import SQLiteStore

    path = tmp_path / "store.db"
    runner = InlineWorkflowRunner(store=SQLiteStore(str(path)), cloud=False)
    try:
        run = await runner.client.submit("kids.fan", {"n": 2, "limit": 2, "fail": []})
        await drain(runner)
        kids = await children_of(runner, run.run_id)
    finally:
        await runner.aclose()
    store = f"sqlite:///{path}"
    shown = CliRunner().invoke(runs, ["show", run.run_id, "--store", store])
    assert shown.exit_code == 0, shown.output
    tree = [line.strip() for line in shown.output.splitlines() if "kids.double" in line]
    assert len(tree) == len(kids) == 2
    assert [line[:2] for line in tree] == ["├─", "└─"]  # the last drawn as the last
    assert {line.split()[1] for line in tree} == {kid.run_id for kid in kids}
    assert all(line.endswith("kids.double (completed)") for line in tree)
    shown = CliRunner().invoke(runs, ["show", kids[0].run_id, "--store", store])
    assert f"parent {run.run_id}" in shown.output
