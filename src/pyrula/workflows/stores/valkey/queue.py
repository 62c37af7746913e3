"""The work queue: submitting a run to a shard, claiming runs from the shards the doorbell
shows (in the order ``shard_choice`` gives), claiming one put-aside suspect from a shard a
claim saw it on, claiming one named run, and waking runs whose timers fell due."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import Any

from pyrula.errors import JournalCorrupt
from pyrula.workflows.events import Event
from pyrula.workflows.limits import LimitKeys
from pyrula.workflows.priority import check_priority
from pyrula.workflows.records import (
    Claimed,
    ClaimedRun,
    RunHandle,
    SuspectsAt,
    build_claimed_run,
)
from pyrula.workflows.stores.common import NO_OWNER, record_params
from pyrula.workflows.stores.valkey.codec import (
    as_scored,
    dumps,
    events,
    implied_of,
    loads,
    raise_first,
)
from pyrula.workflows.stores.valkey.connection import Call, Connection
from pyrula.workflows.stores.valkey.doorbell import Doorbell, Empty
from pyrula.workflows.stores.valkey.flow import Flow
from pyrula.workflows.stores.valkey.keys import name_hash
from pyrula.workflows.stores.valkey.leases import Leases
from pyrula.workflows.stores.valkey.limits import LIMITED_SHARD, Limits, key_args, keys_of
from pyrula.workflows.stores.valkey.registry import Registry
from pyrula.workflows.stores.valkey.shard_choice import (
    OTHER,
    OWN,
    Candidate,
    Group,
    Visit,
    candidates,
    cursor_after,
    first_round,
    named_round,
    next_round,
    order,
    shares,
)

logger = logging.getLogger(__name__)

#: Seconds a timer scan holds a shard's entry in the timer summary while it wakes it.
TIMER_LEASE = 30.0
#: Round trips one claim may take visiting shards (the first, then shards that still had
#: runs or were not visited yet, while it is short).
CLAIM_ROUNDS = 4


def claimed_run(row: Sequence[Any]) -> ClaimedRun:
    """A claim script's row as the run claimed, its journal replayable. A journal that
    does not read is not a reason to fail the claim: the other runs it took start, and
    the worker fails this one (its attempt and lock are taken like theirs)."""
    (run_id, name, params, owner, attempt, start_id, created, base_seq, journal, idem,
     predecessor, started_at, first_worker, crashes, first_build, suspect, *keys) = row
    record = {"name": name, "params": params, "owner": owner, "created_at": created,
              "idem": idem, "predecessor": predecessor, "started_at": started_at,
              "w1": first_worker, "b1": first_build}
    values: Any = None
    journaled: list[Event] = []
    corrupt: JournalCorrupt | None = None
    try:
        values = record_params(str(run_id), params)
        journaled = events(str(run_id), journal, int(base_seq) + 1, implied_of(record))
    except JournalCorrupt as exc:
        corrupt = exc
    return build_claimed_run(
        run_id=str(run_id),
        name=str(name),
        params=values,
        owner=str(owner) or None,
        token=int(attempt),
        journal=journaled,
        base_seq=int(base_seq),
        start_id=str(start_id),
        created_at=float(created),
        crashes=() if crashes in ("", "[]") else tuple(float(t) for t in loads(crashes)),
        journal_error=corrupt,
        suspect=str(suspect) == "1",
        limit_keys=keys_of(*map(str, keys)) if keys else None,
    )


class ClaimPass:
    """One claim as it visits shards round by round: the runs it took, the suspects it saw,
    the shards it emptied and those that gave all they were asked and hold more."""

    def __init__(self, queue: Queue, worker_id: str, build: str,
                 times: tuple[float, float], reserved: dict[str, tuple[int, str]],
                 clustered: bool) -> None:
        self.queue = queue
        self.worker_id, self.build = worker_id, build
        self.now, self.lock_ttl = times
        self.reserved = reserved
        self.clustered = clustered
        #: Flow control's reservations as the scripts take them: owner, starts left, ...
        self.caps: list[Any] = [x for owner, (count, _) in reserved.items()
                                for x in (owner, count)]
        self.claimed: list[ClaimedRun] = []
        self.suspects: list[SuspectsAt] = []
        self.empty: Empty = {}
        self.fuller: list[tuple[str, int]] = []
        #: Shards other than their name's home whose lines hold runs (admit_away).
        self.away_lines: set[tuple[str, int]] = set()

    def op_of(self, name: str, shard: int) -> tuple[str, tuple[str | int | float, ...]]:
        """The claim script's op for ``name``'s ``shard`` and the limits it passes: the
        plain ``claim`` with nothing more when this process has no limits for the name;
        at its home ``claim_limited`` with its max and rate; on another shard
        ``claim_away`` (stores/valkey/limits.py)."""
        limits = self.queue.limits.args(name)
        if limits is None:
            return ("claim", ())
        return ("claim_limited", limits) if shard == LIMITED_SHARD else ("claim_away", ())

    def keys_of(self, name: str, shard: int) -> str | tuple[str, ...]:
        keys = self.queue.connection.keys
        base = keys.base_of(name, shard)
        return base if self.clustered else (base, keys.ready(name))

    async def visit(self, round_: Sequence[Visit]) -> None:
        """Claim from each shard of ``round_`` its share: in one round trip, or one shard
        after the other under flow control (each script sees what the last one left)."""
        conn = self.queue.connection
        self.queue._cursor.update(cursor_after(round_, conn.shard_count))
        args = (self.worker_id, self.now, self.now + self.lock_ttl)
        if self.reserved:
            for visit in round_:
                op, limits = self.op_of(visit.candidate.name, visit.candidate.shard)
                result = await conn.op(
                    self.keys_of(visit.candidate.name, visit.candidate.shard), op,
                    *args, visit.share, self.build, *limits, *self.caps,
                )
                self.took(result, visit)
            return
        calls: list[Call] = []
        for c, share in round_:
            op, limits = self.op_of(c.name, c.shard)
            calls.append((self.keys_of(c.name, c.shard), (op, *args, share, self.build,
                                                          *limits)))
        for visit, result in zip(round_, await conn.batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            self.took(result, visit)

    def took(self, result: Sequence[Any], visit: Visit) -> None:
        """What one shard's script gave, and what it says of the shard."""
        rows, left, waiting = result[0], result[1], result[2]
        (_, name, shard, rung), share = visit
        if len(result) > 3 and int(result[3]) and shard != LIMITED_SHARD:
            self.away_lines.add((name, shard))
        if int(waiting):
            self.suspects.append(SuspectsAt(name, shard))
            left = 1  # the shard stays in the doorbell while suspects wait there
        taken = [claimed_run(row) for row in rows]
        self.claimed.extend(taken)
        for run in taken:  # flow caps are owner-wide: later shards see what is left
            owner = run.owner or NO_OWNER
            if owner in self.reserved:
                at = self.caps.index(owner)
                self.caps[at + 1] = int(self.caps[at + 1]) - 1
        if share > 1 or not int(left):
            # Visited. (A visit for one run that left some keeps a shard rung since the
            # last visit first in line: the owner whose queue appeared there is served
            # on the shard's second pick, when it ties with an older head.)
            self.queue._seen[(name, shard)] = rung
        if not int(left):
            if self.clustered:  # on one server the claim took it out of the doorbell
                self.empty.setdefault(name, []).append((shard, rung))
        elif len(taken) >= share:
            # It gave all it was asked and has more. (One that gave less holds runs
            # flow control holds back: asking it again would get no more.)
            self.fuller.append((name, shard))


class Queue:
    """Submit, claim and timer wakes, with what this store learnt from its last claims."""

    def __init__(self, connection: Connection, registry: Registry, leases: Leases,
                 doorbell: Doorbell, flow: Flow, limits: Limits) -> None:
        self.connection = connection
        self.limits = limits
        self.registry = registry
        self.leases = leases
        self.doorbell = doorbell
        self.flow = flow
        # (name, OWN / OTHER shards) -> the shard the next claim's round starts from.
        self._cursor: dict[tuple[str, Group], int] = {}
        # (name, shard) -> the doorbell's score for it when a claim of this store last
        # visited it (a higher score since: rung again, visit it first).
        self._seen: dict[tuple[str, int], float] = {}
        # When the next timer of the shards this store scans falls due (from wake_due).
        self._next_wake: float | None = None

    # --- submit ---------------------------------------------------------------------

    def _shard_for(self, idempotency_key: str | None) -> int:
        if idempotency_key is None:
            return random.randrange(self.connection.shard_count)
        return int(name_hash(idempotency_key), 16) % self.connection.shard_count

    async def _submitted_unlimited(self, name: str, idempotency_key: str) -> str | None:
        """The run submitted under ``idempotency_key`` on the shard the key maps to when
        the workflow has no limits, if that is not the home: a workflow given limits keeps
        the runs submitted before on their shards, and a resubmit finds them there."""
        shard = self._shard_for(idempotency_key)
        if shard == LIMITED_SHARD:
            return None
        key = f"{self.connection.keys.base_of(name, shard)}:idem:{idempotency_key}"
        found = await self.connection.read(key, "GET", key)
        return None if found is None else str(found)

    async def submit(
        self,
        name: str,
        params: Any,
        *,
        now: float,
        owner: str | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        limit_keys: LimitKeys | None = None,
    ) -> tuple[RunHandle, bool]:
        """One script (atomic): the idempotency check, the record, its place in its
        owner's queue of its ``priority`` (a priority-0 run passes no argument for it), or
        with ``limit_keys``, in its key's waiting line. Every run of a limited workflow
        goes to the name's shard 0 (stores/valkey/limits.py)."""
        priority = check_priority(priority)
        conn, keys = self.connection, self.connection.keys
        await self.registry.register(name)
        limited = (limit_keys is not None or name in self.registry.limited
                   or name in self.limits.limits)
        shard = LIMITED_SHARD if limited else self._shard_for(idempotency_key)
        if limited and idempotency_key is not None:
            earlier = await self._submitted_unlimited(name, idempotency_key)
            if earlier is not None:
                return RunHandle(name, earlier), False
        base = keys.base_of(name, shard)
        run_id = keys.new_run_id(name, shard, now)
        tail: tuple[Any, ...] = (priority,) if priority else ()
        if limit_keys is not None:
            tail = (priority or "", *key_args(limit_keys))
        args = ("submit", run_id, name, owner or NO_OWNER, dumps(params), now,
                idempotency_key or "", "", *tail)
        if await conn.clustered():
            result = await conn.op(base, *args)
            if int(result[2]):  # the doorbell lives in another slot: ring it now
                await self.doorbell.ring(name, [shard], now)
        else:
            # One round trip: the script rings the doorbell itself when the shard had
            # nothing queued (one server: its keys need not share a slot).
            result = await conn.op((base, keys.ready(name), keys.bell), *args)
        created = bool(int(result[1]))
        if limited:
            # It may have started a line that this store's claims, reading the doorbell
            # within RINGS_FRESH, would not see yet.
            self.doorbell.forget_rings()
        return RunHandle(name, str(result[0])), created

    # --- claim ----------------------------------------------------------------------

    async def _candidates(self, names: Sequence[str]) -> list[Candidate]:
        rings = await self.doorbell.rings(names)
        held = {name: self.leases.held_shards(name) for name in names}
        return candidates(list(zip(names, rings, strict=True)), held)

    def _order(self, found: Sequence[Candidate]) -> list[Candidate]:
        return order(found, cursor=self._cursor, seen=self._seen,
                                  shard_count=self.connection.shard_count)

    async def claim(
        self,
        worker_id: str,
        names: Sequence[str],
        *,
        limit: int,
        now: float,
        lock_ttl: float,
        build: str | None = None,
    ) -> Claimed:
        if not names or limit <= 0:
            return Claimed()
        conn, bell = self.connection, self.doorbell
        await bell.flush_unring()
        hint, bell.hint = bell.hint, None
        if hint is not None and hint[0] not in names:
            hint = None
        found = [] if hint is not None else await self._candidates(names)
        for name in names:
            for group in (OWN, OTHER):
                self._cursor.setdefault((name, group), random.randrange(conn.shard_count))
        ordered = self._order(found)
        # The shard a wake-up named, alone at first.
        visit = (named_round(*hint, self.leases.held_shards(hint[0]), limit)
                 if hint else first_round(ordered, limit))
        if not visit:
            bell.forget_rings()  # nothing rung: the next claim reads the doorbell anew
            return Claimed()  # before reserving: only the settle gives a reservation back
        reserved = await self.flow.reserve(names, limit, now, lock_ttl)
        self.limits.lock_ttl = lock_ttl
        claim = ClaimPass(self, worker_id, build or "", (now, lock_ttl), reserved,
                          await conn.clustered())
        try:
            await claim.visit(visit)
            await self._rounds_after(claim, names, ordered, visit, hint, limit)
            await self._admit_away(claim, limit)
        finally:
            await self.flow.settle(reserved, claim.claimed, now + lock_ttl)
        # Taking dry shards out of the doorbell costs two round trips: done after the
        # claimed runs have started (the worker's next wait_for_work, or the next claim).
        bell.defer_unring(claim.empty, now)
        if len(claim.claimed) < limit:
            bell.forget_rings()  # short: the next claim reads the doorbell anew
        return Claimed(claim.claimed, claim.suspects)

    async def _admit_away(self, claim: ClaimPass, limit: int) -> None:
        """Claim what is left of ``limit`` from the lines of shards other than their
        name's home that the claim found (runs submitted there without keys)."""
        for name, shard in sorted(claim.away_lines):
            want = limit - len(claim.claimed)
            if want <= 0:
                return
            rows = await self.limits.admit_away(
                name, shard, worker_id=claim.worker_id, now=claim.now,
                lock_ttl=claim.lock_ttl, build=claim.build, want=want)
            claim.claimed.extend(claimed_run(row) for row in rows)

    async def _rounds_after(self, claim: ClaimPass, names: Sequence[str],
                            ordered: list[Candidate], first: Sequence[Visit],
                            hint: tuple[str, int] | None, limit: int) -> None:
        """A claim that came back short (shards ran dry, or hold only runs that flow
        control holds back, or other workers took them meanwhile): shards that still have
        runs get what is left, then shards not yet visited, other workers' first. Without
        the latter a worker whose own shards hold only held-back runs never takes the runs
        queued on the shards of a worker that is full. A few rounds at most."""
        visited = {(c.name, c.shard) for c, _ in first}
        for _ in range(CLAIM_ROUNDS - 1):
            remaining = limit - len(claim.claimed)
            if remaining <= 0:
                break
            if hint is not None:
                if claim.claimed and not claim.fuller:
                    # The named shard gave what it had: start those runs now. Other
                    # shards rung meanwhile left tokens of their own on the bell.
                    break
                hint = None  # a wake for a shard others emptied: look at the doorbell
                ordered = self._order(await self._candidates(names))
            round_ = next_round(ordered, visited, set(claim.fuller), remaining)
            claim.fuller.clear()
            if not round_:
                break
            visited.update((c.name, c.shard) for c, _ in round_)
            await claim.visit(round_)

    async def claim_suspect(
        self,
        worker_id: str,
        at: Sequence[SuspectsAt],
        *,
        now: float,
        lock_ttl: float,
        build: str | None = None,
    ) -> ClaimedRun | None:
        """One script per shard of ``at`` (in order) until one gives a suspect."""
        conn = self.connection
        if not at:
            return None
        clustered = await conn.clustered()
        reserved = await self.flow.reserve(sorted({p.name for p in at}), 1, now, lock_ttl)
        caps: list[Any] = [x for owner, (count, _) in reserved.items() for x in (owner, count)]
        claimed: list[ClaimedRun] = []
        try:
            for place in at:
                base = conn.keys.base_of(place.name, place.shard)
                keys = base if clustered else (base, conn.keys.ready(place.name))
                limits = self.limits.args(place.name)
                op = "claim_suspect" if limits is None else "claim_suspect_limited"
                row = await conn.op(keys, op, worker_id, now, now + lock_ttl,
                                    build or "", *(limits or ()), *caps)
                if row:
                    claimed.append(claimed_run(row))
                    break
        finally:
            await self.flow.settle(reserved, claimed, now + lock_ttl)
        return claimed[0] if claimed else None

    async def claim_run(
        self, run_id: str, worker_id: str, *, now: float, lock_ttl: float,
        build: str | None = None,
    ) -> ClaimedRun | None:
        base = self.connection.keys.base_of_run(run_id)
        if base is None:
            return None
        row = await self.connection.op(base, "claim_run", run_id, worker_id, now,
                                       now + lock_ttl, build or "",
                                       *self.limits.args_of_run(run_id))
        return None if not row else claimed_run(row)

    # --- timers ---------------------------------------------------------------------

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
        conn, keys = self.connection, self.connection.keys
        plan = await self._due_shards(now, limit)
        if not plan:
            return 0
        by_name: dict[str, list[int]] = {}
        for name, shard in plan:
            by_name.setdefault(name, []).append(shard)
        lease = repr(round(now + TIMER_LEASE, 3))
        raise_first(await conn.pipeline([
            (keys.wake(n), ("ZADD", keys.wake(n), "XX",
                            *(x for shard in shards for x in (lease, shard))))
            for n, shards in by_name.items()
        ]))
        calls: list[Call] = [
            (keys.base_of(n, s), ("wake_due", now, share))
            for (n, s), share in zip(plan, shares(limit, len(plan)), strict=True)
        ]
        woken = 0
        rung: dict[str, list[int]] = {}
        left: dict[str, list[Any]] = {}
        for (name, shard), result in zip(plan, await conn.batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            count, earliest = int(result[0]), result[1]
            if count:
                woken += count
                rung.setdefault(name, []).append(shard)
            left.setdefault(name, []).extend((shard, earliest))
        raise_first(await conn.batch([(keys.wake(n), ("timer_settle", lease, *pairs))
                                      for n, pairs in left.items()]))
        await self.doorbell.ring_rung(rung, now)
        return woken

    async def _due_shards(self, now: float, limit: int) -> list[tuple[str, int]]:
        """The (name, shard) pairs whose timer summary is due, at most ``limit``; notes the
        next summary entry not yet due (``next_wake_at``)."""
        keys = self.connection.keys
        names = await self.registry.names()
        summaries = [keys.wake(n) for n in names]
        replies = await self.connection.pipeline(
            [(k, ("ZRANGEBYSCORE", k, "-inf", now, "LIMIT", 0, limit)) for k in summaries]
            + [(k, ("ZRANGEBYSCORE", k, f"({now!r}", "+inf", "WITHSCORES", "LIMIT", 0, 64))
               for k in summaries],
            idempotent=True,
        )
        raise_first(replies)
        plan: list[tuple[str, int]] = []
        coming: list[float] = []
        # Any worker wakes any shard's due timers (not only its own shards'): the lease in
        # wake_due keeps two scans off one shard, and a worker that parked a run wakes it
        # on time.
        for name, due, later in zip(names, replies, replies[len(names):], strict=False):
            plan += [(name, int(s)) for s in due]
            coming += [at for _, at in as_scored(later)]
        self._next_wake = min(coming, default=None)
        return plan[:limit]

    def next_wake_at(self) -> float | None:
        """When the next timer of this store's shards falls due, as the last ``wake_due``
        saw it (None: none seen): the timer loop sleeps until then, not a whole interval."""
        return self._next_wake
