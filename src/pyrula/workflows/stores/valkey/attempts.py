"""Attempts: what a worker writes while it runs a claimed run (append, park, finish,
requeue, renew its lock) and the reclaims of attempts whose workers are gone (expired
locks, a dead worker's runs, runs no live attempt holds, a name's pending runs)."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pyrula.errors import ConfigurationError, StoreUnavailable, WorkflowNotFound
from pyrula.workflows.events import INTERRUPT_SIGNAL, Event, stamp_successor
from pyrula.workflows.records import (
    AppendResult,
    FinishResult,
    ParkResult,
    PoisonPolicy,
    RenewResult,
    RequeueOutcome,
    RunStatus,
)
from pyrula.workflows.stores.valkey.codec import dumps, raise_first
from pyrula.workflows.stores.valkey.codec import events as journal_events
from pyrula.workflows.stores.valkey.connection import Call, Connection
from pyrula.workflows.stores.valkey.doorbell import Doorbell
from pyrula.workflows.stores.valkey.flow import Flow
from pyrula.workflows.stores.valkey.leases import Leases
from pyrula.workflows.stores.valkey.reads import Reads
from pyrula.workflows.stores.valkey.registry import Registry

logger = logging.getLogger(__name__)


def shard_of(run_id: str) -> int:
    """The shard a run id names (its name's hash, then its shard, lead the id)."""
    return int(run_id[12:16], 16)


class Attempts:
    """The writes of running attempts and the reclaims of abandoned ones."""

    def __init__(self, connection: Connection, registry: Registry, leases: Leases,
                 doorbell: Doorbell, flow: Flow, reads: Reads) -> None:
        self.connection = connection
        self.registry = registry
        self.leases = leases
        self.doorbell = doorbell
        self.flow = flow
        self.reads = reads

    def base(self, run_id: str) -> str:
        """The shard base of ``run_id``; WorkflowNotFound for an id of no shard."""
        base = self.connection.keys.base_of_run(run_id)
        if base is None:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        return base

    # --- attempt writes -------------------------------------------------------------

    async def append(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float, lock_ttl: float
    ) -> AppendResult:
        result = await self.connection.op(
            self.base(run_id), "append", run_id, token, now, now + lock_ttl,
            *(dumps(e) for e in events),
        )
        return AppendResult(int(result[0]), bool(int(result[1])))

    async def park(
        self,
        run_id: str,
        token: int,
        events: Sequence[Event],
        *,
        now: float,
        wake_at: float | None,
        signals: Sequence[str],
        known_seq: int,
        interrupt: Any = None,
    ) -> ParkResult:
        conn = self.connection
        interrupt_json = dumps(interrupt) if INTERRUPT_SIGNAL in signals else ""
        base = self.base(run_id)
        summary = conn.keys.wake_of_hash(run_id[:12])
        clustered = await conn.clustered()
        result = await conn.op(
            base if clustered or wake_at is None else (base, summary), "park", run_id, token,
            now, "" if wake_at is None else wake_at, known_seq, interrupt_json, len(signals),
            *signals, *(dumps(e) for e in events),
        )
        parked, last, cancel, tail = int(result[0]), int(result[1]), int(result[2]), result[3]
        if parked:
            if clustered and wake_at is not None:
                # The summary lives in another slot: recorded after the timer itself, so
                # a scan that finds it finds the timer too.
                await conn.call(summary, "ZADD", summary, "LT", wake_at, shard_of(run_id))
            await self.flow.done(run_id)
            return ParkResult(True, last)
        return ParkResult(False, last, journal_events(run_id, tail, known_seq + 1), bool(cancel))

    async def finish(
        self,
        run_id: str,
        token: int,
        events: Sequence[Event],
        *,
        now: float,
        status: RunStatus,
        result: Any = None,
        error: dict[str, Any] | None = None,
        successor_params: Any = None,
    ) -> FinishResult:
        conn = self.connection
        if not isinstance(status, RunStatus):
            status = RunStatus(status)
        batch: Sequence[Event] = events
        successor_id = ""
        name = None
        if status is RunStatus.CONTINUED:
            info = await self.reads.get_run(run_id)
            if info is None:
                raise WorkflowNotFound(f"no run with id {run_id!r}")
            name = info.name
            successor_id = conn.keys.new_run_id(info.name, shard_of(run_id), now)
            stamped = [dict(e) for e in events]  # the caller's events stay as they are
            stamp_successor(stamped, successor_id)
            batch = stamped
        last, ring = await conn.op(
            self.base(run_id), "finish", run_id, token, now, status.value, dumps(result),
            "" if error is None else dumps(error), conn.completed_ttl, successor_id,
            dumps(successor_params) if successor_id else "",
            *(dumps(e) for e in batch),
        )
        await self.flow.done(run_id)
        if int(ring) and name is not None:
            await self.doorbell.ring(name, [shard_of(run_id)], now)
        return FinishResult(int(last), successor_id or None)

    async def requeue(
        self,
        run_id: str,
        token: int,
        *,
        now: float,
        reason: str,
        events: Sequence[Event] = (),
        crash: bool = False,
        poison: PoisonPolicy | None = None,
        crash_detail: Mapping[str, Any] | None = None,
    ) -> RequeueOutcome:
        policy = poison or PoisonPolicy()
        quarantined = await self.connection.op(
            self.base(run_id), "requeue", run_id, token, now, reason, 1 if crash else 0,
            policy.max_retries, policy.retry_ttl_s, dumps(dict(crash_detail or {})),
            self.connection.completed_ttl, *(dumps(e) for e in events),
        )
        await self.flow.done(run_id)
        if not int(quarantined):
            await self.doorbell.ring_run(run_id, now)
        return RequeueOutcome(run_id, bool(int(quarantined)))

    async def renew(
        self, worker_id: str, held: Mapping[str, int], *, now: float, lock_ttl: float
    ) -> RenewResult:
        keys = self.connection.keys
        by_shard: dict[str, list[Any]] = {}
        for run_id, token in held.items():
            base = keys.base_of_run(run_id)
            if base is not None:
                by_shard.setdefault(base, []).extend([run_id, token])
        calls: list[Call] = [(base, ("renew", now, now + lock_ttl, *args))
                             for base, args in by_shard.items()]
        lost: set[str] = {r for r in held if keys.base_of_run(r) is None}
        cancel: set[str] = set()
        calls += self.flow.renew_calls(held, now + lock_ttl)
        for result in await self.connection.batch(calls):
            if isinstance(result, BaseException):
                if isinstance(result, StoreUnavailable | ConfigurationError):
                    raise result
                continue
            if isinstance(result, list):
                lost.update(str(r) for r in result[0])
                cancel.update(str(r) for r in result[1])
        self.flow.forget(lost)
        return RenewResult(frozenset(lost), frozenset(cancel))

    # --- reclaims -------------------------------------------------------------------

    async def _expired_locks(self, names: Sequence[str], now: float,
                             limit: int) -> list[tuple[str, int, int]]:
        """(name, shard, how many to take) for shards with runs whose lock expired by
        ``now``, allotted in shard order so the total stays within ``limit``."""
        keys = self.connection.keys
        shards = [(n, s) for n in names for s in self.leases.shards_to_scan(n)]
        times = [f"{keys.base_of(n, s)}:times" for n, s in shards]
        counts = await self.connection.pipeline([(k, ("ZCOUNT", k, 0, now)) for k in times],
                                                idempotent=True)
        raise_first(counts)
        plan: list[tuple[str, int, int]] = []
        left = limit
        for (name, shard), count in zip(shards, counts, strict=True):
            if left <= 0:
                break
            if int(count):
                take = min(int(count), left)
                plan.append((name, shard, take))
                left -= take
        return plan

    async def _requeued(self, targets: Sequence[tuple[str, int]], calls: Sequence[Call],
                        now: float) -> list[RequeueOutcome]:
        """Run reclaim ``calls`` (one per target shard, each answering (run id, quarantined)
        pairs); ring the shards of the runs requeued."""
        outcomes: list[RequeueOutcome] = []
        rung: dict[str, list[int]] = {}
        for (name, shard), result in zip(targets, await self.connection.batch(calls),
                                         strict=True):
            if isinstance(result, BaseException):
                raise result
            for run_id, quarantined in result:
                outcomes.append(RequeueOutcome(str(run_id), bool(int(quarantined))))
                if not int(quarantined):
                    rung.setdefault(name, []).append(shard)
        await self.doorbell.ring_rung(rung, now)
        return outcomes

    async def reclaim(
        self,
        names: Sequence[str] | None,
        *,
        now: float,
        limit: int,
        poison: PoisonPolicy,
    ) -> list[RequeueOutcome]:
        conn = self.connection
        chosen = await self.registry.names() if names is None else list(names)
        plan = await self._expired_locks(chosen, now, limit)
        calls: list[Call] = [
            (conn.keys.base_of(n, s), ("reclaim", now, take, poison.max_retries,
                                      poison.retry_ttl_s, conn.completed_ttl))
            for n, s, take in plan
        ]
        outcomes = await self._requeued([(n, s) for n, s, _ in plan], calls, now)
        await self.doorbell.sweep(chosen, now)  # the orphan scan's pace suits the safety net
        return outcomes

    async def reclaim_worker(
        self,
        worker_id: str,
        *,
        now: float,
        poison: PoisonPolicy,
        crash_detail: Mapping[str, Any] | None = None,
        charge: Collection[str] | None = None,
    ) -> list[RequeueOutcome]:
        conn = self.connection
        targets = [(n, s) for n in await self.registry.names() for s in range(conn.shard_count)]
        detail = dumps(dict(crash_detail or {}))
        # Each shard's script is told the runs of that shard to charge (a run id names its
        # shard), or to charge every run it finds.
        listed: dict[str, list[str]] = {}
        for run_id in charge or ():
            base = conn.keys.base_of_run(run_id)
            if base is not None:
                listed.setdefault(base, []).append(run_id)
        calls: list[Call] = []
        for n, s in targets:
            base = conn.keys.base_of(n, s)
            which = ("all",) if charge is None else ("listed", *listed.get(base, ()))
            calls.append((base, ("reclaim_worker", worker_id, now, poison.max_retries,
                                 poison.retry_ttl_s, detail, conn.completed_ttl, *which)))
        return await self._requeued(targets, calls, now)

    async def requeue_unheld(
        self, worker_id: str, held: Collection[str], *, now: float
    ) -> list[RequeueOutcome]:
        conn = self.connection
        keep: dict[str, list[str]] = {}
        for run_id in held:
            base = conn.keys.base_of_run(run_id)
            if base is not None:
                keep.setdefault(base, []).append(run_id)
        targets = [(n, s) for n in await self.registry.names() for s in range(conn.shard_count)]
        calls: list[Call] = []
        for name, shard in targets:
            base = conn.keys.base_of(name, shard)
            calls.append((base, ("requeue_unheld", worker_id, now, conn.completed_ttl,
                                 *keep.get(base, ()))))
        outcomes: list[RequeueOutcome] = []
        rung: dict[str, list[int]] = {}
        for (name, shard), result in zip(targets, await conn.batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            for run_id in result:
                outcomes.append(RequeueOutcome(str(run_id), False))
                rung.setdefault(name, []).append(shard)
        await self.doorbell.ring_rung(rung, now)
        return outcomes

    async def arecover_pending_runs(self, name: str) -> int:
        """Requeue every run of ``name`` whose lock expired (the default poison policy of
        a plain recovery: 3 retries, an hour); returns how many; rings every shard."""
        conn, policy = self.connection, PoisonPolicy()
        calls: list[Call] = [
            (conn.keys.base_of(name, s), ("reclaim", time.time(), 1 << 30, policy.max_retries,
                                         policy.retry_ttl_s, conn.completed_ttl))
            for s in range(conn.shard_count)
        ]
        total = 0
        for result in await conn.batch(calls):
            if isinstance(result, BaseException):
                raise result
            total += len(result)
        await self.doorbell.ring(name, list(range(conn.shard_count)), time.time(),
                                 missing_only=True)
        return total
