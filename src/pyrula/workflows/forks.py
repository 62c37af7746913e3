"""Forks: a new run of a run's workflow that reuses what the run recorded before a step.

``client.fork(run_id, from_step=K)`` picks the fork point in the run's journal (the first
call of the step named ``K``, or its ``K``-th step call) and submits a new run of the same
workflow under the idempotency key ``fork:<run id>:<call>:<nonce>.<step>`` (``<step>``:
the step's name in UTF-8, hex-encoded): the key, in the new run's ``run:submitted``, names
the run, call and step it forks, and so does the fork's first ``run:started``, which every
store writes from the key. The first attempt of the fork
*seeds* it (:func:`seed_fork`): it writes a ``run:forked`` naming the run and step, then
a copy of what the run recorded before the fork point (its steps' outcomes, sleeps, waits
and the signals they took), which the fork's code replays like its own journal before it
runs the rest on today's code. A fork is seeded once: an attempt that finds
``run:forked`` in the journal goes on from there.

The choice of the point and the copy are pure; :func:`seed_fork` reads the forked run's
journal and appends to the fork's through the store it is given.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pyrula.workflows.errors import JournalCorrupt, WorkflowNotFound
from pyrula.workflows.events import Event, EventType, make_event
from pyrula.workflows.records import AppendResult, ClaimedRun

#: The idempotency key of a fork starts with this: ``fork:<run id>:<call>:<nonce>.<step>``.
FORK_KEY_PREFIX = "fork:"
#: Events without a call that a fork's copy keeps: what decided its waits and sleeps.
_DECIDING = frozenset({EventType.SIGNAL_RECEIVED, EventType.INTERRUPT_RESUMED,
                       EventType.RUN_WOKEN})


@dataclass(frozen=True, slots=True)
class ForkPoint:
    """Where a fork leaves run ``run_id``: at ``call``, the first call of step ``step``."""

    run_id: str
    call: int
    step: str

    def key(self) -> str:
        """A new fork's idempotency key (a nonce in it: each fork is a run of its own; the
        step's name hex-encoded after it, so the key holds no colon past the call)."""
        nonce = uuid.uuid4().hex[:12]
        return f"{FORK_KEY_PREFIX}{self.run_id}:{self.call}:{nonce}.{self.step.encode().hex()}"


def step_calls(events: Sequence[Event]) -> list[tuple[int, str]]:
    """The run's step calls (each call that started a step), in call order, with names.
    Recorded values (``ctx.now()``...) are not step calls."""
    calls: dict[int, str] = {}
    for event in events:
        if event.get("type") == EventType.STEP_STARTED and "call" in event:
            calls.setdefault(int(event["call"]), str(event.get("step")))
    return sorted(calls.items())


def fork_point(run_id: str, events: Sequence[Event], from_step: str | int) -> ForkPoint:
    """The call of step ``from_step`` (a name: its first call; an int: the 1-based
    position among the run's step calls). Raises ValueError naming what is wrong."""
    calls = step_calls(events)
    if isinstance(from_step, bool) or not isinstance(from_step, str | int):
        raise TypeError(f"from_step must be a step name or a 1-based position, "
                        f"got {from_step!r}")
    if isinstance(from_step, int):
        if not 1 <= from_step <= len(calls):
            raise ValueError(f"run {run_id} made {len(calls)} step call(s); from_step "
                             f"{from_step} is not a position among them (1..{len(calls)})")
        call, name = calls[from_step - 1]
        return ForkPoint(run_id, call, name)
    for call, name in calls:
        if name == from_step:
            return ForkPoint(run_id, call, name)
    names = ", ".join(dict.fromkeys(name for _, name in calls)) or "none"
    raise ValueError(f"run {run_id} never called a step named {from_step!r} "
                     f"(its steps: {names})")


#: A fork's key, ``fork:<run id>:<call>:<nonce>[.<step in hex>]`` (claim.lua matches the
#: same pattern on Valkey, for a fork's first ``run:started``). Forks made before the step
#: was in the key have none.
_FORK_KEY = re.compile(r"fork:(.+):(\d+):[^:]*", re.ASCII | re.DOTALL)
_STEP_HEX = re.compile(r"(?:[0-9a-f]{2})+", re.ASCII)


def forked_from(key: Any) -> tuple[str, int] | None:
    """The run and call a fork's idempotency key names; None for another key, one that
    only starts like a fork's included (a client's own key: no claim or attempt fails
    on it)."""
    found = _FORK_KEY.fullmatch(key) if isinstance(key, str) else None
    return None if found is None else (found[1], int(found[2]))


def fork_origin(key: Any) -> dict[str, Any] | None:
    """What a fork's first ``run:started`` says of its origin, from its idempotency key:
    ``forked_from`` (the run), ``from_call``, and ``from_step`` (the step's name) when the
    key holds one; None for a key that is no fork's."""
    origin = forked_from(key)
    if origin is None:
        return None
    fields: dict[str, Any] = {"forked_from": origin[0], "from_call": origin[1]}
    _, dot, hexed = str(key).rsplit(":", 1)[1].partition(".")
    if dot and _STEP_HEX.fullmatch(hexed):
        try:
            fields["from_step"] = bytes.fromhex(hexed).decode()
        except UnicodeDecodeError:
            pass  # a client's own key that only looks like a fork's: no step to name
    return fields


def fork_copy(events: Sequence[Event], call: int) -> list[Event]:
    """What the fork reuses of ``events`` (a run's journal): the events of its calls
    before ``call``, and the signals and timer wakes recorded before the fork point's
    first event, in journal order, without their seqs (the fork's store gives new ones)."""
    cut = next((i for i, e in enumerate(events) if int(e.get("call", 0)) >= call), len(events))
    kept = []
    for index, event in enumerate(events):
        recorded = event.get("call")
        if recorded is not None:
            if int(recorded) < call:
                kept.append(event)
        elif index < cut and event.get("type") in _DECIDING:
            kept.append(event)
    return [{k: v for k, v in e.items() if k != "seq"} for e in kept]


def run_forked(now: float, point: ForkPoint, reused: int) -> Event:
    return make_event(EventType.RUN_FORKED, now, from_run=point.run_id, from_step=point.step,
                      from_call=point.call, reused=reused)


class ForkStore(Protocol):
    """What seeding a fork needs of a store."""

    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]: ...

    async def append(self, run_id: str, token: int, events: Sequence[Event], *, now: float,
                     lock_ttl: float) -> AppendResult: ...


def needs_seed(journal: Sequence[Event]) -> tuple[str, int] | None:
    """The run and call a fork whose journal is ``journal`` is to be seeded from; None for
    a run that is no fork, or a fork seeded already."""
    if not journal or journal[0].get("type") != EventType.RUN_SUBMITTED:
        return None
    origin = forked_from(journal[0].get("idempotency_key"))
    if origin is None or any(e.get("type") == EventType.RUN_FORKED for e in journal):
        return None
    return origin


async def seed_fork(store: ForkStore, claimed: ClaimedRun, journal: list[Event], *,
                    now: float, lock_ttl: float) -> list[Event]:
    """``journal`` (a claimed run's, from seq 1), seeded if it is a fork's first: the
    ``run:forked`` and the copy appended under the attempt's token. Raises StaleToken if
    the attempt lost the run, JournalCorrupt if the forked run's journal is gone."""
    origin = needs_seed(journal)
    if origin is None:
        return journal
    source, call = origin
    try:
        recorded = await store.read_events(source)
    except WorkflowNotFound:
        recorded = []
    calls = dict(step_calls(recorded))
    if call not in calls:
        raise JournalCorrupt(claimed.run_id, 1, f"forks run {source} at call {call}, and "
                             "that run's journal no longer holds it")
    point = ForkPoint(source, call, calls[call])
    copy = fork_copy(recorded, call)
    events = [run_forked(now, point, sum(1 for c in calls if c < call)), *copy]
    written = await store.append(claimed.run_id, claimed.token, events, now=now,
                                 lock_ttl=lock_ttl)
    first = written.last_seq - len(events) + 1
    if first != int(journal[-1]["seq"]) + 1:  # others wrote meanwhile (a signal): read all
        return await store.read_events(claimed.run_id)
    return [*journal, *({**e, "seq": first + i} for i, e in enumerate(events))]
