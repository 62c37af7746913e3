"""Golden-journal plumbing: scenarios, the actions that drive them, and a journal loader.

A scenario is a workflow, its params, the actions that take a new run to a frontier (the
run in flight whose journal is pinned) and the actions that take it from there to its
end. ``load_journal`` recreates a run in flight in any store through the public Store
protocol, exactly as the engine and the clients would have written it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyrula.workflows import InlineWorkflowRunner, RunInfo, RunStatus
from pyrula.workflows.clock import ManualClock
from pyrula.workflows.events import UPDATE_SIGNAL
from pyrula.workflows.stores.base import Store

Event = dict[str, Any]

#: Where every recording's manual clock starts (2027-01-15 08:00 UTC).
GOLDEN_EPOCH = 1_800_000_000.0


class Action(Protocol):
    async def __call__(
        self, runner: InlineWorkflowRunner, clock: ManualClock, run_id: str
    ) -> None: ...


@dataclass(frozen=True)
class Run:
    """Advance the run to its next frontier, as a worker that claims it would."""

    async def __call__(self, runner: InlineWorkflowRunner, clock: ManualClock, run_id: str) -> None:
        info = await runner.client.get(run_id)
        await runner.run(info.name, run_id)


@dataclass(frozen=True)
class Drain:
    """Run every queued run (the scenario's run and its children) until none is queued,
    as a fleet would; the children run by the scenario's ``also`` workflows."""

    async def __call__(self, runner: InlineWorkflowRunner, clock: ManualClock, run_id: str) -> None:
        for _ in range(100):
            queued = [i async for i in runner.client.list_runs(status=RunStatus.QUEUED)]
            if not queued:
                return
            for info in queued:
                await runner.run(info.name, info.run_id)
        raise AssertionError("runs still queued after 100 rounds")


@dataclass(frozen=True)
class Timers:
    """Move time on by ``seconds`` and wake what is due, as the worker's timer loop would."""

    seconds: float

    async def __call__(self, runner: InlineWorkflowRunner, clock: ManualClock, run_id: str) -> None:
        clock.advance(self.seconds)
        await runner.store.wake_due(now=clock.now(), limit=100)


@dataclass(frozen=True)
class Wake:
    """Wake a sleeping run now (``client.wake``)."""

    async def __call__(self, runner: InlineWorkflowRunner, clock: ManualClock, run_id: str) -> None:
        await runner.client.wake(run_id)


@dataclass(frozen=True)
class Signal:
    name: str
    payload: Any

    async def __call__(self, runner: InlineWorkflowRunner, clock: ManualClock, run_id: str) -> None:
        await runner.client.signal(run_id, self.name, self.payload)


@dataclass(frozen=True)
class Resume:
    value: Any

    async def __call__(self, runner: InlineWorkflowRunner, clock: ManualClock, run_id: str) -> None:
        await runner.client.resume(run_id, self.value)


@dataclass(frozen=True)
class Update:
    """Deliver an update as ``client.update`` sends it (with a fixed id, so the recording
    is stable), without waiting for its reply: a ``Run`` applies it."""

    update_id: str
    name: str
    payload: Any

    async def __call__(self, runner: InlineWorkflowRunner, clock: ManualClock, run_id: str) -> None:
        body = {"id": self.update_id, "name": self.name, "payload": self.payload}
        await runner.store.signal(run_id, UPDATE_SIGNAL, body, now=clock.now())


@dataclass(frozen=True)
class Query:
    """Query the run (a replay on the caller) and check the answer."""

    name: str
    expected: Any

    async def __call__(self, runner: InlineWorkflowRunner, clock: ManualClock, run_id: str) -> None:
        answer = await runner.client.query(run_id, self.name)
        assert answer == self.expected, f"query {self.name!r}: {answer!r} != {self.expected!r}"


@dataclass(frozen=True)
class Scenario:
    """``fork``: the recorded run is a fork (``client.fork``) of a run of the workflow
    with ``params``, taken to its end by ``fork.actions``; None: the run is submitted."""

    name: str
    doc: str
    workflow: str
    params: Any
    to_frontier: tuple[Action, ...]
    to_end: tuple[Action, ...]
    #: Step name -> failing calls injected while recording ``to_frontier``.
    failures: Mapping[str, int] = field(default_factory=dict)
    #: Other workflows the run needs served (its child workflows).
    also: tuple[str, ...] = ()
    fork: Fork | None = None


@dataclass(frozen=True)
class Fork:
    """Record a fork from step ``from_step`` (with ``params`` instead of the run's if
    given) of a run that ``actions`` took to its end."""

    actions: tuple[Action, ...]
    from_step: str | int
    params: Any = None


# --- loading a recorded run in flight into a store ------------------------------------

_PARKING = ("run:sleeping", "run:waiting")
_LOCK_TTL = 3600.0


async def load_journal(store: Store, events: Sequence[Event]) -> str:
    """Recreate the run in flight that ``events`` records; return its (new) run id.

    Each recorded state change is replayed as the call that wrote it, with the event's
    ``ts`` as ``now``: ``submit``; ``claim_run`` (with the recorded worker) for
    ``run:started``; the engine's events (those with a ``call``) ``append``-ed with the
    attempt's token, the last batch of an attempt ``park``-ed if it ends in
    ``run:sleeping``/``run:waiting``; ``signal``; ``wake_due`` / ``wake_run`` for
    ``run:woken``. The store therefore holds the same journal (seqs, timestamps) and the
    same run state (status, timer, awaited signal) as the store that recorded it.

    Limits: a park is assumed to wait on its last event only (one sleep or one wait, no
    workflow timeout), and on updates too if the journal holds any (the run registered an
    update handler before it first parked); runs that ended, were requeued or continued
    are not loadable.
    """
    head, *rest = events
    if head["type"] != "run:submitted":
        raise ValueError(f"a journal starts with run:submitted, not {head['type']}")
    handle, _ = await store.submit(
        head["name"], head["params"], now=head["ts"],
        owner=head.get("owner"), idempotency_key=head.get("idempotency_key"),
    )
    loader = _Loader(store, handle.run_id,
                     [UPDATE_SIGNAL] if any(_is_update(e) for e in events) else [])
    for event in rest:
        if "call" in event or event["type"] in ("update:applied", "run:forked"):
            loader.pending.append(event)  # written by the engine
            continue
        await loader.write_pending()
        await loader.state_change(event)
    await loader.write_pending()
    return handle.run_id


class _Loader:
    """Writes a recorded journal into ``store`` as run ``run_id``, event by event."""

    def __init__(self, store: Store, run_id: str, updates: list[str]) -> None:
        self.store, self.run_id, self.updates = store, run_id, updates
        self.token = 0
        self.written = 1
        self.pending: list[Event] = []
        self.parks: list[Event] = []

    async def write_pending(self) -> None:
        """The engine's events since the last state change: appended, or parked with."""
        if not self.pending:
            return
        batch = [{k: v for k, v in e.items() if k != "seq"} for e in self.pending]
        last = batch[-1]
        if last["type"] in _PARKING:
            self.parks.append(last)
        elif last["type"] == "update:applied" and self.parks:
            last = self.parks[-1]  # updates applied while parked: the run parks again on that
        if last["type"] in _PARKING:
            waiting = last["type"] == "run:waiting"
            parked = await self.store.park(
                self.run_id, self.token, batch, now=batch[-1]["ts"],
                wake_at=last.get("timeout_at") if waiting else last["wake_at"],
                signals=([last["signal"]] if waiting else []) + self.updates,
                known_seq=self.written, interrupt=last.get("interrupt"),
            )
            if not parked.parked:
                raise ValueError(f"run {self.run_id}: the store refused to park at seq "
                                 f"{self.written}")
        else:
            await self.store.append(self.run_id, self.token, batch, now=last["ts"],
                                    lock_ttl=_LOCK_TTL)
        self.written += len(batch)
        self.pending = []

    async def state_change(self, event: Event) -> None:
        """One event a client, a claim or a timer wrote, replayed as that call."""
        store, run_id, type_, now = self.store, self.run_id, event["type"], event["ts"]
        if type_ == "run:started":
            claimed = await store.claim_run(run_id, event["worker"], now=now, lock_ttl=_LOCK_TTL)
            if claimed is None or claimed.token != event["attempt"]:
                raise ValueError(f"run {run_id}: could not claim attempt {event['attempt']}")
            self.token = claimed.token
        elif type_ in ("signal:received", "interrupt:resumed"):
            await store.signal(run_id, event["name"], event.get("payload"), now=now)
        elif type_ == "run:woken" and event.get("reason") == "timer":
            if await store.wake_due(now=now, limit=1) != 1:
                raise ValueError(f"run {run_id}: no timer was due at {now}")
        elif type_ == "run:woken" and event.get("reason") == "manual":
            if not await store.wake_run(run_id, now=now):
                raise ValueError(f"run {run_id}: could not wake it at {now}")
        else:
            raise ValueError(f"cannot load a {type_} event into a run in flight")
        self.written += 1


def _is_update(event: Event) -> bool:
    return event["type"] == "update:applied" or event.get("name") == UPDATE_SIGNAL


# --- comparing journals ---------------------------------------------------------------

#: Fields that differ between a recording and its replay by nature, not by behaviour
#: (``build``: the fingerprint of the code the process that claimed it had loaded).
VOLATILE = frozenset({"ts", "worker", "build"})
#: Fields that hold run ids, which a store makes anew.
RUN_IDS = frozenset({"successor", "predecessor", "child"})


def normalise(event: Event) -> Event:
    out = {k: v for k, v in event.items() if k not in VOLATILE}
    for key in RUN_IDS & out.keys():
        out[key] = "<run id>"
    if "children" in out:  # a fan-out's [index, run id, name]
        out["children"] = [[i, "<run id>", name] for i, _, name in out["children"]]
    if out.get("name") == "pyrula.child" and isinstance(out.get("payload"), dict):
        out["payload"] = {**out["payload"], "child": "<run id>"}
    return out


def journal_differences(recorded: Sequence[Event], replayed: Sequence[Event]) -> list[str]:
    """What the replayed journal lacks of the recorded one (ts, workers and ids aside).

    Every field a recorded event had must be in the replayed event with the same value;
    fields the current code adds are allowed, so a journal stays comparable as events grow.
    """
    problems = []
    if [e["type"] for e in recorded] != [e["type"] for e in replayed]:
        problems.append(
            f"event types differ:\n  recorded {[e['type'] for e in recorded]}"
            f"\n  replayed {[e['type'] for e in replayed]}"
        )
    for was, now in zip(recorded, replayed, strict=False):
        want, got = normalise(was), normalise(now)
        missing = {k: v for k, v in want.items() if got.get(k, object()) != v}
        if missing:
            problems.append(
                f"seq {was.get('seq')} {was['type']}: recorded {missing}, "
                f"replayed { {k: got.get(k) for k in missing} }"
            )
    return problems


def outcome(info: RunInfo) -> dict[str, Any]:
    """The end of a run as the golden file records it."""
    return {
        "status": info.status.value,
        "result": info.result,
        "error_code": None if info.error is None else info.error.get("code"),
    }
