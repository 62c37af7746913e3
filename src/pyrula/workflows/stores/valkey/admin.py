"""The Valkey store's administration: worker membership (stranded runs), flow control,
schedules, and what an ArchivingStore reads of ended runs."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import orjson

from pyrula.workflows._sync import drive
from pyrula.workflows.events import Event
from pyrula.workflows.records import (
    ClaimedRun,
    FlowControl,
    RunInfo,
)
from pyrula.workflows.schedules.schedule import Schedule
from pyrula.workflows.stores.common import (
    NO_OWNER,
    schedule_from_store,
    schedule_to_store,
    validate_flow_control,
)
from pyrula.workflows.stores.valkey.connection import (
    ValkeyConnection,
    _dumps,
    _events,
    _seconds,
    as_hash,
    as_scored,
    implied_of,
)
from pyrula.workflows.stores.valkey.keys import ENDED_OFFSET

logger = logging.getLogger(__name__)



class ValkeyAdmin(ValkeyConnection):

    # --- archiving (ArchivingStore) --------------------------------------------------

    async def ended_runs(
        self, *, after: tuple[float, str] | None, until: float, limit: int
    ) -> list[tuple[float, str]]:
        """(finished_at, run_id) of ended runs after the cursor ``after`` and at or before
        ``until``, oldest first, at most ``limit``: read from each shard's ``times``, which
        holds ended runs (scored by their finish time - ENDED_OFFSET) for
        ``completed_ttl``."""
        keys = [f"{self.keys.base_of(n, s)}:times"
                for n in await self._names() for s in range(self.shard_count)]
        low: Any = "-inf" if after is None else after[0] - ENDED_OFFSET
        if limit <= 0 or not keys:
            return []
        found: list[tuple[float, str]] = []
        pending = [(key, 0) for key in keys]
        while pending:
            pages = await self._pipeline([
                (key, ("ZRANGEBYSCORE", key, low, until - ENDED_OFFSET, "WITHSCORES",
                       "LIMIT", offset, limit))
                for key, offset in pending
            ], idempotent=True)
            again = []
            for (key, offset), reply in zip(pending, pages, strict=True):
                if isinstance(reply, BaseException):
                    raise reply
                page = [(member, score + ENDED_OFFSET) for member, score in as_scored(reply)]
                fresh = [(float(ended), str(member)) for member, ended in page
                         if after is None or (float(ended), str(member)) > after]
                found.extend(fresh)
                # A full page wholly at or before the cursor (ties on its score): read on.
                if not fresh and len(page) >= limit:
                    again.append((key, offset + len(page)))
            pending = again
        found.sort()
        return found[:limit]

    async def expire_finished(self, run_ids: Sequence[str], ttl: float) -> None:
        """Let these ended runs' live copies (record, journal, done list) expire within
        ``ttl`` seconds; a run still in flight, one with a shorter TTL, and one that
        continued as new (a chain's earlier runs keep ``completed_ttl``) are left alone."""
        by_shard: dict[str, list[str]] = {}
        for run_id in run_ids:
            base = self.keys.base_of_run(run_id)
            if base is not None:
                by_shard.setdefault(base, []).append(run_id)
        seconds = max(0, int(ttl))
        results = await self._batch(
            [(base, ("expire_finished", seconds, *ids)) for base, ids in by_shard.items()]
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def read_finished(
        self, run_ids: Sequence[str]
    ) -> dict[str, tuple[RunInfo, list[Event]]]:
        """Each ended run's record and whole journal, in one round trip; runs that are gone
        or have not ended are left out."""
        wanted = [r for r in run_ids if self.keys.base_of_run(r) is not None]
        commands: list[tuple[str | None, tuple[Any, ...]]] = []
        for run_id in wanted:
            run, journal = self.keys.run(run_id), self.keys.journal(run_id)
            commands.append((run, ("HGETALL", run)))
            commands.append((journal, ("LRANGE", journal, 0, -1)))
        replies = await self._pipeline(commands, idempotent=True)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        out: dict[str, tuple[RunInfo, list[Event]]] = {}
        for i, run_id in enumerate(wanted):
            fields, raw = as_hash(replies[2 * i]), replies[2 * i + 1]
            if not fields:
                continue
            info = self._info(run_id, fields)
            if info.status.terminal:
                out[run_id] = (info, _events(run_id, raw or [""], 1, implied_of(fields)))
        return out

    # --- membership -----------------------------------------------------------------

    async def register_worker(
        self, worker_id: str, names: Sequence[str], *, now: float, ttl: float
    ) -> None:
        key = f"{self.keys.ns}:workers"
        await self._call(key, "HSET", key, worker_id,
                         _dumps({"names": list(names), "expires": now + ttl}))

    async def unregister_worker(self, worker_id: str) -> None:
        key = f"{self.keys.ns}:workers"
        await self._call(key, "HDEL", key, worker_id)

    async def stranded(self, *, now: float) -> list[str]:
        key = f"{self.keys.ns}:workers"
        workers = as_hash(await self._read(key, "HGETALL", key))
        served: set[str] = set()
        gone = []
        for worker_id, raw in workers.items():
            entry = orjson.loads(raw)
            if float(entry["expires"]) > now:
                served.update(entry["names"])
            else:
                gone.append(worker_id)
        if gone:
            await self._call(key, "HDEL", key, *gone)
        found = []
        for name in await self._names():
            ready = self.keys.ready(name)
            if name not in served and await self._read(ready, "ZCARD", ready):
                found.append(name)
        return found

    async def fail_stranded(
        self, name: str, *, older_than: float, now: float, limit: int, error: dict[str, Any]
    ) -> list[str]:
        failed: list[str] = []
        for shard in range(self.shard_count):
            if len(failed) >= limit:
                break
            ids = await self._op(self.keys.base_of(name, shard), "fail_stranded", older_than,
                                 now, limit - len(failed), _dumps(error), self.completed_ttl)
            failed.extend(str(i) for i in ids)
        return failed

    # --- flow control ---------------------------------------------------------------

    async def _flow_config(self) -> dict[str, FlowControl]:
        """Flow-control settings, cached for a second (local changes refresh at once)."""
        stamp, config = self._flow_cache
        if time.monotonic() - stamp < 1.0:
            return config
        fields = as_hash(await self._read(self.keys.meta, "HGETALL", self.keys.meta))
        config = {}
        for field, raw in fields.items():
            if field.startswith("flow:"):
                max_concurrent, rate = orjson.loads(raw)
                config[field[5:]] = FlowControl(field[5:], max_concurrent, rate)
        self._flow_cache = (time.monotonic(), config)
        return config

    async def _flow_reserve(
        self, names: Sequence[str], limit: int, now: float, lock_ttl: float
    ) -> dict[str, tuple[int, str]]:
        """Reserve up to ``limit`` starts for each flow-controlled owner:
        owner -> (reserved, reservation prefix)."""
        config = await self._flow_config()
        if not config:
            return {}
        owners = sorted(config)
        prefixes = {o: f"res:{os.urandom(6).hex()}" for o in owners}
        calls = [
            (self.keys.flow(o), ("flow_acquire", now, limit,
                                 "" if config[o].max_concurrent is None
                                 else config[o].max_concurrent,
                                 "" if config[o].max_starts_per_second is None
                                 else config[o].max_starts_per_second,
                                 prefixes[o], now + lock_ttl))
            for o in owners
        ]
        reserved: dict[str, tuple[int, str]] = {}
        for owner, result in zip(owners, await self._batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            reserved[owner] = (int(result), prefixes[owner])
        return reserved

    async def _flow_settle(
        self, reserved: dict[str, tuple[int, str]], claimed: Sequence[ClaimedRun],
        expiry: float,
    ) -> None:
        if not reserved:
            return
        config = await self._flow_config()
        calls = []
        for owner, (count, prefix) in reserved.items():
            runs = [c.run_id for c in claimed if (c.owner or NO_OWNER) == owner]
            for run_id in runs:
                self._flow_runs[run_id] = owner
            rate = config.get(owner)
            calls.append((self.keys.flow(owner), (
                "flow_settle", prefix, count,
                "" if rate is None or rate.max_starts_per_second is None
                else rate.max_starts_per_second,
                expiry, *runs,
            )))
        await self._batch(calls)

    async def _flow_done(self, run_id: str) -> None:
        owner = self._flow_runs.pop(run_id, None)
        if owner is not None:
            await self._op(self.keys.flow(owner), "flow_done", run_id)

    def flow_control_set(
        self,
        owner: str,
        max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None:
        drive(self.aflow_control_set(owner, max_concurrent, max_starts_per_second))

    def flow_control_get(self, owner: str) -> FlowControl | None:
        return drive(self.aflow_control_get(owner))

    def flow_control_delete(self, owner: str) -> bool:
        return drive(self.aflow_control_delete(owner))

    async def aflow_control_set(
        self,
        owner: str,
        max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None:
        validate_flow_control(owner, max_concurrent, max_starts_per_second)
        meta, bucket = self.keys.meta, f"{self.keys.flow(owner)}:bucket"
        await self._call(meta, "HSET", meta, f"flow:{owner}",
                         _dumps([max_concurrent, max_starts_per_second]))
        await self._call(bucket, "DEL", bucket)
        self._flow_cache = (-1e9, {})

    async def aflow_control_get(self, owner: str) -> FlowControl | None:
        raw = await self._read(self.keys.meta, "HGET", self.keys.meta, f"flow:{owner}")
        if raw is None:
            return None
        max_concurrent, rate = orjson.loads(raw)
        return FlowControl(owner, max_concurrent, rate)

    async def aflow_control_delete(self, owner: str) -> bool:
        self._flow_cache = (-1e9, {})
        return bool(await self._call(self.keys.meta, "HDEL", self.keys.meta, f"flow:{owner}"))

    # --- schedules ------------------------------------------------------------------

    @staticmethod
    def _schedule(row: Sequence[Any]) -> Schedule:
        _, definition, paused, next_run_at, last_run_id, last_run_at = row
        return schedule_from_store(
            definition, paused=paused == "1", next_run_at=float(next_run_at),
            last_run_id=str(last_run_id) or None,
            last_run_at=float(last_run_at) if last_run_at != "" else None,
        )

    def schedule_create(self, schedule: Schedule, *, now: float | None = None) -> Schedule:
        return drive(self.aschedule_create(schedule, now=now))

    def schedule_get(self, schedule_id: str) -> Schedule | None:
        return drive(self.aschedule_get(schedule_id))

    def schedule_list(self) -> list[Schedule]:
        return drive(self.aschedule_list())

    def schedule_delete(self, schedule_id: str) -> bool:
        return drive(self.aschedule_delete(schedule_id))

    async def aschedule_create(
        self, schedule: Schedule, *, now: float | None = None
    ) -> Schedule:
        armed, definition = schedule_to_store(schedule, now)
        row = await self._op(self.keys.schedules, "schedule_put", armed.schedule_id,
                             armed.name, definition, _seconds(armed.next_run_at.timestamp()))
        return self._schedule(row)

    async def aschedule_get(self, schedule_id: str) -> Schedule | None:
        rows = await self._op(self.keys.schedules, "schedule_get", schedule_id)
        return self._schedule(rows[0]) if rows else None

    async def aschedule_list(self) -> list[Schedule]:
        rows = await self._op(self.keys.schedules, "schedule_get")
        return [self._schedule(row) for row in rows]

    async def aschedule_delete(self, schedule_id: str) -> bool:
        return bool(int(await self._op(self.keys.schedules, "schedule_delete", schedule_id)))

    async def schedules_due(
        self, names: Sequence[str], *, now: float, limit: int
    ) -> list[Schedule]:
        if not names or limit <= 0:
            return []
        rows = await self._op(self.keys.schedules, "schedule_due", now, limit, *names)
        due = sorted((self._schedule(row) for row in rows),
                     key=lambda sc: (sc.next_run_at, sc.schedule_id))
        return due[:limit]

    async def schedule_advance(
        self,
        schedule_id: str,
        *,
        expected_next_run_at: float | None,
        next_run_at: float | None,
        run_id: str | None = None,
        run_at: float | None = None,
    ) -> bool:
        moved = await self._op(
            self.keys.schedules, "schedule_advance", schedule_id,
            "" if expected_next_run_at is None else _seconds(expected_next_run_at),
            "" if next_run_at is None else _seconds(next_run_at),
            run_id or "", "" if run_id is None or run_at is None else repr(float(run_at)),
        )
        return bool(int(moved))

    async def schedule_set_paused(
        self, schedule_id: str, paused: bool, *, next_run_at: float | None = None
    ) -> bool:
        found = await self._op(
            self.keys.schedules, "schedule_pause", schedule_id, "1" if paused else "0",
            "" if next_run_at is None else _seconds(next_run_at),
        )
        return bool(int(found))

