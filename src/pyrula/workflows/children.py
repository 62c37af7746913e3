"""Child workflows: what a parent's journal records of its children, and how a child's
end reads in the parent.

A parent records only which children it started (``child:started``: their run ids) and,
for a fan-out, which of them it saw end (``child:ended``: their indices). A child's result
is never copied into the parent's journal: the parent reads it from the child's run in
the store each time its code reaches the wait, so a replay reads it again. A child's run
never changes once it has ended, so every replay reads the same result.

Pure: events and run records in, decisions and events out.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pyrula.workflows.errors import ChildFailed
from pyrula.workflows.events import Event, EventType, make_event
from pyrula.workflows.records import RunInfo, RunStatus

if TYPE_CHECKING:
    from pyrula.workflows.context import AttemptOperations

#: The operation names of the two child calls (replay's name check reads them).
START_CHILD_OP = "pyrula.start_child"
GATHER_CHILDREN_OP = "pyrula.gather_children"

OnParentCancel = Literal["cancel", "abandon"]
ON_PARENT_CANCEL: tuple[str, ...] = ("cancel", "abandon")

#: How many ``continue_as_new`` successors a child's result is followed through.
MAX_SUCCESSOR_HOPS = 1000


class ChildHandle:
    """A child workflow started by ``ctx.start_child``: its ``run_id`` and workflow
    ``name``. ``await handle`` waits for the child to end and returns its result (raises
    :class:`~pyrula.workflows.ChildFailed` if it failed or was cancelled); the parent
    parks meanwhile, holding no worker slot. Awaiting twice reads the result twice."""

    __slots__ = ("_ops", "_started_at", "name", "run_id")

    def __init__(self, ops: AttemptOperations, run_id: str, name: str,
                 started_at: float) -> None:
        self._ops = ops
        self._started_at = started_at
        self.run_id = run_id
        self.name = name

    async def result(self) -> Any:
        """The child's result, once it has ended (the same as ``await handle``)."""
        return await self._ops.op_child_result(self.run_id, self.name, self._started_at)

    def __await__(self) -> Generator[Any, None, Any]:
        return self.result().__await__()

    def __repr__(self) -> str:
        return f"ChildHandle(name={self.name!r}, run_id={self.run_id!r})"


def check_on_parent_cancel(value: Any) -> OnParentCancel:
    if value not in ON_PARENT_CANCEL:
        raise ValueError(f"on_parent_cancel must be 'cancel' or 'abandon', got {value!r}")
    return "cancel" if value == "cancel" else "abandon"


# --- the events ---------------------------------------------------------------------------


def child_started(now: float, call: int, name: str, child_id: str,
                  on_parent_cancel: str) -> Event:
    """``ctx.start_child`` at ``call`` started ``child_id`` (workflow ``name``)."""
    return make_event(EventType.CHILD_STARTED, now, op=START_CHILD_OP, call=call,
                      child=child_id, name=name, on_parent_cancel=on_parent_cancel)


def children_started(now: float, call: int, started: Sequence[tuple[int, str, str]],
                     on_parent_cancel: str) -> Event:
    """``ctx.gather_children`` at ``call`` started these (index, run id, name)."""
    return make_event(EventType.CHILD_STARTED, now, op=GATHER_CHILDREN_OP, call=call,
                      children=[list(item) for item in started],
                      on_parent_cancel=on_parent_cancel)


def children_ended(now: float, call: int, indices: Iterable[int]) -> Event:
    """``ctx.gather_children`` at ``call`` saw the children at ``indices`` end."""
    return make_event(EventType.CHILD_ENDED, now, op=GATHER_CHILDREN_OP, call=call,
                      indices=sorted(indices))


def started_children(journal: Iterable[Event]) -> list[tuple[str, str, str]]:
    """Every child a journal records starting: (run id, workflow name, on_parent_cancel),
    in the order they were started."""
    found: list[tuple[str, str, str]] = []
    for event in journal:
        if event.get("type") != EventType.CHILD_STARTED:
            continue
        policy = str(event.get("on_parent_cancel") or "cancel")
        if "child" in event:
            found.append((str(event["child"]), str(event.get("name")), policy))
        for item in event.get("children") or ():
            found.append((str(item[1]), str(item[2]), policy))
    return found


def children_to_cancel(journal: Iterable[Event]) -> list[str]:
    """The children a cancel of this run cancels too (``on_parent_cancel="cancel"``)."""
    return [run_id for run_id, _, policy in started_children(journal) if policy == "cancel"]


# --- a fan-out's progress --------------------------------------------------------------------


@dataclass(slots=True)
class FanOut:
    """What ``gather_children`` knows of its ``total`` children: those started (index ->
    run id; always the first ones, in order) and those seen ended."""

    total: int
    started: dict[int, str] = field(default_factory=dict)
    ended: set[int] = field(default_factory=set)
    began: float | None = None

    @classmethod
    def from_journal(cls, total: int, events: Iterable[Event]) -> FanOut:
        fan = cls(total)
        for event in events:
            if event["type"] == EventType.CHILD_STARTED:
                fan.began = float(event["ts"]) if fan.began is None else fan.began
                for index, run_id, _ in event.get("children") or ():
                    fan.started[int(index)] = str(run_id)
            elif event["type"] == EventType.CHILD_ENDED:
                fan.ended.update(int(i) for i in event.get("indices") or ())
        return fan

    def live(self) -> list[int]:
        """Started children not yet seen ended, in order."""
        return [i for i in sorted(self.started) if i not in self.ended]

    def to_start(self, limit: int) -> range:
        """The indices to start next, keeping at most ``limit`` live."""
        first = len(self.started)
        room = max(0, limit - len(self.live()))
        return range(first, min(self.total, first + room))

    @property
    def done(self) -> bool:
        return len(self.ended) >= self.total


# --- a child's end, read in the parent ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """``ended`` False: the child still runs. Else its ``result``, or the ``failure`` the
    parent raises."""

    ended: bool
    result: Any = None
    failure: ChildFailed | None = None

    def value(self) -> Any:
        if self.failure is not None:
            raise self.failure
        return self.result


RUNNING = ChildOutcome(False)


def outcome_of(run_id: str, name: str, info: RunInfo | None) -> ChildOutcome:
    """How child ``run_id`` stands, from its run (the last of its ``continue_as_new``
    chain). A run the store no longer holds is a failure: its result is gone."""
    if info is None:
        return ChildOutcome(True, failure=ChildFailed(
            run_id, name, "missing", "WorkflowNotFound",
            "the store holds no such run (deleted, or expired by retention)",
        ))
    if not info.status.terminal or info.status is RunStatus.CONTINUED:
        return RUNNING
    if info.status is RunStatus.COMPLETED:
        return ChildOutcome(True, result=info.result)
    error = info.error or {}
    if info.status is RunStatus.CANCELLED:
        kind, message = "RunCancelled", "the child run was cancelled"
    else:
        kind, message = "RunFailed", "the child run failed"
    return ChildOutcome(True, failure=ChildFailed(
        run_id, name, info.status.value, str(error.get("error_type") or kind),
        str(error.get("message") or message), error.get("code"),
    ))
