"""What a store can do beyond the core protocol, each ability a named Protocol.

The worker (and the supervisor, the clock, the archiver) never looks an ability up by
name: :func:`capabilities_of` resolves them once, when the worker starts, into a
:class:`Capabilities` record whose fields are None where the store lacks the ability.
A store that composes another (the archiving store over its live store) declares what it
offers by defining ``capabilities()`` itself (:class:`Composed`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pyrula.workflows.events import Event
    from pyrula.workflows.limits import LimitKeys, WorkflowLimits
    from pyrula.workflows.records import RunHandle, RunInfo, RunOutcome


@runtime_checkable
class Preparing(Protocol):
    """Server-side checks before the first claim (eviction policy, shard count, schema)."""

    async def prepare(self, names: Sequence[str]) -> None: ...


@runtime_checkable
class Doorbell(Protocol):
    """A store that can wake an idle claim loop when work arrives (no poll interval)."""

    async def wait_for_work(self, names: Sequence[str], timeout: float) -> bool:
        """Block until something rings (or ``timeout``); True if it rang."""
        ...


@runtime_checkable
class TimerIndex(Protocol):
    """A store that knows when its next timer falls due (the timer loop sleeps till then)."""

    def next_wake_at(self) -> float | None: ...


@runtime_checkable
class ShardLeases(Protocol):
    """A sharded store whose workers lease shards to claim from."""

    async def shard_lease_tick(
        self, *, worker_id: str, names: Sequence[str], now: float, options: Any
    ) -> None: ...

    def shards_held(self, worker_id: str) -> dict[str, int]: ...

    async def release_shards(self, worker_id: str) -> None: ...


@runtime_checkable
class Reconciling(Protocol):
    """A store with a periodic catch-up job the worker runs (the archive's reconcile)."""

    async def reconcile_tick(
        self, *, worker_id: str, names: Sequence[str], now: float, options: Any = None
    ) -> float | None: ...

    def reconcile_lag(self, now: float) -> float | None:
        """How far behind (seconds) the job is; None where this process cannot tell."""
        ...


@runtime_checkable
class ServerClock(Protocol):
    """A store with a clock of its own, which workers follow instead of the host's."""

    async def server_time(self) -> float: ...


@runtime_checkable
class ArchiveSource(Protocol):
    """What an ArchivingStore asks of its live store besides the core protocol (a live
    store without it is archived only as its runs end)."""

    async def ended_runs(
        self, *, after: tuple[float, str] | None, until: float, limit: int
    ) -> list[tuple[float, str]]:
        """(finished_at, run_id) of ended runs with (finished_at, run_id) > ``after`` (None:
        from the start) and finished_at <= ``until``, oldest first, at most ``limit``."""
        ...

    async def expire_finished(self, run_ids: Sequence[str], ttl: float) -> None:
        """Let these ended runs' live copies expire within ``ttl`` seconds; never lengthens
        a TTL, never touches a run still in flight or one that continued as new (a chain's
        earlier runs keep the store's own retention). A no-op on stores without TTLs."""
        ...


@runtime_checkable
class FinishedReader(Protocol):
    """Ended runs' records and journals in one round trip (the archiver's batch read)."""

    async def read_finished(
        self, run_ids: Sequence[str]
    ) -> Mapping[str, tuple[RunInfo, list[Event]]]: ...


@runtime_checkable
class OutcomeReader(Protocol):
    """A store that can wait for a run's end reading only what says how it ended (its
    status, result, error and successor) rather than its whole record: what every
    ``client.result()`` needs, once per run a caller waits for; and read that of several
    runs at once (a synchronous client's read-ahead, ``pyrula.workflows.readahead``)."""

    async def wait_outcome(self, run_id: str, timeout: float | None) -> RunOutcome:
        """``wait_result``'s answer cut to a :class:`RunOutcome`; the same errors."""
        ...

    async def read_outcomes(self, run_ids: Sequence[str]) -> list[RunOutcome | None]:
        """The outcomes of several runs as they stand now, in one round trip, without
        waiting for any; None for a run this store does not hold."""
        ...


@dataclass(frozen=True, slots=True)
class QueueStat:
    """The queue of one workflow name at one moment: what an autoscaler scales on."""

    #: Runs queued and claimable now (flow control's held-back runs included; runs parked
    #: on a timer or a signal are not in the queue).
    depth: int
    #: When the longest-waiting of them became claimable (submitted, requeued or woken),
    #: epoch seconds of the store's clock; None when ``depth`` is 0.
    oldest_at: float | None


@runtime_checkable
class QueueStats(Protocol):
    """A store that can tell how deep each workflow's queue is and how long it has waited
    (the queue depth and oldest-age gauges)."""

    async def queue_stats(self, names: Sequence[str]) -> dict[str, QueueStat]:
        """Depth and oldest claimable time of the queue of each name (every name asked
        for is in the answer; depth 0 where nothing is queued)."""
        ...


@runtime_checkable
class ShardMap(Protocol):
    """A sharded store that can tell which live worker leases which shard of each name,
    across every host that shares it (the dashboard's shard map)."""

    async def shard_map(self, *, now: float) -> dict[str, Any]:
        """``{"workers": [{"worker_id", "names", "expires"}], "names": {name: {"shards":
        count, "held": {worker_id: [shard, ...]}, "unleased": count}}}``: the live workers
        as the store's membership records them and each name's current leases."""
        ...


@runtime_checkable
class Triggers(Protocol):
    """A store that keeps events and starts batch runs from them (``BatchTrigger``).

    Each workflow triggered by a topic is a subscription of it with events pending for it:
    the first subscription of a topic finds every event emitted to it so far pending;
    one made while the topic has another finds those emitted from then on. Every
    subscription gets every event emitted after it was made (two workflows triggered by
    one topic each get each event)."""

    async def emit(
        self, topic: str, payload: Any, *, now: float, key: str | None = None,
        owner: str | None = None,
    ) -> tuple[str, bool]:
        """Record one event on ``topic`` emitted at ``now``; return (its id, created).

        Atomic with the key check: a second emit with the same ``(topic, key)`` returns
        the first event's id and ``created`` False (the key is remembered while its event
        is kept)."""
        ...

    async def take_batches(
        self, name: str, topic: str, *, max_size: int, max_wait: float, now: float,
        limit: int,
    ) -> list[RunHandle]:
        """Start up to ``limit`` runs of workflow ``name``, one per due batch of the
        events of ``topic`` pending for it (subscribing it first if it is not yet): a
        batch is due when ``max_size`` events of one owner are pending, or the oldest has
        waited ``max_wait``; it holds that owner's oldest pending events, at most
        ``max_size``, in emit order, and its run has their owner.

        Taking one batch's events and queueing its run is one atomic step: an event is
        in exactly one run of ``name``, whatever fails or races. The run's params are
        ``{"topic", "events": [{"id", "key", "payload", "emitted_at"}]}``
        (``triggers.batch_params``), its idempotency key ``triggers.batch_key``. Owners are
        served in the order their oldest pending event was emitted (ties by owner), each
        while it has a due batch. Returns the runs started, in that order."""
        ...


@dataclass(frozen=True, slots=True)
class ProjectionHead:
    """What a store keeps of one projection besides its states.

    ``version`` grows by one with every write (a fold's save or a rebuild) and never goes
    back, so a compare-and-set on it cannot be fooled by a rebuild in between (0: never
    written). ``checkpoint`` is the (finished_at, run_id) of the last run folded (None:
    none yet); ``fingerprint`` the code the states were folded by ('' after a rebuild)."""

    name: str
    version: int
    fingerprint: str
    keyed: bool
    checkpoint: tuple[float, str] | None
    folded: int
    updated_at: float


@runtime_checkable
class Projections(Protocol):
    """A store that keeps projections (``@projection``): per projection a head
    (ProjectionHead) and one JSON state per key, and that lists the ended runs to fold."""

    async def ended_infos(
        self, names: Sequence[str], *, after: tuple[float, str] | None, until: float,
        limit: int,
    ) -> list[RunInfo]:
        """The ended runs of the workflows ``names`` with (finished_at, run_id) > ``after``
        (None: from the first) and finished_at <= ``until``, in that order, at most
        ``limit`` (the runs the store still keeps)."""
        ...

    async def projection_head(self, name: str) -> ProjectionHead | None:
        """The head of projection ``name``; None if it was never written."""
        ...

    async def projection_heads(self) -> list[ProjectionHead]:
        """Every projection's head, by name."""
        ...

    async def projection_states(self, name: str, keys: Sequence[str] | None
                                ) -> dict[str, Any]:
        """The states of ``keys`` that exist (None: of every key)."""
        ...

    async def save_projection(
        self, head: ProjectionHead, states: Mapping[str, Any], *, expected: int,
        reset: bool,
    ) -> bool:
        """Write ``states`` (over those keys' states; every other key dropped first if
        ``reset``) and ``head`` with version ``expected + 1``, only if the stored version
        is ``expected``: one atomic step; False (nothing written) if it is not."""
        ...

    async def reset_projection(self, name: str, *, now: float) -> bool:
        """Drop the states, the checkpoint and the fingerprint of ``name`` and bump its
        version (one atomic step): workers fold it again from the first run. False if it
        was never written."""
        ...


@runtime_checkable
class KeyedLimits(Protocol):
    """A store that enforces per-key concurrency limits and start rates
    (``pyrula.workflows.limits``) in its claim's atomic step. Its ``submit`` takes
    ``limit_keys=`` (a ``LimitKeys``), kept with the run; its claims return each run's
    ``ClaimedRun.limit_keys``. A worker serving a limited workflow refuses to start on a
    store without this ability."""

    def use_limits(self, limits: Mapping[str, WorkflowLimits]) -> None:
        """Enforce these limits (workflow name -> limits) in this process's claims."""
        ...

    async def assign_limit_keys(
        self, run_id: str, token: int, keys: LimitKeys, *, now: float
    ) -> bool:
        """Record the keys of a run claimed without them (attempt ``token``); True if its
        limits let it run, else it is queued back in its key's line (``run:requeued``
        reason ``limit``) and False. Atomic, fenced."""
        ...


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The optional abilities of one store, resolved once (None: the store lacks it)."""

    prepare: Preparing | None = None
    doorbell: Doorbell | None = None
    timers: TimerIndex | None = None
    shard_leases: ShardLeases | None = None
    reconcile: Reconciling | None = None
    server_clock: ServerClock | None = None
    archive_source: ArchiveSource | None = None
    finished_reader: FinishedReader | None = None
    queue_stats: QueueStats | None = None
    shard_map: ShardMap | None = None
    triggers: Triggers | None = None
    projections: Projections | None = None
    limits: KeyedLimits | None = None
    outcomes: OutcomeReader | None = None


@runtime_checkable
class Composed(Protocol):
    """A store built over another that says itself which abilities it offers."""

    def capabilities(self) -> Capabilities: ...


def capabilities_of(store: object) -> Capabilities:
    """Resolve ``store``'s optional abilities into one record."""
    if isinstance(store, Composed):
        return store.capabilities()
    return Capabilities(
        prepare=store if isinstance(store, Preparing) else None,
        doorbell=store if isinstance(store, Doorbell) else None,
        timers=store if isinstance(store, TimerIndex) else None,
        shard_leases=store if isinstance(store, ShardLeases) else None,
        reconcile=store if isinstance(store, Reconciling) else None,
        server_clock=store if isinstance(store, ServerClock) else None,
        archive_source=store if isinstance(store, ArchiveSource) else None,
        finished_reader=store if isinstance(store, FinishedReader) else None,
        queue_stats=store if isinstance(store, QueueStats) else None,
        shard_map=store if isinstance(store, ShardMap) else None,
        triggers=store if isinstance(store, Triggers) else None,
        projections=store if isinstance(store, Projections) else None,
        limits=store if isinstance(store, KeyedLimits) else None,
        outcomes=store if isinstance(store, OutcomeReader) else None,
    )
