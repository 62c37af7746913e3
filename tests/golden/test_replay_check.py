"""The replay check on the golden journals: runs in flight recorded by an earlier pyrula.

``replays_cleanly`` must say yes to every recorded journal (at its frontier and at its
end) with the code it was recorded with, as the golden replay itself proves the engine
does, and no to the same journal with a step of that code renamed before the frontier.
No step code runs during a check.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import WorkflowContext, step
from pyrula.workflows.compat import Stop, replays_cleanly
from pyrula.workflows.definition import REGISTRY, WorkflowSpec
from tests.golden.workflows import EXECUTED, SCENARIOS, ship

JOURNALS = Path(__file__).parent / "journals"
FILES = sorted(JOURNALS.glob("*.json"))


@step(name="golden_check.reserve_v2")
def reserve_v2(order_id: str, qty: int) -> dict[str, Any]:
    return {"order": order_id, "reserved": qty}


async def order_v2(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, Any]:
    """``golden.order`` with its first step renamed."""
    reservation = await reserve_v2(params["order_id"], params["qty"])
    await ctx.sleep(params["cool_off"])
    return {"reservation": reservation, "tracking": await ship(params["order_id"])}


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
@pytest.mark.parametrize("part", ["frontier", "end"])
def test_every_golden_journal_passes_the_replay_check(path: Path, part: str) -> None:
    golden = json.loads(path.read_text(encoding="utf-8"))
    assert golden["scenario"] in SCENARIOS
    EXECUTED.clear()

    verdict = replays_cleanly(REGISTRY.workflow(golden["workflow"]), golden[part]["journal"],
                              run_id=path.stem)

    assert verdict.ok, verdict.reason
    assert EXECUTED == [], "the check ran step code"
    if part == "frontier":  # a run in flight: its code stops at its next call
        assert verdict.stop is Stop.FRONTIER
    elif SCENARIOS[golden["scenario"]].also:
        # A child's result is in the child's run, not in this journal: a check without
        # the store stops at the first wait for one.
        assert verdict.stop is Stop.FRONTIER and "child" in str(verdict.reason)
    else:
        assert verdict.stop in (Stop.RETURNED, Stop.CONTINUED)


@pytest.mark.parametrize("name", ["order_sleeping", "order_retry_parked"])
def test_a_renamed_step_fails_the_replay_check_of_a_golden_run(name: str) -> None:
    golden = json.loads((JOURNALS / f"{name}.json").read_text(encoding="utf-8"))

    verdict = replays_cleanly(WorkflowSpec("golden.order", order_v2),
                              golden["frontier"]["journal"], run_id=name)

    assert not verdict.ok and verdict.stop is Stop.DIVERGED
    assert ("has 'golden.reserve' at call 1, but the code now calls "
            "'golden_check.reserve_v2'") in str(verdict.reason)
