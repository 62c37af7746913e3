"""Reads of runs: a record, a journal, a page of runs, a wait for a run's end, the queues'
depth and age; and what an ArchivingStore reads of ended runs (their index by finish
time, records with journals) and asks of them (let their live copies expire)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from pyrula.errors import WorkflowNotFound
from pyrula.workflows.events import Event
from pyrula.workflows.records import RunInfo, RunOutcome, RunStatus
from pyrula.workflows.stores.capabilities import QueueStat
from pyrula.workflows.stores.valkey.codec import (
    OUTCOME_FIELDS,
    as_hash,
    as_scored,
    events,
    implied_of,
    raise_first,
    run_info,
    run_outcome,
)
from pyrula.workflows.stores.valkey.connection import Connection
from pyrula.workflows.stores.valkey.keys import ENDED_OFFSET
from pyrula.workflows.stores.valkey.registry import Registry
from pyrula.workflows.stores.valkey.resp import Command

logger = logging.getLogger(__name__)


class Reads:
    """What callers read of runs."""

    def __init__(self, connection: Connection, registry: Registry) -> None:
        self.connection = connection
        self.registry = registry

    def _unknown(self, run_id: str) -> bool:
        return self.connection.keys.base_of_run(run_id) is None

    async def get_run(self, run_id: str) -> RunInfo | None:
        return await self._read(run_id, _WHOLE)

    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        if self._unknown(run_id):
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        conn = self.connection
        journal, run = conn.keys.journal(run_id), conn.keys.run(run_id)
        if after_seq >= 2:
            raw = await conn.read(journal, "LRANGE", journal, after_seq, -1)
            if not raw and not await conn.read(run, "EXISTS", run):
                raise WorkflowNotFound(f"no run with id {run_id!r}")
            return events(run_id, raw, after_seq + 1)
        # From the start: the record too, for run:submitted and the first run:started (one
        # round trip). A read after seq 1 comes this way as well: seq 2 may be only in the
        # record (its journal entry a placeholder, or no journal list yet).
        record, raw = await conn.pipeline(
            [(run, ("HGETALL", run)), (journal, ("LRANGE", journal, 0, -1))], idempotent=True)
        raise_first((record, raw))
        fields = as_hash(record)
        if not fields:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        if not raw:  # nothing written yet: what the record implies
            raw = ["", ""] if fields.get("w1") else [""]
        return events(run_id, raw, 1, implied_of(fields))[after_seq:]

    async def list_runs(
        self,
        *,
        name: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunInfo]:
        conn = self.connection
        names = [name] if name is not None else await self.registry.names()
        page: list[RunInfo] = []
        # Scatter: each shard's index newest first, in chunks, until enough rows match.
        top = "+inf" if before is None else before[0]
        bases = [conn.keys.base_of(n, s) for n in names for s in range(conn.shard_count)]
        chunk = max(limit, 50)
        for base in bases:
            offset = 0
            while True:
                index = f"{base}:index"
                ids = as_scored(await conn.read(
                    index, "ZREVRANGEBYSCORE", index, top, "-inf", "WITHSCORES",
                    "LIMIT", offset, chunk,
                ))
                if not ids:
                    break
                offset += len(ids)
                matched = 0
                for run_id, created in ids:
                    if before is not None and (created, run_id) >= before:
                        continue
                    info = await self.get_run(run_id)
                    if info is None:
                        continue
                    if status is not None and info.status != status:
                        continue
                    if owner is not None and (info.owner or "") != owner:
                        continue
                    page.append(info)
                    matched += 1
                if len(ids) < chunk or matched >= limit:
                    break
        page.sort(key=lambda i: (i.created_at, i.run_id), reverse=True)
        return page[:limit]

    async def wait_result(self, run_id: str, timeout: float | None) -> RunInfo:
        return await self._wait(run_id, timeout, _WHOLE)

    async def wait_outcome(self, run_id: str, timeout: float | None) -> RunOutcome:
        """``wait_result`` reading only the four fields of the record that say how the
        run ended, not its twenty-odd."""
        return await self._wait(run_id, timeout, _OUTCOME)

    async def read_outcomes(self, run_ids: Sequence[str]) -> list[RunOutcome | None]:
        """The outcomes of ``run_ids`` as they stand, in one round trip (grouped by node on
        a cluster), without waiting: None for a run not known here."""
        keys = self.connection.keys
        asked = [(i, f"{base}:run:{run_id}") for i, run_id in enumerate(run_ids)
                 if (base := keys.base_of_run(run_id)) is not None]
        replies = await self.connection.pipeline(
            [(key, _OUTCOME.command(key)) for _, key in asked], idempotent=True)
        raise_first(replies)
        outcomes: list[RunOutcome | None] = [None] * len(run_ids)
        for (i, _), reply in zip(asked, replies, strict=True):
            outcomes[i] = _OUTCOME.read(run_ids[i], reply)
        return outcomes

    async def _wait(self, run_id: str, timeout: float | None, shape: _Shape[R]) -> R:
        conn = self.connection
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            base = conn.keys.base_of_run(run_id)
            if base is None:
                raise WorkflowNotFound(f"no run with id {run_id!r}")
            # One round trip: the run's end if it has ended, else the run marked as waited
            # on (its finish then leaves a token to wake us).
            marked = await conn.op(base, "await", run_id, *shape.fields)
            if isinstance(marked, list):  # it has ended: the reply is its record
                ended = shape.read(run_id, marked)
                assert ended is not None  # the script read it in the same call
                return ended
            if marked == "NOTFOUND":
                # An earlier run of a continue_as_new chain may have expired while the chain
                # goes on: its start id's tail record names the chain's latest run.
                chain = f"{base}:chain:{run_id}"
                tail = await conn.read(chain, "GET", chain)
                if tail is None or tail == run_id:
                    raise WorkflowNotFound(f"no run with id {run_id!r}")
                run_id = str(tail)
                continue
            read = await self._wake(run_id, deadline, timeout, shape)
            if read is not None:
                return read

    async def _wake(self, run_id: str, deadline: float | None, timeout: float | None,
                    shape: _Shape[R]) -> R | None:
        """Wait for a marked run's end; None when its record has gone meanwhile."""
        conn = self.connection
        done_key, run_key = conn.keys.done(run_id), conn.keys.run(run_id)
        while True:
            wait = 5.0
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    raise TimeoutError(f"run {run_id} did not end within {timeout} s")
            # Woken by the store, no polling: a blocking rotation of the run's "done" list,
            # which leaves its token (and its TTL) for other waiters, and the record read
            # right behind it on the same connection.
            wait = max(wait, 0.01)
            moved, fields = await conn.blocking(done_key, [
                ("BLMOVE", done_key, done_key, "LEFT", "RIGHT", wait), shape.command(run_key),
            ], wait)
            raise_first((moved, fields))
            read = shape.read(run_id, fields)
            if read is None or read.status.terminal:
                return read

    async def _read(self, run_id: str, shape: _Shape[R]) -> R | None:
        base = self.connection.keys.base_of_run(run_id)
        if base is None:
            return None
        key = f"{base}:run:{run_id}"
        return shape.read(run_id, await self.connection.read(key, *shape.command(key)))

    async def queue_stats(self, names: Sequence[str]) -> dict[str, QueueStat]:
        """Every shard of every name read at once, one round trip per server node: each
        shard's ``queue_stats`` counts its owners' FIFOs and reads their heads' records.
        ``oldest_at`` is the earliest head: exact while the writers' clocks agree (a run
        queued behind another under a clock running behind is not looked at)."""
        conn = self.connection
        wanted = list(dict.fromkeys(names))
        calls = [(conn.keys.base_of(name, shard), ("queue_stats",))
                 for name in wanted for shard in range(conn.shard_count)]
        replies = await conn.batch(calls, idempotent=True)
        raise_first(replies)
        stats: dict[str, QueueStat] = {}
        for i, name in enumerate(wanted):
            shards = replies[i * conn.shard_count:(i + 1) * conn.shard_count]
            depth = sum(int(count) for count, _ in shards)
            times = [float(at) for _, at in shards if at]
            stats[name] = QueueStat(depth, min(times) if depth and times else None)
        return stats

    # --- archiving (ArchivingStore) --------------------------------------------------

    async def ended_runs(
        self, *, after: tuple[float, str] | None, until: float, limit: int,
        names: Sequence[str] | None = None,
    ) -> list[tuple[float, str]]:
        """(finished_at, run_id) of ended runs (of the workflows ``names``; None: of every
        one) after the cursor ``after`` and at or before ``until``, oldest first, at most
        ``limit``: read from each shard's ``times``, which holds ended runs (scored by
        their finish time - ENDED_OFFSET) for ``completed_ttl``."""
        conn = self.connection
        wanted = await self.registry.names() if names is None else names
        keys = [f"{conn.keys.base_of(n, s)}:times"
                for n in wanted for s in range(conn.shard_count)]
        low: Any = "-inf" if after is None else after[0] - ENDED_OFFSET
        if limit <= 0 or not keys:
            return []
        found: list[tuple[float, str]] = []
        pending = [(key, 0, 0) for key in keys]
        while pending:
            pages = await conn.pipeline([
                (key, ("ZRANGEBYSCORE", key, low, until - ENDED_OFFSET, "WITHSCORES",
                       "LIMIT", offset, limit))
                for key, offset, _ in pending
            ], idempotent=True)
            again = []
            for (key, offset, taken), reply in zip(pending, pages, strict=True):
                if isinstance(reply, BaseException):
                    raise reply
                page = [(member, score + ENDED_OFFSET) for member, score in as_scored(reply)]
                fresh = [(float(ended), str(member)) for member, ended in page
                         if after is None or (float(ended), str(member)) > after]
                found.extend(fresh)
                # A full page partly at or before the cursor (ties on its score): read on,
                # so that each shard gives its first ``limit`` runs after the cursor (with
                # fewer, a later shard's run could pass before one this shard left unread).
                if len(page) >= limit and taken + len(fresh) < limit:
                    again.append((key, offset + len(page), taken + len(fresh)))
            pending = again
        found.sort()
        return found[:limit]

    async def expire_finished(self, run_ids: Sequence[str], ttl: float) -> None:
        """Let these ended runs' live copies (record, journal, done list) expire within
        ``ttl`` seconds; a run still in flight, one with a shorter TTL, and one that
        continued as new (a chain's earlier runs keep ``completed_ttl``) are left alone."""
        by_shard: dict[str, list[str]] = {}
        for run_id in run_ids:
            base = self.connection.keys.base_of_run(run_id)
            if base is not None:
                by_shard.setdefault(base, []).append(run_id)
        seconds = max(0, int(ttl))
        raise_first(await self.connection.batch(
            [(base, ("expire_finished", seconds, *ids)) for base, ids in by_shard.items()]
        ))

    async def read_finished(
        self, run_ids: Sequence[str]
    ) -> dict[str, tuple[RunInfo, list[Event]]]:
        """Each ended run's record and whole journal, in one round trip; runs that are gone
        or have not ended are left out."""
        conn = self.connection
        wanted = [r for r in run_ids if conn.keys.base_of_run(r) is not None]
        commands: list[tuple[str | None, Command]] = []
        for run_id in wanted:
            run, journal = conn.keys.run(run_id), conn.keys.journal(run_id)
            commands.append((run, ("HGETALL", run)))
            commands.append((journal, ("LRANGE", journal, 0, -1)))
        replies = await conn.pipeline(commands, idempotent=True)
        raise_first(replies)
        out: dict[str, tuple[RunInfo, list[Event]]] = {}
        for i, run_id in enumerate(wanted):
            fields, raw = as_hash(replies[2 * i]), replies[2 * i + 1]
            if not fields:
                continue
            info = run_info(run_id, fields)
            if info.status.terminal:
                out[run_id] = (info, events(run_id, raw or [""], 1, implied_of(fields)))
        return out


class _Ended(Protocol):
    @property
    def status(self) -> RunStatus: ...


R = TypeVar("R", bound=_Ended, covariant=True)


class _Shape(Protocol[R]):
    """What a wait reads of a run's record, and how it reads the reply."""

    #: The fields the ``await`` operation returns of an ended run (none: all of them).
    fields: tuple[str, ...]

    def command(self, key: str) -> Command: ...

    def read(self, run_id: str, reply: Any) -> R | None:
        """None: there is no such record."""
        ...


class _Whole:
    """The whole record, as a RunInfo."""

    fields: tuple[str, ...] = ()

    @staticmethod
    def command(key: str) -> Command:
        return ("HGETALL", key)

    @staticmethod
    def read(run_id: str, reply: Any) -> RunInfo | None:
        record = as_hash(reply)
        return run_info(run_id, record) if record else None


class _Outcome:
    """The fields that say how the run ended, as a RunOutcome."""

    fields: tuple[str, ...] = OUTCOME_FIELDS

    @staticmethod
    def command(key: str) -> Command:
        return ("HMGET", key, *OUTCOME_FIELDS)

    @staticmethod
    def read(run_id: str, reply: Any) -> RunOutcome | None:
        return run_outcome(reply)


_WHOLE: _Shape[RunInfo] = _Whole()
_OUTCOME: _Shape[RunOutcome] = _Outcome()
