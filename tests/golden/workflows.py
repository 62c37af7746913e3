"""The workflows whose journals are pinned in ``journals/``, and how each is driven.

Keep these stable: a golden journal is a run in flight recorded by an earlier version of
pyrula, and the point is that today's engine still carries it to the same end. Changing a
workflow here changes the code the journals replay against; add a new workflow (and
scenario) instead of editing one.

Steps append their name to ``EXECUTED`` so a replay can prove that a step recorded in
the journal did not run again. ``FAIL_NEXT`` injects failures while recording.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pyrula.workflows import WorkflowContext, step, workflow
from tests.golden.harness import (
    Drain,
    Fork,
    Query,
    Resume,
    Run,
    Scenario,
    Signal,
    Timers,
    Update,
    Wake,
)

EXECUTED: list[str] = []
#: Step name -> how many of its next calls fail (set only while recording).
FAIL_NEXT: dict[str, int] = {}


def _execute(name: str, value: Any) -> Any:
    EXECUTED.append(name)
    if FAIL_NEXT.get(name, 0) > 0:
        FAIL_NEXT[name] -= 1
        raise ConnectionError(f"{name}: injected failure")
    return value


@step(name="golden.reserve")
def reserve(order_id: str, qty: int) -> dict[str, Any]:
    return dict(_execute("golden.reserve", {"order": order_id, "reserved": qty}))


@step(name="golden.charge", retries=2, retry_backoff=30.0)
async def charge(order_id: str, amount: float) -> dict[str, Any]:
    return dict(_execute("golden.charge", {"order": order_id, "charged": amount}))


@step(name="golden.ship")
def ship(order_id: str) -> str:
    return str(_execute("golden.ship", f"track-{order_id}"))


@step(name="golden.prepare")
async def prepare(doc: str) -> str:
    return str(_execute("golden.prepare", f"draft of {doc}"))


@step(name="golden.notify")
async def notify(channel: str, text: str) -> str:
    return str(_execute("golden.notify", f"{channel}: {text}"))


@step(name="golden.tick")
def tick(n: int) -> int:
    return int(_execute("golden.tick", n))


@workflow(name="golden.order")
async def order(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, Any]:
    reservation = await reserve(params["order_id"], params["qty"])
    receipt = await charge(params["order_id"], params["amount"])
    await ctx.sleep(params["cool_off"])
    tracking = await ship(params["order_id"])
    return {"reservation": reservation, "receipt": receipt, "tracking": tracking}


@workflow(name="golden.approval")
async def approval(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, Any]:
    draft = await prepare(params["doc"])
    decision = await ctx.wait_for_signal("approved", timeout=params["timeout"])
    if decision is None:
        await notify("ops", f"{params['doc']} timed out")
    else:
        await notify("authors", f"{params['doc']} approved by {decision['by']}")
    return {"draft": draft, "decision": decision}


@workflow(name="golden.fanout")
async def fanout(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, Any]:
    started = ctx.now().isoformat()
    token = str(ctx.uuid4())
    pick = ctx.random()
    sent = await asyncio.gather(*(notify(channel, token) for channel in params["channels"]))
    answer = await ctx.interrupt({"question": "ship it?", "sent": len(sent)})
    tracking = await ship(token) if answer.get("ship") else None
    return {"started": started, "token": token, "pick": pick, "sent": sent,
            "answer": answer, "tracking": tracking}


@workflow(name="golden.counter")
async def counter(ctx: WorkflowContext, params: dict[str, int]) -> int:
    n = int(await tick(params["n"]))
    await ctx.sleep(60)
    if n < params["until"]:
        ctx.continue_as_new({"n": n + 1, "until": params["until"]})
    return n


@workflow(name="golden.patch_added")
async def patch_added(ctx: WorkflowContext, params: dict[str, int]) -> dict[str, Any]:
    """Its journal ``@before-patch`` was recorded by this code without the patch (``extra``
    None, no tick between the first and the sleep): a run parked then keeps to that."""
    first = int(await tick(params["first"]))
    extra = int(await tick(params["extra"])) if ctx.patched("golden-extra-tick") else None
    await ctx.sleep(60)
    return {"first": first, "extra": extra, "last": int(await tick(params["last"]))}


@workflow(name="golden.patch_deprecated")
async def patch_deprecated(ctx: WorkflowContext, params: dict[str, int]) -> dict[str, Any]:
    """``golden.patch_added`` once its patch is deprecated; its journal ``@patched`` was
    recorded by that code, and holds the patch's marker."""
    first = int(await tick(params["first"]))
    ctx.deprecate_patch("golden-extra-tick")
    extra: int | None = int(await tick(params["extra"]))
    await ctx.sleep(60)
    return {"first": first, "extra": extra, "last": int(await tick(params["last"]))}

@workflow(name="golden.tally")
async def tally(ctx: WorkflowContext, params: dict[str, int]) -> dict[str, Any]:
    """Updates change its total between steps; queries read it."""
    state = {"total": int(await tick(params["start"])), "updates": 0}

    def add(n: Any) -> int:
        if not isinstance(n, int) or n <= 0:
            raise ValueError(f"add a positive int, got {n!r}")
        state["total"] += n
        state["updates"] += 1
        return state["total"]

    ctx.set_query_handler("total", lambda: state["total"])
    ctx.set_update_handler("add", add)
    done = await ctx.wait_for_signal("done", timeout=86400)
    last = int(await tick(state["total"]))
    return {"last": last, "updates": state["updates"], "done": done}


@workflow(name="golden.kid")
async def kid(ctx: WorkflowContext, params: int) -> int:
    return int(await tick(params))


@workflow(name="golden.family")
async def family(ctx: WorkflowContext, params: dict[str, int]) -> dict[str, Any]:
    """A parent: a child started and awaited, then a fan-out kept to two at a time."""
    first = int(await tick(params["first"]))
    await ctx.sleep(60)
    handle = await ctx.start_child("golden.kid", params["child"])
    one = await handle
    many = await ctx.gather_children(
        [("golden.kid", n) for n in range(params["fan"])], max_concurrency=2
    )
    return {"first": first, "one": one, "many": many}


TICKS = {"first": 1, "extra": 10, "last": 2}

ORDER = {"order_id": "o-1", "qty": 2, "amount": 19.5, "cool_off": 3600}

SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            name="order_sleeping",
            doc="two steps done, parked in a durable sleep; the timer fires",
            workflow="golden.order", params=ORDER,
            to_frontier=(Run(),),
            to_end=(Timers(3600), Run()),
        ),
        Scenario(
            name="order_retry_parked",
            doc="a step failed and its 30 s backoff parked the run; the retry succeeds",
            workflow="golden.order", params=ORDER, failures={"golden.charge": 1},
            to_frontier=(Run(),),
            to_end=(Timers(40), Run(), Wake(), Run()),
        ),
        Scenario(
            name="approval_waiting",
            doc="waiting for a signal with a timeout; the signal comes",
            workflow="golden.approval", params={"doc": "spec", "timeout": 86400},
            to_frontier=(Run(),),
            to_end=(Signal("approved", {"by": "alice"}), Run()),
        ),
        Scenario(
            name="approval_timed_out",
            doc="the wait's timer fired (run queued); a late signal must not win on replay",
            workflow="golden.approval", params={"doc": "spec", "timeout": 60},
            to_frontier=(Run(), Timers(61)),
            to_end=(Signal("approved", {"by": "bob"}), Run()),
        ),
        Scenario(
            name="fanout_interrupted",
            doc="now/uuid4/random and gathered steps recorded, parked on an interrupt",
            workflow="golden.fanout", params={"channels": ["mail", "chat", "sms"]},
            to_frontier=(Run(),),
            to_end=(Resume({"ship": True}), Run()),
        ),
        Scenario(
            name="counter_sleeping",
            doc="parked in a sleep before continue_as_new",
            workflow="golden.counter", params={"n": 0, "until": 3},
            to_frontier=(Run(),),
            to_end=(Timers(60), Run()),
        ),
        Scenario(
            name="patch_added",
            doc="a patch's marker recorded, parked in a sleep; the timer fires",
            workflow="golden.patch_added", params=TICKS,
            to_frontier=(Run(),),
            to_end=(Timers(60), Run()),
        ),
        Scenario(
            name="family_sleeping",
            doc="parked in a sleep before starting a child and a fan-out of children",
            workflow="golden.family", params={"first": 1, "child": 7, "fan": 3},
            to_frontier=(Run(),),
            to_end=(Timers(60), Drain()),
            also=("golden.kid",),
        ),
        Scenario(
            name="patch_deprecated",
            doc="a deprecated patch at its point, parked in a sleep; the timer fires",
            workflow="golden.patch_deprecated", params=TICKS,
            to_frontier=(Run(),),
            to_end=(Timers(60), Run()),
        ),
        Scenario(
            name="fork_sleeping",
            doc="a fork from the second step, with new params, of a run that ended; it "
                "reused the first step, ran the second and parked in the sleep",
            workflow="golden.order", params=ORDER,
            fork=Fork(actions=(Run(), Timers(3600), Run()), from_step="golden.charge",
                      params={**ORDER, "amount": 25.0}),
            to_frontier=(Run(),),
            to_end=(Timers(3600), Run()),
        ),
        Scenario(
            name="tally_updated",
            doc="two updates applied (one refused) while waiting for a signal; one more "
                "update, then the signal",
            workflow="golden.tally", params={"start": 1},
            to_frontier=(Run(), Update("u-1", "add", 2), Run(), Update("u-2", "add", 0),
                         Update("u-3", "add", 5), Run(), Query("total", 8)),
            to_end=(Query("total", 8), Update("u-4", "add", 10), Run(), Query("total", 18),
                    Signal("done", "now"), Run()),
        ),
    )
}
