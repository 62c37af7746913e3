"""What a run's end does to its parent and children, through the store's own calls.

A child that ends nudges its parent through the store's ``nudge``, which writes nothing
in the parent's journal (a parent of 10,000 children keeps a journal of a few dozen
events): a parent parked on its children is queued at once; a parent running is marked,
so that its attempt's next park on its children is refused and it looks at them again
(a child that ends between the parent's look and its park is not missed); a parent
queued or parked on something else is left alone, as its next attempt looks anyway.
Journals written before kept one ``pyrula.child`` signal per nudge; they replay as they
did (``Replay.child_signal_seq``).

The nudge is best effort: it comes after the child's end is written, and a worker that
dies in between loses it. A parked parent never depends on it alone: it re-checks its
children's runs on a timer (see ``Operations._await_children``).

A child can also end without an attempt of its own: cancelled by a client while parked or
queued, quarantined by the orphan scan or a fleet after its worker died, failed as
stranded. Whoever ends it so nudges its parent too (``nudge_parents_of``), on the same
best-effort terms.

A run cancelled cancels the children it started with ``on_parent_cancel="cancel"``, after
its own cancel is written (by its attempt, or by the client for a run that was not
running). Also best effort: a process that dies in between leaves those children to run
to their end.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from pyrula.workflows.children import children_to_cancel, started_children
from pyrula.workflows.errors import StoreUnavailable, WorkflowNotFound
from pyrula.workflows.events import Event, EventType, parent_of_key
from pyrula.workflows.records import RunInfo

logger = logging.getLogger(__name__)


class KinStore(Protocol):
    async def nudge(self, run_id: str, *, now: float) -> None: ...

    async def cancel(self, run_id: str, *, now: float) -> bool: ...

    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]: ...

    async def get_run(self, run_id: str) -> RunInfo | None: ...


#: The most children a run's family looks up one by one (``pyrula runs show``, the
#: dashboard's run page); the rest are listed without their status, or counted.
SHOWN_CHILDREN = 50


class RunReader(Protocol):
    async def get_run(self, run_id: str) -> RunInfo | None: ...


async def children_of(store: RunReader, journal: Iterable[Event],
                      shown: int = SHOWN_CHILDREN) -> list[dict[str, Any]]:
    """The children ``journal`` records starting, in the order they were started: each
    one's ``run_id``, workflow ``name`` and ``status`` (looked up for the first ``shown``,
    None past them; ``"missing"`` for one the store no longer holds)."""
    found: list[dict[str, Any]] = []
    for n, (child_id, name, _) in enumerate(started_children(journal)):
        status = None
        if n < shown:
            info = await store.get_run(child_id)
            status = "missing" if info is None else info.status.value
        found.append({"run_id": child_id, "name": name, "status": status})
    return found


def parent_of(journal: Sequence[Event]) -> str | None:
    """The parent of the run whose journal this is (from its ``run:submitted``)."""
    if not journal or journal[0].get("type") != EventType.RUN_SUBMITTED:
        return None
    return parent_of_key(journal[0].get("idempotency_key"))


async def nudge_parent(store: KinStore, run_id: str, journal: Sequence[Event], *,
                       now: float) -> None:
    """Tell the parent of ``run_id`` (if it has one) that the run has ended."""
    await _nudge(store, run_id, parent_of(journal), now=now)


async def nudge_parents_of(store: KinStore, run_ids: Iterable[str], *, now: float) -> None:
    """Nudge the parents of runs ended by someone other than their own attempt (a client's
    cancel of a parked run, a quarantine, a stranded failure). Never raises: the runs have
    ended whatever this does."""
    for run_id in run_ids:
        try:
            info = await store.get_run(run_id)
            if info is not None and info.status.terminal:
                await _nudge(store, run_id, info.parent_id, now=now)
        except Exception:
            logger.warning("run %s ended; telling its parent failed", run_id, exc_info=True)


async def _nudge(store: KinStore, run_id: str, parent: str | None, *, now: float) -> None:
    if parent is None:
        return
    try:
        # One atomic call whatever the parent's state (see ``RunControl.nudge``): nothing
        # in its journal, so 10,000 children cost it no event.
        await store.nudge(parent, now=now)
    except (StoreUnavailable, OSError) as exc:
        logger.warning("run %s ended but its parent %s was not told (%s); the parent "
                       "finds out at its next re-check", run_id, parent, exc)


async def cancel_children(store: KinStore, journal: Iterable[Event], *, now: float,
                          depth: int = 0) -> list[str]:
    """Cancel the live children the ``journal`` started (``on_parent_cancel="cancel"``),
    and theirs in turn; the ids of those cancelled."""
    cancelled: list[str] = []
    for child_id in children_to_cancel(journal):
        try:
            if not await store.cancel(child_id, now=now):
                continue  # ended already
        except WorkflowNotFound:
            continue
        cancelled.append(child_id)
        if depth < 32:  # a parked child ended at once: its attempt will not cascade
            events = await store.read_events(child_id)
            cancelled += await cancel_children(store, events, now=now, depth=depth + 1)
    return cancelled
