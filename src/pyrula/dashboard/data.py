"""What the dashboard's JSON routes answer, read from the store (no HTTP here).

Store and client calls only (the fleet's supervisor serves these, and must not load the
engine or the worker): the runs list by keyset pages as ``RunRouter`` pages it, a run
with its journal worded by ``pyrula.cli.timeline`` (the reader ``pyrula runs show``
uses) and its family as ``pyrula.workflows.family.children_of`` lists it (``runs show``
too), the stuck runs ``pyrula runs stuck`` lists, the queues, the shard map.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from pyrula.cli.timeline import EntryKind, timeline
from pyrula.timestamps import epoch_of, iso_utc, iso_utc_or_none
from pyrula.workflows.client import WorkflowClient
from pyrula.workflows.family import SHOWN_CHILDREN, children_of
from pyrula.workflows.projections import head_document
from pyrula.workflows.records import RunInfo, RunStatus
from pyrula.workflows.stores.capabilities import capabilities_of
from pyrula.workflows.triage import retries_of, stuck_runs

logger = logging.getLogger(__name__)

#: How long one store read of the dashboard may take before the route says so.
READ_TIMEOUT_S = 5.0
#: Without a fleet naming its workflows, the queues shown are those of the names among
#: this many newest runs.
RECENT_RUNS = 200
STUCK_LIMIT = 100


def run_row(info: RunInfo) -> dict[str, Any]:
    """A run as the table shows it (ISO-8601 UTC times; the page formats them)."""
    return {
        "run_id": info.run_id, "workflow": info.name, "status": info.status.value,
        "owner": info.owner, "priority": info.priority, "attempt": info.attempt,
        "created_at": iso_utc(info.created_at),
        "started_at": iso_utc_or_none(info.started_at),
        "finished_at": iso_utc_or_none(info.finished_at),
        "updated_at": iso_utc(info.updated_at), "waiting_for": list(info.waiting_for),
        "retries": retries_of(info),
    }


def _epoch(text: str | None) -> float | None:
    return None if text is None else epoch_of(text)


def worker_pid(worker_id: str | None) -> int | None:
    """The pid in a worker id (``<host>-<pid>-<hex>``), None if it has none."""
    parts = (worker_id or "").rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def timeline_entries(events: list[Any]) -> list[dict[str, Any]]:
    """``timeline()``'s entries with what the page draws besides: each entry's ``start``
    and ``end`` (ISO-8601 UTC, whichever fields its kind names them by), each step's
    duration in ``seconds``, each attempt's worker pid."""
    out = []
    for entry in timeline(events):
        item = {key: (value.value if hasattr(value, "value") else value)
                for key, value in entry.items()}
        if entry["kind"] == EntryKind.STEP:
            item["start"], item["end"] = entry["started"], entry["finished"]
            start, end = _epoch(entry["started"]), _epoch(entry["finished"])
            item["seconds"] = (None if start is None or end is None
                               else round(end - start, 6))
        elif entry["kind"] == EntryKind.ATTEMPT:
            item["start"] = entry["at"]
            item["pid"] = worker_pid(entry["worker"])
        elif entry["kind"] in (EntryKind.PATCH, EntryKind.FORKED):
            item["start"] = entry["at"]
        else:
            item["start"], item["end"] = entry["from"], entry["until"]
        out.append(item)
    return out


class DashboardData:
    """The dashboard's reads of one store."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.client = WorkflowClient(store)

    async def _bounded(self, coro: Any) -> Any:
        return await asyncio.wait_for(coro, READ_TIMEOUT_S)

    async def runs(self, *, workflow: str | None, status: RunStatus | None,
                   owner: str | None, limit: int,
                   before: tuple[float, str] | None) -> list[RunInfo]:
        page: list[RunInfo] = await self._bounded(self.store.list_runs(
            name=workflow, status=status, owner=owner, limit=limit, before=before))
        return page

    async def run(self, run_id: str) -> dict[str, Any]:
        """A run, its journal as a timeline, the run it retries, and its family: its
        parent's id and the first ``SHOWN_CHILDREN`` children it started (id, workflow,
        status), with ``more_children`` counting the rest."""
        info = await self._bounded(self.client.get(run_id))
        events = await self._bounded(self.client.events(run_id))
        row = run_row(info)
        row.update(params=info.params, result=info.result, error=info.error,
                   interrupt=info.interrupt, wake_at=iso_utc_or_none(info.wake_at),
                   idempotency_key=info.idempotency_key,
                   events=len(events), timeline=timeline_entries(events))
        kin = await self._bounded(children_of(self.store, events))
        row.update(parent_id=info.parent_id, children=kin[:SHOWN_CHILDREN],
                   more_children=max(0, len(kin) - SHOWN_CHILDREN))
        return row

    async def stuck(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = await self._bounded(
            stuck_runs(self.store, STUCK_LIMIT, time.time()))
        return [{**row, "updated_at": iso_utc_or_none(row["updated_at"])} for row in found]

    async def projections(self) -> list[dict[str, Any]]:
        """Every projection's head (none where the store keeps no projections)."""
        if capabilities_of(self.store).projections is None:
            return []
        return [head_document(h) for h in await self._bounded(self.client.projections())]

    async def projection(self, name: str, key: str | None) -> dict[str, Any] | None:
        """A projection's head and state (``key``'s, for a keyed one), None if unknown."""
        if capabilities_of(self.store).projections is None:
            return None
        head = await self._bounded(self.client.projection_info(name))
        if head is None:
            return None
        state = await self._bounded(self.client.projection(name, key))
        return {**head_document(head), "key": key, "state": state}

    async def recent_names(self) -> list[str]:
        page = await self._bounded(self.store.list_runs(limit=RECENT_RUNS))
        return sorted({info.name for info in page})

    async def queues(self, names: list[str]) -> dict[str, Any]:
        """Depth and oldest queued age per workflow, where the store can tell."""
        source = capabilities_of(self.store).queue_stats
        if source is None:
            return {"supported": False, "queues": []}
        stats = await self._bounded(source.queue_stats(names)) if names else {}
        now = time.time()
        rows = [{"workflow": name, "depth": stat.depth,
                 "oldest_age_s": (None if stat.oldest_at is None
                                  else round(max(0.0, now - stat.oldest_at), 3))}
                for name, stat in sorted(stats.items())]
        return {"supported": True, "queues": rows}

    async def shards(self) -> dict[str, Any]:
        """Every live worker's shards, across hosts; SQLite and memory are not sharded."""
        source = capabilities_of(self.store).shard_map
        if source is None:
            return {"sharded": False, "workers": [], "names": {}}
        found: dict[str, Any] = await self._bounded(source.shard_map(now=time.time()))
        for worker in found["workers"]:
            worker["pid"] = worker_pid(worker["worker_id"])
            worker["expires"] = iso_utc(float(worker["expires"]))
        return {"sharded": True, **found}
