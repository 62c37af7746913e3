"""Golden journals: runs in flight recorded by an earlier pyrula must replay with this one.

Each file in ``journals/`` holds a run's journal at a frontier (parked in a sleep, waiting
for a signal, parked on a retry backoff...) and what happened from there when it was
recorded. The test loads the frontier into a fresh store through the Store protocol,
drives the run on with the same actions, and checks that it ends the same way: no
``NonDeterminismError``, the same status and result, no recorded step executed again,
and every recorded field of every event reproduced (timestamps, workers and run ids
aside; fields added since are allowed).

Regenerate after an intended change of the journal or of these workflows::

    PYRULA_GOLDEN_REGENERATE=1 pytest tests/golden

That rewrites ``journals/<scenario>.json``. A failure here means runs in flight today
would break on upgrade; regenerate only if that is acceptable (and say so). To keep
replaying an older recording, copy it to ``journals/<scenario>@<label>.json`` first:
every file of a scenario is replayed.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import InlineWorkflowRunner, MemoryStore, RunStatus
from pyrula.workflows.clock import ManualClock
from pyrula.workflows.stores.base import Store
from tests.golden.harness import (
    GOLDEN_EPOCH,
    Scenario,
    journal_differences,
    load_journal,
    outcome,
)
from tests.golden.workflows import EXECUTED, FAIL_NEXT, SCENARIOS

JOURNALS = Path(__file__).parent / "journals"
FORMAT = 1


def _regenerating() -> bool:
    return os.environ.get("PYRULA_GOLDEN_REGENERATE", "").lower() in ("1", "true", "yes")


def _files(scenario: str) -> list[Path]:
    return sorted(JOURNALS.glob(f"{scenario}.json")) + sorted(JOURNALS.glob(f"{scenario}@*.json"))


async def record(scenario: Scenario) -> dict[str, Any]:
    """Run ``scenario`` with today's code and return what its golden file holds."""
    EXECUTED.clear()
    FAIL_NEXT.clear()
    FAIL_NEXT.update(scenario.failures)
    clock = ManualClock(start=GOLDEN_EPOCH)
    runner = InlineWorkflowRunner(
        store=MemoryStore(), clock=clock, workflows=[scenario.workflow, *scenario.also],
        cloud=False,
    )
    runner.worker_id = "golden-recorder"  # stable files: the host and pid are not news
    try:
        run = await runner.client.submit(scenario.workflow, scenario.params)
        if scenario.fork is not None:
            for action in scenario.fork.actions:
                await action(runner, clock, run.run_id)
            run = await runner.client.fork(run.run_id, from_step=scenario.fork.from_step,
                                           params=scenario.fork.params)
        for action in scenario.to_frontier:
            await action(runner, clock, run.run_id)
        frontier = await runner.client.get(run.run_id)
        assert not frontier.status.terminal and frontier.status is not RunStatus.RUNNING
        frontier_journal = await runner.client.events(run.run_id)
        frontier_clock = clock.now()

        FAIL_NEXT.clear()
        mark = len(EXECUTED)
        for action in scenario.to_end:
            await action(runner, clock, run.run_id)
        end = await runner.client.get(run.run_id)
        assert end.status.terminal, f"{scenario.name}: the run did not end ({end.status})"
        return {
            "format": FORMAT,
            "scenario": scenario.name,
            "doc": scenario.doc,
            "workflow": scenario.workflow,
            "params": scenario.params,
            "frontier": {
                "clock": frontier_clock,
                "status": frontier.status.value,
                "journal": frontier_journal,
            },
            "end": {
                **outcome(end),
                "executed": EXECUTED[mark:],
                "journal": await runner.client.events(run.run_id),
            },
        }
    finally:
        FAIL_NEXT.clear()
        await runner.aclose()


async def replay(store: Store, golden: dict[str, Any], scenario: Scenario) -> None:
    """Load the recorded frontier into ``store``, drive it on, compare with the recording."""
    EXECUTED.clear()
    FAIL_NEXT.clear()
    frontier, end = golden["frontier"], golden["end"]

    run_id = await load_journal(store, frontier["journal"])
    loaded = await store.read_events(run_id)
    assert journal_differences(frontier["journal"], loaded) == []
    assert [e["ts"] for e in loaded] == [e["ts"] for e in frontier["journal"]]
    info = await store.get_run(run_id)
    assert info is not None and info.status.value == frontier["status"]

    clock = ManualClock(start=frontier["clock"])
    runner = InlineWorkflowRunner(
        store=store, clock=clock, workflows=[scenario.workflow, *scenario.also], cloud=False
    )
    try:
        for action in scenario.to_end:
            await action(runner, clock, run_id)
    finally:
        await runner.aclose()

    info = await store.get_run(run_id)
    assert info is not None
    if info.error is not None and info.error.get("code") == "non_determinism":
        pytest.fail(f"the recorded run no longer replays: {info.error['message']}")
    assert outcome(info) == {k: end[k] for k in ("status", "result", "error_code")}
    assert end["executed"] == EXECUTED, "a step recorded in the journal ran again"
    problems = journal_differences(end["journal"], await store.read_events(run_id))
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def golden_files() -> None:
    """With PYRULA_GOLDEN_REGENERATE=1, record every scenario anew before replaying."""
    if not _regenerating():
        return
    JOURNALS.mkdir(exist_ok=True)
    for scenario in SCENARIOS.values():
        data = asyncio.run(record(scenario))
        text = json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False)
        (JOURNALS / f"{scenario.name}.json").write_text(text + "\n", encoding="utf-8")


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_golden_journal_replays(name: str, store: Store, golden_files: None) -> None:
    scenario = SCENARIOS[name]
    files = _files(name)
    assert files, (
        f"no golden journal for scenario {name!r} in {JOURNALS}; "
        "record it with PYRULA_GOLDEN_REGENERATE=1 pytest tests/golden"
    )
    for path in files:
        golden = json.loads(path.read_text(encoding="utf-8"))
        assert golden["format"] == FORMAT, f"{path.name}: unknown format {golden['format']}"
        assert golden["workflow"] == scenario.workflow
        await replay(store, golden, scenario)


def test_every_golden_journal_belongs_to_a_scenario(golden_files: None) -> None:
    for path in JOURNALS.glob("*.json"):
        name = json.loads(path.read_text(encoding="utf-8"))["scenario"]
        assert name in SCENARIOS, f"{path.name} replays scenario {name!r}, which is gone"
        assert path.stem.split("@")[0] == name, f"{path.name} holds scenario {name!r}"


def test_the_journals_pin_runs_in_flight(golden_files: None) -> None:
    """The set covers a sleep, a signal wait, a retry backoff, an interrupt, a due timer
    and a fork."""
    frontiers = {}
    for name in SCENARIOS:
        for path in _files(name):
            golden = json.loads(path.read_text(encoding="utf-8"))
            last = golden["frontier"]["journal"][-1]
            frontiers[name] = (golden["frontier"]["status"], last["type"], last.get("reason"))
    assert frontiers["order_sleeping"] == ("sleeping", "run:sleeping", None)
    assert frontiers["order_retry_parked"] == ("sleeping", "run:sleeping", "retry")
    assert frontiers["approval_waiting"] == ("waiting", "run:waiting", None)
    assert frontiers["approval_timed_out"] == ("queued", "run:woken", "timer")
    assert frontiers["fanout_interrupted"] == ("waiting", "run:waiting", None)
    assert frontiers["counter_sleeping"] == ("sleeping", "run:sleeping", None)
    assert frontiers["tally_updated"] == ("waiting", "update:applied", None)
    assert frontiers["fork_sleeping"] == ("sleeping", "run:sleeping", None)


def test_the_fork_journal_pins_a_forks_origin(golden_files: None) -> None:
    """A fork's first run:started and its run:forked name the run, call and step."""
    golden = json.loads((JOURNALS / "fork_sleeping.json").read_text(encoding="utf-8"))
    started, forked = golden["frontier"]["journal"][1:3]
    assert (started["type"], forked["type"]) == ("run:started", "run:forked")
    assert started["forked_from"] == forked["from_run"]
    assert (started["from_call"], started["from_step"]) == (2, "golden.charge")
    assert (forked["from_call"], forked["from_step"], forked["reused"]) == (
        2, "golden.charge", 1)


def test_the_patch_journals_pin_both_sides_of_a_patch(golden_files: None) -> None:
    """A run recorded before a patch (no marker) and runs recorded with its marker."""
    def markers(path: str) -> list[tuple[int, str]]:
        golden = json.loads((JOURNALS / path).read_text(encoding="utf-8"))
        return [(e["call"], e["patch"]) for e in golden["end"]["journal"]
                if e["type"] == "patch:applied"]

    assert markers("patch_added@before-patch.json") == []
    assert markers("patch_added.json") == [(2, "golden-extra-tick")]
    assert markers("patch_deprecated@patched.json") == [(2, "golden-extra-tick")]
    assert markers("patch_deprecated.json") == []
