"""Generative: any sequence of updates, signals and attempts ends in the state of a model
that applies each accepted update once, in the order the run received them."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pyrula.workflows import InlineWorkflowRunner, MemoryStore, WorkflowContext, step, workflow


@step(name="qm.keep")
def keep(total: int) -> int:
    return total


@workflow(name="qm.ledger")
async def ledger(ctx: WorkflowContext, params: None) -> dict[str, Any]:
    state: dict[str, Any] = {"total": 0, "added": [], "notes": []}

    def add(n: int) -> int:
        if n < 0:
            raise ValueError(f"cannot add {n}")
        state["total"] += n
        state["added"].append(n)
        return int(state["total"])

    ctx.set_update_handler("add", add)
    ctx.set_query_handler("total", lambda: state["total"])
    while True:
        note = await ctx.wait_for_signal("note")
        if note == "end":
            return state
        state["notes"].append(note)
        state["total"] = await keep(state["total"])  # a step between, replayed each attempt


ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("update"), st.integers(min_value=-3, max_value=20)),
        st.tuples(st.just("signal"), st.sampled_from(["a", "b", "c"])),
        st.tuples(st.just("run"), st.just(0)),
        st.tuples(st.just("query"), st.just(0)),
    ),
    max_size=14,
)


class Model:
    """Each accepted update once, in arrival order; each signal consumed in order."""

    def __init__(self) -> None:
        self.total = 0
        self.added: list[int] = []
        self.notes: list[str] = []
        self.replies: dict[str, Any] = {}

    def update(self, update_id: str, n: int) -> None:
        if n < 0:
            self.replies[update_id] = ("ValueError", f"cannot add {n}")
            return
        self.total += n
        self.added.append(n)
        self.replies[update_id] = self.total


async def _drive(actions: list[tuple[str, int | str]]) -> None:
    runner = InlineWorkflowRunner(store=MemoryStore(), workflows=[ledger], cloud=False)
    client, model = runner.client, Model()
    try:
        run = await client.submit(ledger)
        await runner.run(run.name, run.run_id)
        for kind, value in actions:
            if kind == "update":
                _, update_id = await client._send_update(run.run_id, "add", value)
                model.update(update_id, int(value))
            elif kind == "signal":
                await client.signal(run.run_id, "note", value)
                model.notes.append(str(value))
            elif kind == "run":
                await runner.run(run.name, run.run_id)
            else:  # a query sees the updates applied so far (the last total), writes nothing
                journal = await client.events(run.run_id)
                totals = [r for r in _replies(journal).values() if isinstance(r, int)]
                assert await client.query(run.run_id, "total") == max([0, *totals])
                assert await client.events(run.run_id) == journal
        await client.signal(run.run_id, "note", "end")
        while not (await client.get(run.run_id)).status.terminal:
            await runner.run(run.name, run.run_id)
        result = await client.result(run.run_id, timeout=5)
        assert result == {"total": model.total, "added": model.added, "notes": model.notes}
        journal = await client.events(run.run_id)
        applied = _applied(journal)
        assert len(applied) == len({e["update"] for e in applied})  # each update once
        assert _replies(journal) == model.replies
    finally:
        await runner.aclose()


def _applied(journal: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in journal if e["type"] == "update:applied"]


def _replies(journal: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        e["update"]: (e["error_type"], e["message"]) if "error_type" in e else e["result"]
        for e in _applied(journal)
    }


@settings(max_examples=40, deadline=None)
@given(ACTIONS)
def test_updates_apply_once_in_order_whatever_the_interleaving(
    actions: list[tuple[str, int | str]],
) -> None:
    asyncio.run(_drive(actions))
