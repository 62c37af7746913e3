"""ValkeyStore: the store fleets share. Sharded, scripted, cluster-ready.

Each state change is one call (FCALL) of this build's Lua on one shard (one slot): submit,
claim, append, park, finish, requeue. Lock renewal, timer wakes and orphan reclaims are
one call per shard, batched across shards. See keys.py for the data model.

The store is a facade over its parts, one per concern, each holding the one
:class:`~.connection.Connection`: the namespace's names (``registry``), shard leases and
membership (``leases``), the doorbell, flow control, the work queue (submit, claim,
timers), attempts (their writes and reclaims), run control, reads, schedules. Each
method here hands its call to the part that owns it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

from pyrula.workflows.events import Event
from pyrula.workflows.limits import LimitKeys, WorkflowLimits
from pyrula.workflows.records import (
    AppendResult,
    Claimed,
    ClaimedRun,
    FinishResult,
    FlowControl,
    ParkResult,
    PoisonPolicy,
    RenewResult,
    RequeueOutcome,
    RunHandle,
    RunInfo,
    RunOutcome,
    RunStatus,
    SuspectsAt,
)
from pyrula.workflows.schedules.schedule import Schedule
from pyrula.workflows.stores.admin import SyncAdmin
from pyrula.workflows.stores.capabilities import ProjectionHead, QueueStat
from pyrula.workflows.stores.valkey.attempts import Attempts
from pyrula.workflows.stores.valkey.codec import raise_first
from pyrula.workflows.stores.valkey.connection import Connection
from pyrula.workflows.stores.valkey.control import Control
from pyrula.workflows.stores.valkey.doorbell import Doorbell
from pyrula.workflows.stores.valkey.flow import Flow
from pyrula.workflows.stores.valkey.keys import ended_time
from pyrula.workflows.stores.valkey.leases import Leases
from pyrula.workflows.stores.valkey.limits import LIMITED_SHARD, Limits
from pyrula.workflows.stores.valkey.projections import ValkeyProjections
from pyrula.workflows.stores.valkey.queue import Queue
from pyrula.workflows.stores.valkey.reads import Reads
from pyrula.workflows.stores.valkey.registry import Registry
from pyrula.workflows.stores.valkey.schedules import Schedules
from pyrula.workflows.stores.valkey.triggers import Triggers

logger = logging.getLogger(__name__)


class ValkeyStore(SyncAdmin):
    """``ValkeyStore(url, namespace=None, shard_count=64, cluster=None, completed_ttl=86400,
    eviction_policy_check="error", *, durability=None, replica_timeout=None)``.

    ``durability``: ``"async"`` (the default) counts a write done when the primary has it;
    ``"replicated"`` when one replica has it too (the URL's ``?durability=`` when not
    given here). ``replica_timeout``: how long such a write waits for its replica before
    it is reported as ``StoreUnavailable`` (default 2 s, below ``socket_timeout``)."""

    #: Every operation runs on the calling thread's blocking connections when driven by
    #: ``pyrula.workflows._sync.drive`` (synchronous callers need no event loop).
    sync_driven: ClassVar[bool] = True

    def __init__(
        self,
        url: str = "redis://localhost:6379",
        namespace: str | None = None,
        shard_count: int = 64,
        cluster: bool | None = None,
        completed_ttl: float = 86400,
        eviction_policy_check: str | None = None,
        *,
        socket_timeout: float = 10.0,
        max_connections: int = 256,
        durability: str | None = None,
        replica_timeout: float | None = None,
    ) -> None:
        self.connection = conn = Connection(
            url, namespace, shard_count, cluster, completed_ttl, eviction_policy_check,
            socket_timeout=socket_timeout, max_connections=max_connections,
            durability=durability, replica_timeout=replica_timeout,
        )
        self.url, self.tls, self.namespace = conn.url, conn.tls, conn.namespace
        self.shard_count, self.cluster = conn.shard_count, conn.cluster
        self.completed_ttl = conn.completed_ttl
        self.eviction_policy_check = conn.eviction_policy_check
        self.durability = conn.durability
        self.keys, self.stats = conn.keys, conn.stats
        self.registry = Registry(conn)
        self.leases = Leases(conn, self.registry)
        self.doorbell = Doorbell(conn, self.leases)
        self.flow = Flow(conn)
        self.limits = Limits(conn)
        self.doorbell.limited = self.limits.limits
        self.queue = Queue(conn, self.registry, self.leases, self.doorbell, self.flow,
                           self.limits)
        self.reads = Reads(conn, self.registry)
        self.attempts = Attempts(conn, self.registry, self.leases, self.doorbell, self.flow,
                                 self.reads)
        self.control = Control(conn, self.doorbell)
        self.schedules = Schedules(conn)
        self.triggers = Triggers(conn, self.registry, self.doorbell)
        self.projections = ValkeyProjections(conn, self.reads)

    def __repr__(self) -> str:
        return (f"ValkeyStore({self.connection.where()!r}, namespace={self.namespace!r}, "
                f"shard_count={self.shard_count})")

    # --- lifecycle ------------------------------------------------------------------

    async def load_script(self) -> None:
        """Load this build's script (on every primary of a cluster)."""
        await self.connection.load_script()

    async def prepare(self, names: Sequence[str]) -> None:
        await self.registry.prepare(names, limited=self.limits.limits)

    async def bind(
        self, project: str | None, environment: str | None
    ) -> tuple[str | None, str | None]:
        recorded, meta = await self.registry.bind(project, environment)
        self.flow.prime(meta)
        return recorded

    async def aping(self) -> None:
        await self.connection.read(None, "PING")

    async def server_time(self) -> float:
        """The server's clock (``TIME``) in epoch seconds: the clock the locks, shard leases
        and timers of this store are judged by (a worker reads it through ``StoreClock``).
        On a cluster, the clock of whichever node answers."""
        seconds, micros = await self.connection.read(None, "TIME")
        return int(seconds) + int(micros) / 1_000_000

    async def aclose(self) -> None:
        """Close this event loop's connections."""
        await self.connection.aclose()

    def close(self) -> None:
        """Close the connections of every loop and thread."""
        self.connection.close()

    # --- work queue -----------------------------------------------------------------

    async def submit(
        self, name: str, params: Any, *, now: float, owner: str | None = None,
        idempotency_key: str | None = None, priority: int = 0,
        limit_keys: LimitKeys | None = None,
    ) -> tuple[RunHandle, bool]:
        return await self.queue.submit(name, params, now=now, owner=owner,
                                       idempotency_key=idempotency_key, priority=priority,
                                       limit_keys=limit_keys)

    # --- per-key limits (KeyedLimits) -----------------------------------------------

    def use_limits(self, limits: Mapping[str, WorkflowLimits]) -> None:
        self.limits.use_limits(limits)

    async def assign_limit_keys(
        self, run_id: str, token: int, keys: LimitKeys, *, now: float
    ) -> bool:
        if await self.limits.assign_limit_keys(run_id, token, keys, now=now):
            return True
        await self.doorbell.ring_run(run_id, now)  # its line may be new: claims look there
        return False

    async def claim(
        self, worker_id: str, names: Sequence[str], *, limit: int, now: float, lock_ttl: float,
        build: str | None = None,
    ) -> Claimed:
        return await self.queue.claim(worker_id, names, limit=limit, now=now,
                                      lock_ttl=lock_ttl, build=build)

    async def claim_suspect(
        self, worker_id: str, at: Sequence[SuspectsAt], *, now: float, lock_ttl: float,
        build: str | None = None,
    ) -> ClaimedRun | None:
        return await self.queue.claim_suspect(worker_id, at, now=now, lock_ttl=lock_ttl,
                                              build=build)

    async def claim_run(
        self, run_id: str, worker_id: str, *, now: float, lock_ttl: float,
        build: str | None = None,
    ) -> ClaimedRun | None:
        return await self.queue.claim_run(run_id, worker_id, now=now, lock_ttl=lock_ttl,
                                          build=build)

    async def wake_due(self, *, now: float, limit: int) -> int:
        return await self.queue.wake_due(now=now, limit=limit)

    def next_wake_at(self) -> float | None:
        return self.queue.next_wake_at()

    async def wait_for_work(self, names: Sequence[str], timeout: float) -> bool:
        return await self.doorbell.wait_for_work(names, timeout)

    # --- events and batch triggers (Triggers) ----------------------------------------

    async def emit(
        self, topic: str, payload: Any, *, now: float, key: str | None = None,
        owner: str | None = None,
    ) -> tuple[str, bool]:
        return await self.triggers.emit(topic, payload, now=now, key=key, owner=owner)

    async def take_batches(
        self, name: str, topic: str, *, max_size: int, max_wait: float, now: float,
        limit: int,
    ) -> list[RunHandle]:
        return await self.triggers.take_batches(
            name, topic, max_size=max_size, max_wait=max_wait, now=now, limit=limit
        )

    # --- projections (Projections) ---------------------------------------------------

    async def ended_infos(
        self, names: Sequence[str], *, after: tuple[float, str] | None, until: float,
        limit: int,
    ) -> list[RunInfo]:
        return await self.projections.ended_infos(names, after=after, until=until,
                                                  limit=limit)

    @staticmethod
    def ended_time(finished_at: float) -> float:
        """The end time by which ``ended_infos`` orders runs (``keys.ended_time``)."""
        return ended_time(finished_at)

    async def projection_head(self, name: str) -> ProjectionHead | None:
        return await self.projections.projection_head(name)

    async def projection_heads(self) -> list[ProjectionHead]:
        return await self.projections.projection_heads()

    async def projection_states(self, name: str, keys: Sequence[str] | None
                                ) -> dict[str, Any]:
        return await self.projections.projection_states(name, keys)

    async def save_projection(
        self, head: ProjectionHead, states: Mapping[str, Any], *, expected: int,
        reset: bool,
    ) -> bool:
        return await self.projections.save_projection(head, states, expected=expected,
                                                      reset=reset)

    async def reset_projection(self, name: str, *, now: float) -> bool:
        return await self.projections.reset_projection(name, now=now)

    # --- attempts -------------------------------------------------------------------

    async def append(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float, lock_ttl: float
    ) -> AppendResult:
        return await self.attempts.append(run_id, token, events, now=now, lock_ttl=lock_ttl)

    async def park(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float,
        wake_at: float | None, signals: Sequence[str], known_seq: int, interrupt: Any = None,
    ) -> ParkResult:
        parked = await self.attempts.park(run_id, token, events, now=now, wake_at=wake_at,
                                          signals=signals, known_seq=known_seq,
                                          interrupt=interrupt)
        await self._slot_freed(run_id, now)
        return parked

    async def finish(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float,
        status: RunStatus, result: Any = None, error: dict[str, Any] | None = None,
        successor_params: Any = None,
    ) -> FinishResult:
        finished = await self.attempts.finish(run_id, token, events, now=now, status=status,
                                              result=result, error=error,
                                              successor_params=successor_params)
        await self._slot_freed(run_id, now)
        return finished

    async def _slot_freed(self, run_id: str, now: float) -> None:
        """A run of a limited workflow stopped running: give back the slot it held at
        its name's home (a run of another shard), and ring its shard and the home, so that
        an idle worker admits the next run of its key now, not at its next poll. (A
        workflow without limits pays nothing: the check is local.)"""
        if self.limits.limited_run(run_id):
            await self.limits.done(run_id)
            await self.doorbell.ring_hash(run_id[:12], sorted({LIMITED_SHARD,
                                                               int(run_id[12:16], 16)}), now)

    async def requeue(
        self, run_id: str, token: int, *, now: float, reason: str,
        events: Sequence[Event] = (), crash: bool = False, poison: PoisonPolicy | None = None,
        crash_detail: Mapping[str, Any] | None = None,
    ) -> RequeueOutcome:
        outcome = await self.attempts.requeue(run_id, token, now=now, reason=reason,
                                              events=events, crash=crash, poison=poison,
                                              crash_detail=crash_detail)
        await self._slot_freed(run_id, now)
        return outcome

    async def renew(
        self, worker_id: str, held: Mapping[str, int], *, now: float, lock_ttl: float
    ) -> RenewResult:
        renewed = await self.attempts.renew(worker_id, held, now=now, lock_ttl=lock_ttl)
        self.limits.forget(renewed.lost)
        calls = self.limits.renew_calls([r for r in held if r not in renewed.lost],
                                        now + lock_ttl)
        if calls:  # runs of other shards holding slots at their names' homes
            raise_first(await self.connection.batch(calls))
        return renewed

    async def reclaim(
        self, names: Sequence[str] | None, *, now: float, limit: int, poison: PoisonPolicy,
    ) -> list[RequeueOutcome]:
        return await self.attempts.reclaim(names, now=now, limit=limit, poison=poison)

    async def reclaim_worker(
        self, worker_id: str, *, now: float, poison: PoisonPolicy,
        crash_detail: Mapping[str, Any] | None = None, charge: Collection[str] | None = None,
    ) -> list[RequeueOutcome]:
        return await self.attempts.reclaim_worker(worker_id, now=now, poison=poison,
                                                  crash_detail=crash_detail, charge=charge)

    async def requeue_unheld(
        self, worker_id: str, held: Collection[str], *, now: float
    ) -> list[RequeueOutcome]:
        return await self.attempts.requeue_unheld(worker_id, held, now=now)

    async def arecover_pending_runs(self, name: str) -> int:
        return await self.attempts.arecover_pending_runs(name)

    # --- run control ----------------------------------------------------------------

    async def signal(self, run_id: str, name: str, payload: Any, *, now: float) -> None:
        await self.control.signal(run_id, name, payload, now=now)

    async def nudge(self, run_id: str, *, now: float) -> None:
        await self.control.nudge(run_id, now=now)

    async def cancel(self, run_id: str, *, now: float) -> bool:
        return await self.control.cancel(run_id, now=now)

    async def wake_run(self, run_id: str, *, now: float) -> bool:
        return await self.control.wake_run(run_id, now=now)

    # --- reads ----------------------------------------------------------------------

    async def get_run(self, run_id: str) -> RunInfo | None:
        return await self.reads.get_run(run_id)

    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        return await self.reads.read_events(run_id, after_seq)

    async def list_runs(
        self, *, name: str | None = None, status: RunStatus | None = None,
        owner: str | None = None, limit: int = 100, before: tuple[float, str] | None = None,
    ) -> list[RunInfo]:
        return await self.reads.list_runs(name=name, status=status, owner=owner, limit=limit,
                                          before=before)

    async def wait_result(self, run_id: str, timeout: float | None) -> RunInfo:
        return await self.reads.wait_result(run_id, timeout)

    async def wait_outcome(self, run_id: str, timeout: float | None) -> RunOutcome:
        return await self.reads.wait_outcome(run_id, timeout)

    async def read_outcomes(self, run_ids: Sequence[str]) -> list[RunOutcome | None]:
        return await self.reads.read_outcomes(run_ids)

    async def ended_runs(
        self, *, after: tuple[float, str] | None, until: float, limit: int
    ) -> list[tuple[float, str]]:
        return await self.reads.ended_runs(after=after, until=until, limit=limit)

    async def expire_finished(self, run_ids: Sequence[str], ttl: float) -> None:
        await self.reads.expire_finished(run_ids, ttl)

    async def read_finished(
        self, run_ids: Sequence[str]
    ) -> dict[str, tuple[RunInfo, list[Event]]]:
        return await self.reads.read_finished(run_ids)

    async def queue_stats(self, names: Sequence[str]) -> dict[str, QueueStat]:
        return await self.reads.queue_stats(names)

    # --- shard leases and membership ------------------------------------------------

    def shards_held(self, worker_id: str) -> dict[str, int]:
        return self.leases.shards_held(worker_id)

    async def shard_lease_tick(
        self, *, worker_id: str, names: Sequence[str], now: float, options: Any
    ) -> None:
        await self.leases.shard_lease_tick(worker_id=worker_id, names=names, now=now,
                                           options=options)

    async def release_shards(self, worker_id: str) -> None:
        await self.leases.release_shards(worker_id)

    async def register_worker(
        self, worker_id: str, names: Sequence[str], *, now: float, ttl: float
    ) -> None:
        await self.leases.register_worker(worker_id, names, now=now, ttl=ttl)

    async def unregister_worker(self, worker_id: str) -> None:
        await self.leases.unregister_worker(worker_id)

    async def stranded(self, *, now: float) -> list[str]:
        return await self.leases.stranded(now=now)

    async def served_names(self) -> list[str]:
        return await self.leases.served_names()

    async def shard_map(self, *, now: float) -> dict[str, Any]:
        return await self.leases.shard_map(now=now)

    async def fail_stranded(
        self, name: str, *, older_than: float, now: float, limit: int, error: dict[str, Any]
    ) -> list[str]:
        return await self.leases.fail_stranded(name, older_than=older_than, now=now,
                                               limit=limit, error=error)

    # --- flow control ---------------------------------------------------------------

    async def aflow_control_set(
        self, owner: str, max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None:
        await self.flow.aflow_control_set(owner, max_concurrent, max_starts_per_second)

    async def aflow_control_get(self, owner: str) -> FlowControl | None:
        return await self.flow.aflow_control_get(owner)

    async def aflow_control_delete(self, owner: str) -> bool:
        return await self.flow.aflow_control_delete(owner)

    # --- schedules ------------------------------------------------------------------

    async def aschedule_create(
        self, schedule: Schedule, *, now: float | None = None
    ) -> Schedule:
        return await self.schedules.aschedule_create(schedule, now=now)

    async def aschedule_get(self, schedule_id: str) -> Schedule | None:
        return await self.schedules.aschedule_get(schedule_id)

    async def aschedule_list(self) -> list[Schedule]:
        return await self.schedules.aschedule_list()

    async def aschedule_delete(self, schedule_id: str) -> bool:
        return await self.schedules.aschedule_delete(schedule_id)

    async def schedules_due(
        self, names: Sequence[str], *, now: float, limit: int
    ) -> list[Schedule]:
        return await self.schedules.schedules_due(names, now=now, limit=limit)

    async def schedule_advance(
        self, schedule_id: str, *, expected_next_run_at: float | None,
        next_run_at: float | None, run_id: str | None = None, run_at: float | None = None,
    ) -> bool:
        return await self.schedules.schedule_advance(
            schedule_id, expected_next_run_at=expected_next_run_at, next_run_at=next_run_at,
            run_id=run_id, run_at=run_at)

    async def schedule_set_paused(
        self, schedule_id: str, paused: bool, *, next_run_at: float | None = None
    ) -> bool:
        return await self.schedules.schedule_set_paused(schedule_id, paused,
                                                        next_run_at=next_run_at)
