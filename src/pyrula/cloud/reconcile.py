"""Critical events a killed process never sent, found again in its store.

A worker killed with SIGKILL loses what its connector still held in memory, spool or
not. Its runs' journals are still in the store, so the connectors of one environment
keep there, per workflow, a cursor: the (finished_at, run_id) of the last ended run
whose critical events reached the collector.

Every ``reconcile_s``, a connector that finds a cursor not moved for that long reads
the runs that ended after it (and at least ``GRACE_S`` ago, so runs whose live reports
are still on their way are left to them), reads their journals, and hands their
critical events to the connector to send (ids ``<run_id>:<seq>``: what was delivered
live is applied once). Only once they are delivered does it move the cursor, with a
compare-and-set on the cursor's version: a connector that dies first leaves the cursor
where it was and the next pass sends the batch again; two connectors racing send it
twice, which the collector applies once.

The cursors are kept as projection heads whose names begin with ``INTERNAL_MARK``, a
control character no projection name may hold, so listings of projections skip them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pyrula.cloud.wire import is_critical, shaped
from pyrula.workflows.projections import INTERNAL_MARK
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import ProjectionHead, Projections

#: Runs that ended less than this long ago are left to their live reports.
GRACE_S = 5.0
#: The most runs one pass reads per workflow; a full batch goes again at once.
BATCH = 200

#: Sends the reports given; True once the collector took them all.
Deliver = Callable[[list[dict[str, Any]]], Awaitable[bool]]


def cursor_name(environment: str, workflow: str) -> str:
    return f"{INTERNAL_MARK}cloud/{environment}/{workflow}"


@dataclass(frozen=True, slots=True)
class Pass:
    """One pass over one workflow: ``outcome`` is ``started`` (the cursor was set),
    ``fresh`` (another connector moved it lately), ``idle`` (nothing ended since),
    ``sent`` (``runs`` ended runs delivered and the cursor moved), ``undelivered``
    (the collector did not take them) or ``lost`` (another connector moved it first)."""

    outcome: str
    runs: int = 0
    more: bool = False


class Reconciler:
    """The cursors of ``environment`` in ``store`` (a store that keeps projections)."""

    def __init__(self, store: Store, projections: Projections, environment: str,
                 every_s: float) -> None:
        self._store = store
        self._heads = projections
        self._environment = environment
        self.every_s = every_s

    async def reconcile(self, workflow: str, deliver: Deliver, *, now: float,
                        going_on: bool = False) -> Pass:
        """One pass over ``workflow``'s ended runs (see the module's docstring);
        ``going_on``: the last pass was this connector's and filled a batch."""
        name = cursor_name(self._environment, workflow)
        head = await self._heads.projection_head(name)
        if head is None or head.checkpoint is None:
            # The environment's first connector here: runs that ended before it are not
            # reported (they were never meant to be), the ones after it all are.
            started = ProjectionHead(name, 1 if head is None else head.version + 1, "",
                                     False, (now - GRACE_S, ""), 0, now)
            saved = await self._heads.save_projection(
                started, {}, expected=0 if head is None else head.version, reset=False)
            return Pass("started" if saved else "lost")
        if not going_on and now - head.updated_at < self.every_s:
            return Pass("fresh")
        runs = await self._heads.ended_infos([workflow], after=head.checkpoint,
                                             until=now - GRACE_S, limit=BATCH)
        reports = [report for run in runs for report in await self._critical(run.run_id,
                                                                             workflow)]
        if reports and not await deliver(reports):
            return Pass("undelivered")
        checkpoint = ((float(runs[-1].finished_at or 0.0), runs[-1].run_id) if runs
                      else head.checkpoint)
        moved = ProjectionHead(name, head.version + 1, "", False, checkpoint,
                               head.folded + len(runs), now)
        if not await self._heads.save_projection(moved, {}, expected=head.version,
                                                 reset=False):
            return Pass("lost")
        return Pass("sent" if runs else "idle", len(runs), len(runs) >= BATCH)

    async def _critical(self, run_id: str, workflow: str) -> list[dict[str, Any]]:
        reports = []
        for event in await self._store.read_events(run_id):
            report = shaped(run_id, workflow, event)
            if report is not None and is_critical(report):
                reports.append(report)
        return reports
