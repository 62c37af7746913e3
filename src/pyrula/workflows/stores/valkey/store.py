"""ValkeyStore: the store fleets share. Sharded, scripted, cluster-ready.

Each state change is one EVALSHA of this build's script on one shard (one slot): submit,
claim, append, park, finish, requeue. Lock renewal, timer wakes and orphan reclaims are
one call per shard, batched across shards. See keys.py for the data model; the connection
side lives in connection.py, membership, flow control and schedules in admin.py.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pyrula.errors import (
    ConfigurationError,
    JournalCorrupt,
    RunNotActive,
    StoreUnavailable,
    WorkflowNotFound,
)
from pyrula.workflows._sync import drive
from pyrula.workflows.events import INTERRUPT_SIGNAL, Event, EventType, make_event
from pyrula.workflows.records import (
    AppendResult,
    ClaimedRun,
    FinishResult,
    ParkResult,
    PoisonPolicy,
    RenewResult,
    RequeueOutcome,
    RunHandle,
    RunInfo,
    RunStatus,
)
from pyrula.workflows.stores.common import NO_OWNER, record_params
from pyrula.workflows.stores.valkey.admin import ValkeyAdmin
from pyrula.workflows.stores.valkey.connection import (
    _dumps,
    _events,
    _loads,
    as_hash,
    as_scored,
    implied_of,
)
from pyrula.workflows.stores.valkey.keys import name_hash

logger = logging.getLogger(__name__)


#: The fewest runs a claim asks of each shard it visits (when it wants that many).
CLAIM_SHARE = 8
#: Seconds a claim may reuse the doorbell read of the claim before it.
RINGS_FRESH = 0.05
#: Seconds a timer scan holds a shard's entry in the timer summary while it wakes it.
TIMER_LEASE = 30.0
#: Round trips one claim may take visiting shards (the first, then shards that still had
#: runs or were not visited yet, while it is short).
CLAIM_ROUNDS = 4


def _visits(limit: int, candidates: int) -> int:
    """How many shards a claim of ``limit`` runs visits among ``candidates`` rung ones."""
    return min(candidates, -(-limit // CLAIM_SHARE)) if limit > 0 else 0


def _shares(limit: int, shards: int) -> list[int]:
    """``limit`` split over ``shards`` as evenly as whole runs allow."""
    if shards <= 0:
        return []
    shares = [limit // shards] * shards
    for i in range(limit - sum(shares)):
        shares[i] += 1
    return shares


class ValkeyStore(ValkeyAdmin):
    """``ValkeyStore(url, namespace=None, shard_count=64, cluster=None, completed_ttl=86400,
    eviction_policy_check="error")``."""


    # --- submit ---------------------------------------------------------------------

    def _shard_for(self, idempotency_key: str | None) -> int:
        if idempotency_key is None:
            return random.randrange(self.shard_count)
        return int(name_hash(idempotency_key), 16) % self.shard_count

    async def submit(
        self,
        name: str,
        params: Any,
        *,
        now: float,
        owner: str | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[RunHandle, bool]:
        await self._register_name(name)
        shard = self._shard_for(idempotency_key)
        base = self.keys.base_of(name, shard)
        run_id = self.keys.new_run_id(name, shard, now)
        args = ("submit", run_id, name, owner or NO_OWNER, _dumps(params), now,
                idempotency_key or "", "")
        if await self._cluster():
            result = await self._op(base, *args)
            if int(result[2]):  # the doorbell lives in another slot: ring it now
                await self._ring(name, [shard], now)
        else:
            # One round trip: the script rings the doorbell itself when the shard had
            # nothing queued (one server: its keys need not share a slot).
            result = await self._op((base, self.keys.ready(name), self.keys.bell), *args)
        created = bool(int(result[1]))
        return RunHandle(name, str(result[0])), created

    async def _ring(self, name: str, shards: Sequence[int], now: float, *,
                    missing_only: bool = False) -> None:
        """The doorbell: mark shards that may have queued runs and wake an idle worker."""
        await self._ring_hash(name_hash(name), shards, now, missing_only=missing_only)

    async def _ring_hash(self, name_h: str, shards: Sequence[int], now: float, *,
                         missing_only: bool = False) -> None:
        """Ring ``shards`` of the name whose hash is ``name_h``; ``missing_only`` adds the
        shards the doorbell lacks and leaves the others' ring times alone (claims visit
        the shards rung last first). Each token on the bell names its shard."""
        if not shards:
            return
        ready, bell = self.keys.ready_of_hash(name_h), self.keys.bell
        for reply in await self._pipeline([
            (ready, ("ZADD", ready, "NX" if missing_only else "GT", *self._rung(shards, now))),
            (bell, ("LPUSH", bell, *(f"{name_h}.{s}" for s in shards[:64]))),
            (bell, ("LTRIM", bell, 0, 63)),
        ]):
            if isinstance(reply, BaseException):
                raise reply

    @staticmethod
    def _rung(shards: Sequence[int], now: float) -> list[Any]:
        """ZADD arguments: each shard scored with the time it was rung (ms)."""
        ms = int(now * 1000)
        out: list[Any] = []
        for shard in shards:
            out.extend((ms, shard))
        return out

    async def wait_for_work(self, names: Sequence[str], timeout: float) -> bool:
        """Block until something rings the doorbell (or ``timeout``); True if it rang."""
        await self._flush_unring()
        wait = max(timeout, 0.01)
        popped = (await self._blocking(self.keys.bell, [("BLPOP", self.keys.bell, wait)],
                                       wait))[0]
        if isinstance(popped, BaseException):
            raise popped
        self._rings_cache.clear()  # rung or not: the next claim reads the doorbell anew
        if popped:
            # The token names the shard rung: the next claim goes there first, without
            # reading the doorbell (one round trip less between a submit and its start).
            name_h, _, shard = str(popped[1]).partition(".")
            for name in names:
                if name_hash(name) == name_h and shard.isdigit():
                    self._hint = (name, int(shard))
        return bool(popped)

    # --- attempt writes -------------------------------------------------------------

    def _base(self, run_id: str) -> str:
        base = self.keys.base_of_run(run_id)
        if base is None:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        return base

    async def append(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float, lock_ttl: float
    ) -> AppendResult:
        result = await self._op(
            self._base(run_id), "append", run_id, token, now, now + lock_ttl,
            *(_dumps(e) for e in events),
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
        interrupt_json = _dumps(interrupt) if INTERRUPT_SIGNAL in signals else ""
        base = self._base(run_id)
        summary = self.keys.wake_of_hash(run_id[:12])
        clustered = await self._cluster()
        result = await self._op(
            base if clustered or wake_at is None else (base, summary), "park", run_id, token,
            now, "" if wake_at is None else wake_at, known_seq, interrupt_json, len(signals),
            *signals, *(_dumps(e) for e in events),
        )
        parked, last, cancel, tail = int(result[0]), int(result[1]), int(result[2]), result[3]
        if parked:
            if clustered and wake_at is not None:
                # The summary lives in another slot: recorded after the timer itself, so
                # a scan that finds it finds the timer too.
                await self._call(summary, "ZADD", summary, "LT", wake_at, int(run_id[12:16], 16))
            await self._flow_done(run_id)
            return ParkResult(True, last)
        return ParkResult(False, last, _events(run_id, tail, known_seq + 1), bool(cancel))

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
        status = RunStatus(status)
        batch = [dict(e) for e in events]
        successor_id = ""
        name = None
        if status is RunStatus.CONTINUED:
            info = await self.get_run(run_id)
            if info is None:
                raise WorkflowNotFound(f"no run with id {run_id!r}")
            name = info.name
            shard = int(run_id[12:16], 16)
            successor_id = self.keys.new_run_id(info.name, shard, now)
            batch[-1]["successor"] = successor_id
        last, ring = await self._op(
            self._base(run_id), "finish", run_id, token, now, status.value, _dumps(result),
            "" if error is None else _dumps(error), self.completed_ttl, successor_id,
            _dumps(successor_params) if successor_id else "",
            *(_dumps(e) for e in batch),
        )
        await self._flow_done(run_id)
        if int(ring) and name is not None:
            await self._ring(name, [int(run_id[12:16], 16)], now)
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
        quarantined = await self._op(
            self._base(run_id), "requeue", run_id, token, now, reason, 1 if crash else 0,
            policy.max_retries, policy.retry_ttl_s, _dumps(dict(crash_detail or {})),
            self.completed_ttl, *(_dumps(e) for e in events),
        )
        await self._flow_done(run_id)
        if not int(quarantined):
            await self._ring_run(run_id, now)
        return RequeueOutcome(run_id, bool(int(quarantined)))

    async def _ring_run(self, run_id: str, now: float) -> None:
        # The run id carries its name's hash and its shard: no need to read the run.
        await self._ring_hash(run_id[:12], [int(run_id[12:16], 16)], now)

    # --- work queue -----------------------------------------------------------------

    def _held_shards(self, name: str) -> set[int]:
        held: set[int] = set()
        for names in self._leases.values():
            held |= names.get(name, set())
        return held

    async def claim(
        self,
        worker_id: str,
        names: Sequence[str],
        *,
        limit: int,
        now: float,
        lock_ttl: float,
    ) -> list[ClaimedRun]:
        if not names or limit <= 0:
            return []
        await self._flush_unring()
        hint, self._hint = self._hint, None
        if hint is not None and hint[0] not in names:
            hint = None
        candidates = [] if hint is not None else await self._candidates(names)
        # Visit the rung shards, own shards first. Within each group, first the shards rung
        # since this store last visited them, newest ring first: a shard rings when an
        # owner's queue appears on it, and deficit round robin serves that owner next
        # there, so a newcomer waits one claim, not a round over every shard. Then the
        # others in turn from where this store's last claim of the name stopped: every rung
        # shard is visited within a round. (A random pick leaves some shard unvisited for
        # many claims, and with it a small owner whom deficit round robin serves next.)
        cursor, seen = self._claim_cursor, self._claim_seen
        for name in names:
            for group in (0, 1):
                cursor.setdefault((name, group), random.randrange(self.shard_count))

        def order(c: tuple[int, str, int, float]) -> tuple[int, int, float]:
            group, name, shard, rung = c
            if rung > seen.get((name, shard), -1.0):
                return group, 0, -rung
            return group, 1, float((shard - cursor[(name, group)]) % self.shard_count)

        candidates.sort(key=order)
        # A few shards, each with a share of `limit` (at least CLAIM_SHARE runs): one claim
        # is one pipelined round trip, and each shard visited pays its script call for a
        # batch of runs rather than for one. (The shard a wake-up named, alone at first.)
        visit = ([(0 if hint[1] in self._held_shards(hint[0]) else 1, *hint, -1.0)] if hint
                 else candidates[:_visits(limit, len(candidates))])
        if not visit:
            self._rings_cache.clear()  # nothing rung: the next claim reads the doorbell anew
            return []  # before reserving: a reservation is only given back by the settle
        reserved = await self._flow_reserve(names, limit, now, lock_ttl)
        caps: list[Any] = []
        for owner, (count, _) in reserved.items():
            caps.extend([owner, count])
        claimed: list[ClaimedRun] = []
        empty: dict[str, list[tuple[int, float]]] = {}
        fuller: list[tuple[str, int]] = []
        clustered = await self._cluster()

        def keys_of(name: str, shard: int) -> str | tuple[str, ...]:
            base = self.keys.base_of(name, shard)
            return base if clustered else (base, self.keys.ready(name))

        def took(rows: Sequence[Any], left: Any, name: str, shard: int, rung: float,
                 share: int) -> None:
            taken = [self._claimed(row) for row in rows]
            claimed.extend(taken)
            for run in taken:  # flow caps are owner-wide: later shards see what is left
                owner = run.owner or NO_OWNER
                if owner in reserved:
                    at = caps.index(owner)
                    caps[at + 1] = int(caps[at + 1]) - 1
            if share > 1 or not int(left):
                # Visited. (A visit for one run that left some keeps a shard rung since the
                # last visit first in line: the owner whose queue appeared there is served
                # on the shard's second pick, when it ties with an older head.)
                seen[(name, shard)] = rung
            if not int(left):
                if clustered:  # on one server the claim took it out of the doorbell
                    empty.setdefault(name, []).append((shard, rung))
            elif len(taken) >= share:
                # It gave all it was asked and has more. (One that gave less holds runs
                # flow control holds back: asking it again would get no more.)
                fuller.append((name, shard))

        async def claim_on(shards: Sequence[tuple[int, str, int, float]],
                           counts: Sequence[int]) -> None:
            for group, name, shard, _ in shards:
                cursor[(name, group)] = (shard + 1) % self.shard_count
            if reserved:
                for (_, name, shard, rung), share in zip(shards, counts, strict=True):
                    rows, left = await self._op(
                        keys_of(name, shard), "claim", worker_id, now,
                        now + lock_ttl, share, *caps,
                    )
                    took(rows, left, name, shard, rung, share)
                return
            calls = [
                (keys_of(name, shard), ("claim", worker_id, now, now + lock_ttl, share))
                for (_, name, shard, _), share in zip(shards, counts, strict=True)
            ]
            results = await self._batch(calls)
            for (_, name, shard, rung), share, result in zip(shards, counts, results,
                                                             strict=True):
                if isinstance(result, BaseException):
                    raise result
                took(result[0], result[1], name, shard, rung, share)

        try:
            await claim_on(visit, _shares(limit, len(visit)))
            # Come back short (shards ran dry, or hold only runs that flow control holds
            # back, or other workers took them meanwhile): shards that still have runs get
            # what is left, then shards not yet visited, other workers' first. Without the
            # latter a worker whose own shards hold only held-back runs never takes the runs
            # queued on the shards of a worker that is full. A few rounds at most.
            visited = {(n, s) for _, n, s, _ in visit}
            rest = sorted((c for c in candidates if (c[1], c[2]) not in visited),
                          key=lambda c: -c[0])  # stable: other workers' shards first
            for _ in range(CLAIM_ROUNDS - 1):
                remaining = limit - len(claimed)
                if remaining <= 0:
                    break
                if hint is not None:
                    if claimed and not fuller:
                        # The named shard gave what it had: start those runs now. Other
                        # shards rung meanwhile left tokens of their own on the bell.
                        break
                    hint = None  # a wake for a shard others emptied: look at the doorbell
                    candidates = sorted(await self._candidates(names), key=order)
                    rest = sorted((c for c in candidates if (c[1], c[2]) not in visited),
                                  key=lambda c: -c[0])
                again = [c for c in candidates if (c[1], c[2]) in set(fuller)]
                fuller.clear()
                targets = again + rest
                if not targets:
                    break
                # The shards visited were sparse: now as many as runs are still wanted.
                chosen = targets[:remaining]
                rest = [c for c in rest if c not in chosen]
                visited.update((n, s) for _, n, s, _ in chosen)
                await claim_on(chosen, _shares(remaining, len(chosen)))
        finally:
            await self._flow_settle(reserved, claimed, now + lock_ttl)
        # Taking dry shards out of the doorbell costs two round trips: done after the
        # claimed runs have started (the worker's next wait_for_work, or the next claim).
        self._deferred_unring.append((empty, now))
        if len(claimed) < limit:
            self._rings_cache.clear()  # short: the next claim reads the doorbell anew
        return claimed

    async def _candidates(self, names: Sequence[str]) -> list[tuple[int, str, int, float]]:
        """The rung shards of ``names``: (0 own shard / 1 another's, name, shard, rung)."""
        candidates: list[tuple[int, str, int, float]] = []
        for name, rung in zip(names, await self._rings(names), strict=True):
            held = self._held_shards(name)
            for member, score in rung:
                shard = int(member)
                candidates.append((0 if shard in held else 1, name, shard, float(score)))
        return candidates

    async def _rings(self, names: Sequence[str]) -> list[list[tuple[str, float]]]:
        """The doorbell of each name: (shard, when rung). Claims that follow each other
        closely (a worker working off a backlog) share one read for RINGS_FRESH seconds."""
        key = tuple(names)
        stamp, cached = self._rings_cache.get(key, (-1.0, []))
        if time.monotonic() - stamp < RINGS_FRESH:
            return cached
        replies = await self._pipeline(
            [(self.keys.ready(n), ("ZRANGE", self.keys.ready(n), 0, -1, "WITHSCORES"))
             for n in names], idempotent=True,
        )
        rings = []
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
            rings.append(as_scored(reply))
        self._rings_cache[key] = (time.monotonic(), rings)
        return rings

    async def _flush_unring(self) -> None:
        deferred, self._deferred_unring = self._deferred_unring, []
        for empty, now in deferred:
            await self._unring(empty, now)

    async def _unring(self, empty: dict[str, list[tuple[int, float]]], now: float) -> None:
        """Take shards found empty out of the doorbell, then look again: a run enqueued
        meanwhile was either seen by the second look (and the shard is rung again) or
        enqueued after it, and its own ring comes after our removal."""
        for name, shards in empty.items():
            members = [str(s) for s, _ in shards]
            await self._call(self.keys.ready(name), "ZREM", self.keys.ready(name), *members)
            looks = await self._queued(name, [s for s, _ in shards])
            busy = [s for (s, _), n in zip(shards, looks, strict=True) if n != 0]
            if busy:
                await self._ring(name, busy, now)

    async def _queued(self, name: str, shards: Sequence[int]) -> list[int]:
        """How many owners have queued runs on each of ``shards`` (-1: unknown, an error)."""
        keys = [f"{self.keys.base_of(name, s)}:active" for s in shards]
        replies = await self._pipeline([(k, ("ZCARD", k)) for k in keys], idempotent=True)
        return [-1 if isinstance(r, BaseException) else int(r) for r in replies]

    def _claimed(self, row: Sequence[Any]) -> ClaimedRun:
        (run_id, name, params, owner, attempt, start_id, created, base_seq, journal, idem,
         predecessor, started_at, first_worker, crashes) = row
        record = {"name": name, "params": params, "owner": owner, "created_at": created,
                  "idem": idem, "predecessor": predecessor, "started_at": started_at,
                  "w1": first_worker}
        values: Any = None
        events: list[Event] = []
        corrupt: JournalCorrupt | None = None
        try:
            # Not a reason to fail the claim: the other runs it took start, and the worker
            # fails this one (its attempt and lock are taken like theirs).
            values = record_params(str(run_id), params)
            events = _events(str(run_id), journal, int(base_seq) + 1, implied_of(record))
        except JournalCorrupt as exc:
            corrupt = exc
        return ClaimedRun(
            run_id=str(run_id),
            name=str(name),
            params=values,
            owner=str(owner) or None,
            token=int(attempt),
            journal=events,
            base_seq=int(base_seq),
            start_id=str(start_id),
            created_at=float(created),
            crashes=tuple(float(t) for t in _loads(crashes)),
            journal_error=corrupt,
        )

    async def claim_run(
        self, run_id: str, worker_id: str, *, now: float, lock_ttl: float
    ) -> ClaimedRun | None:
        if self.keys.base_of_run(run_id) is None:
            return None
        row = await self._op(self._base(run_id), "claim_run", run_id, worker_id, now,
                             now + lock_ttl)
        return None if not row else self._claimed(row)

    async def renew(
        self, worker_id: str, held: Mapping[str, int], *, now: float, lock_ttl: float
    ) -> RenewResult:
        by_shard: dict[str, list[Any]] = {}
        for run_id, token in held.items():
            base = self.keys.base_of_run(run_id)
            if base is not None:
                by_shard.setdefault(base, []).extend([run_id, token])
        calls = [(base, ("renew", now, now + lock_ttl, *args)) for base, args in by_shard.items()]
        lost: set[str] = {r for r in held if self.keys.base_of_run(r) is None}
        cancel: set[str] = set()
        flows: dict[str, list[str]] = {}
        for run_id in held:
            owner = self._flow_runs.get(run_id)
            if owner is not None:
                flows.setdefault(owner, []).append(run_id)
        calls += [(self.keys.flow(o), ("flow_renew", now + lock_ttl, *ids))
                  for o, ids in flows.items()]
        for result in await self._batch(calls):
            if isinstance(result, BaseException):
                if isinstance(result, StoreUnavailable | ConfigurationError):
                    raise result
                continue
            if isinstance(result, list):
                lost.update(str(r) for r in result[0])
                cancel.update(str(r) for r in result[1])
        for run_id in lost:
            self._flow_runs.pop(run_id, None)
        return RenewResult(frozenset(lost), frozenset(cancel))

    def _shards_to_scan(self, name: str) -> list[int]:
        held = self._held_shards(name)
        return sorted(held) if held else list(range(self.shard_count))

    async def _expired_locks(self, names: Sequence[str], now: float,
                             limit: int) -> list[tuple[str, int, int]]:
        """(name, shard, how many to take) for shards with runs whose lock expired by
        ``now``, allotted in shard order so the total stays within ``limit``."""
        shards = [(n, s) for n in names for s in self._shards_to_scan(n)]
        keys = [f"{self.keys.base_of(n, s)}:times" for n, s in shards]
        counts = await self._pipeline([(k, ("ZCOUNT", k, 0, now)) for k in keys],
                                      idempotent=True)
        for count in counts:
            if isinstance(count, BaseException):
                raise count
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

    async def wake_due(self, *, now: float, limit: int) -> int:
        """Wake runs whose timers are due, at most ``limit``: the shards come from each
        name's timer summary (one read per name), not from a look at every shard.

        Each due shard's entry is first leased (moved TIMER_LEASE seconds ahead, so other
        scans skip it), then its timers are woken, then the entry settles on the shard's
        earliest timer left, unless a parker lowered it meanwhile: a parker records its
        timer before the summary, so a timer set meanwhile is either seen by the wake or
        recorded after it. A scan that dies mid-way leaves the lease, which falls due
        again: the shard is looked at TIMER_LEASE seconds later.
        """
        if limit <= 0:
            return 0
        names = await self._names()
        summaries = [self.keys.wake(n) for n in names]
        replies = await self._pipeline(
            [(k, ("ZRANGEBYSCORE", k, "-inf", now, "LIMIT", 0, limit)) for k in summaries]
            + [(k, ("ZRANGEBYSCORE", k, f"({now!r}", "+inf", "WITHSCORES", "LIMIT", 0, 64))
               for k in summaries],
            idempotent=True,
        )
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        plan: list[tuple[str, int]] = []
        coming: list[float] = []
        # Any worker wakes any shard's due timers (not only its own shards'): the lease below
        # keeps two scans off one shard, and a worker that parked a run wakes it on time.
        for name, due, later in zip(names, replies, replies[len(names):], strict=False):
            plan += [(name, int(s)) for s in due]
            coming += [at for _, at in as_scored(later)]
        self._next_wake = min(coming, default=None)
        plan = plan[:limit]
        if not plan:
            return 0
        by_name: dict[str, list[int]] = {}
        for name, shard in plan:
            by_name.setdefault(name, []).append(shard)
        lease = repr(round(now + TIMER_LEASE, 3))
        await self._each([
            (self.keys.wake(n), ("ZADD", self.keys.wake(n), "XX",
                                 *(x for shard in shards for x in (lease, shard))))
            for n, shards in by_name.items()
        ])
        calls = [(self.keys.base_of(n, s), ("wake_due", now, share))
                 for (n, s), share in zip(plan, _shares(limit, len(plan)), strict=True)]
        woken = 0
        rung: dict[str, list[int]] = {}
        left: dict[str, list[Any]] = {}
        for (name, shard), result in zip(plan, await self._batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            count, earliest = int(result[0]), result[1]
            if count:
                woken += count
                rung.setdefault(name, []).append(shard)
            left.setdefault(name, []).extend((shard, earliest))
        settled = await self._batch([(self.keys.wake(n), ("timer_settle", lease, *pairs))
                                     for n, pairs in left.items()])
        for result in settled:
            if isinstance(result, BaseException):
                raise result
        for name, shards in rung.items():
            await self._ring(name, shards, now)
        return woken

    def next_wake_at(self) -> float | None:
        """When the next timer of this store's shards falls due, as the last ``wake_due``
        saw it (None: none seen): the timer loop sleeps until then, not a whole interval."""
        return self._next_wake

    async def _each(self, commands: Sequence[tuple[str | None, tuple[Any, ...]]]) -> None:
        """Plain writes in one round trip; the first error is raised."""
        for reply in await self._pipeline(commands):
            if isinstance(reply, BaseException):
                raise reply

    async def reclaim(
        self,
        names: Sequence[str] | None,
        *,
        now: float,
        limit: int,
        poison: PoisonPolicy,
    ) -> list[RequeueOutcome]:
        chosen = await self._names() if names is None else list(names)
        plan = await self._expired_locks(chosen, now, limit)
        calls = [
            (self.keys.base_of(n, s), ("reclaim", now, take, poison.max_retries,
                                      poison.retry_ttl_s, self.completed_ttl))
            for n, s, take in plan
        ]
        outcomes: list[RequeueOutcome] = []
        rung: dict[str, list[int]] = {}
        for (name, shard, _), result in zip(plan, await self._batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            for run_id, quarantined in result:
                outcomes.append(RequeueOutcome(str(run_id), bool(int(quarantined))))
                if not int(quarantined):
                    rung.setdefault(name, []).append(shard)
        for name, shards in rung.items():
            await self._ring(name, shards, now)
        await self._sweep(chosen, now)  # the orphan scan's pace suits the safety net
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
        targets = [(n, s) for n in await self._names() for s in range(self.shard_count)]
        detail = _dumps(dict(crash_detail or {}))
        # Each shard's script is told the runs of that shard to charge (a run id names its
        # shard), or to charge every run it finds.
        listed: dict[str, list[str]] = {}
        for run_id in charge or ():
            base = self.keys.base_of_run(run_id)
            if base is not None:
                listed.setdefault(base, []).append(run_id)
        calls = []
        for n, s in targets:
            base = self.keys.base_of(n, s)
            which = ("all",) if charge is None else ("listed", *listed.get(base, ()))
            calls.append((base, ("reclaim_worker", worker_id, now, poison.max_retries,
                                 poison.retry_ttl_s, detail, self.completed_ttl, *which)))
        outcomes: list[RequeueOutcome] = []
        rung: dict[str, list[int]] = {}
        for (name, shard), result in zip(targets, await self._batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            for run_id, quarantined in result:
                outcomes.append(RequeueOutcome(str(run_id), bool(int(quarantined))))
                if not int(quarantined):
                    rung.setdefault(name, []).append(shard)
        for name, shards in rung.items():
            await self._ring(name, shards, now)
        return outcomes

    async def requeue_unheld(
        self, worker_id: str, held: Collection[str], *, now: float
    ) -> list[RequeueOutcome]:
        keep: dict[str, list[str]] = {}
        for run_id in held:
            base = self.keys.base_of_run(run_id)
            if base is not None:
                keep.setdefault(base, []).append(run_id)
        targets = [(n, s) for n in await self._names() for s in range(self.shard_count)]
        calls = []
        for name, shard in targets:
            base = self.keys.base_of(name, shard)
            calls.append((base, ("requeue_unheld", worker_id, now, self.completed_ttl,
                                 *keep.get(base, ()))))
        outcomes: list[RequeueOutcome] = []
        rung: dict[str, list[int]] = {}
        for (name, shard), result in zip(targets, await self._batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            for run_id in result:
                outcomes.append(RequeueOutcome(str(run_id), False))
                rung.setdefault(name, []).append(shard)
        for name, shards in rung.items():
            await self._ring(name, shards, now)
        return outcomes

    def recover_pending_runs(self, name: str) -> int:
        async def recover() -> int:
            calls = [
                (self.keys.base_of(name, s), ("reclaim", time.time(), 1 << 30, 3, 3600.0,
                                             self.completed_ttl))
                for s in range(self.shard_count)
            ]
            total = 0
            for result in await self._batch(calls):
                if isinstance(result, BaseException):
                    raise result
                total += len(result)
            await self._ring(name, list(range(self.shard_count)), time.time(),
                             missing_only=True)
            return total

        return drive(recover())

    # --- run control ----------------------------------------------------------------

    async def signal(self, run_id: str, name: str, payload: Any, *, now: float) -> None:
        interrupt = name == INTERRUPT_SIGNAL
        type_ = EventType.INTERRUPT_RESUMED if interrupt else EventType.SIGNAL_RECEIVED
        event = make_event(type_, now, name=name, payload=payload)
        answer = str(await self._op(self._base(run_id), "signal", run_id, now, name,
                                    _dumps(event)))
        if answer == "NOTFOUND":
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        if answer.startswith("ENDED"):
            raise RunNotActive(f"run {run_id} has already ended ({answer.split(' ', 1)[1]})")
        if answer == "QUEUED":
            await self._ring_run(run_id, now)

    async def cancel(self, run_id: str, *, now: float) -> bool:
        answer = str(await self._op(self._base(run_id), "cancel", run_id, now,
                                    self.completed_ttl))
        if answer == "NOTFOUND":
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        return answer in ("CANCELLED", "REQUESTED")

    async def wake_run(self, run_id: str, *, now: float) -> bool:
        answer = str(await self._op(self._base(run_id), "wake_run", run_id, now))
        if answer == "NOTFOUND":
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        if answer == "WOKEN":
            await self._ring_run(run_id, now)
            return True
        return False

    # --- reads ----------------------------------------------------------------------

    async def get_run(self, run_id: str) -> RunInfo | None:
        if self.keys.base_of_run(run_id) is None:
            return None
        key = self.keys.run(run_id)
        fields = as_hash(await self._read(key, "HGETALL", key))
        return self._info(run_id, fields) if fields else None

    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        if self.keys.base_of_run(run_id) is None:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        journal, run = self.keys.journal(run_id), self.keys.run(run_id)
        if after_seq > 0:
            raw = await self._read(journal, "LRANGE", journal, after_seq, -1)
            if not raw and not await self._read(run, "EXISTS", run):
                raise WorkflowNotFound(f"no run with id {run_id!r}")
            return _events(run_id, raw, after_seq + 1)
        # From the start: the record too, for run:submitted (one round trip).
        record, raw = await self._pipeline(
            [(run, ("HGETALL", run)), (journal, ("LRANGE", journal, 0, -1))], idempotent=True)
        for reply in (record, raw):
            if isinstance(reply, BaseException):
                raise reply
        fields = as_hash(record)
        if not fields:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        if not raw:  # nothing written yet: what the record implies
            raw = ["", ""] if fields.get("w1") else [""]
        return _events(run_id, raw, 1, implied_of(fields))

    async def list_runs(
        self,
        *,
        name: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunInfo]:
        names = [name] if name is not None else await self._names()
        page: list[RunInfo] = []
        # Scatter: each shard's index newest first, in chunks, until enough rows match.
        top = "+inf" if before is None else before[0]
        bases = [self.keys.base_of(n, s) for n in names for s in range(self.shard_count)]
        chunk = max(limit, 50)
        for base in bases:
            offset = 0
            while True:
                index = f"{base}:index"
                ids = as_scored(await self._read(
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
        if self.keys.base_of_run(run_id) is None:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        info = await self.get_run(run_id)
        marked = False
        while True:
            if info is None:
                # An earlier run of a continue_as_new chain may have expired while the chain
                # goes on: its start id's tail record names the chain's latest run.
                chain = f"{self.keys.base_of_run(run_id)}:chain:{run_id}"
                tail = await self._read(chain, "GET", chain)
                if tail is None or tail == run_id:
                    raise WorkflowNotFound(f"no run with id {run_id!r}")
                run_id, marked = str(tail), False
                info = await self.get_run(run_id)
                continue
            if info.status.terminal:
                return info
            if not marked:
                # Mark the run as waited on: its finish then leaves a token to wake us.
                marked = True
                if str(await self._op(self._base(run_id), "await", run_id)) != "WAIT":
                    info = await self.get_run(run_id)
                    continue
            wait = 5.0
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    raise TimeoutError(f"run {run_id} did not end within {timeout} s")
            # Woken by the store, no polling: a blocking rotation of the run's "done" list,
            # which leaves its token (and its TTL) for other waiters, and the record read
            # right behind it on the same connection.
            wait = max(wait, 0.01)
            done_key, run_key = self.keys.done(run_id), self.keys.run(run_id)
            moved, fields = await self._blocking(done_key, [
                ("BLMOVE", done_key, done_key, "LEFT", "RIGHT", wait), ("HGETALL", run_key),
            ], wait)
            for reply in (moved, fields):
                if isinstance(reply, BaseException):
                    raise reply
            record = as_hash(fields)
            info = self._info(run_id, record) if record else None

    # --- shards ---------------------------------------------------------------------

    def shards_held(self, worker_id: str) -> dict[str, int]:
        return {name: len(s) for name, s in self._leases.get(worker_id, {}).items()}

    async def shard_lease_tick(
        self, *, worker_id: str, names: Sequence[str], now: float, options: Any
    ) -> None:
        ttl = float(getattr(options, "shard_lease_ttl", 30.0))
        calls = [(self.keys.leases(n), ("lease", worker_id, now, ttl, self.shard_count))
                 for n in names]
        held = self._leases.setdefault(worker_id, {})
        for name, result in zip(names, await self._batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            held[name] = {int(s) for s in result}

    async def _sweep(self, names: Sequence[str], now: float) -> None:
        """Safety net for the doorbell (a client that died between its submit and its
        ring): ring every shard we scan that has queued runs and is not rung."""
        self._rings_cache.clear()
        for name, rung in zip(names, await self._rings(names), strict=True):
            marked = {int(s) for s, _ in rung}
            shards = [s for s in self._shards_to_scan(name) if s not in marked]
            looks = await self._queued(name, shards)
            busy = [s for s, n in zip(shards, looks, strict=True) if n > 0]
            await self._ring(name, busy, now, missing_only=True)

    async def release_shards(self, worker_id: str) -> None:
        """Give back every shard ``worker_id`` leases, and drop it from the live workers.
        Also for a worker that leased through another store object (a fleet's supervisor
        releasing a dead child's shards): then every registered name is released."""
        names = list(self._leases.get(worker_id, {})) or await self._names()
        calls = [(self.keys.leases(n), ("release", worker_id)) for n in names]
        await self._batch(calls)
        self._leases.pop(worker_id, None)

