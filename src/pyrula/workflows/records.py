"""Records shared by the client, the engine and every store: handles, run info, statuses."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, NamedTuple

from pyrula.config.defaults import DEFAULT_POISON_MAX_RETRIES, DEFAULT_POISON_RETRY_TTL_S
from pyrula.workflows.errors import JournalCorrupt
from pyrula.workflows.events import Event, EventType, make_event, parent_of_key
from pyrula.workflows.limits import LimitKeys


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SLEEPING = "sleeping"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CONTINUED = "continued"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.CONTINUED}
)


@dataclass(frozen=True, slots=True)
class RunError:
    """Why a run failed: built once wherever a run fails, stored as :meth:`as_dict` (the
    ``RunInfo.error`` shape) and journaled as the ``run:error`` event (:meth:`event`).

    ``code`` is the machine-readable cause (``step_failed``, ``workflow_error``,
    ``timeout``, ``serialization``, ``non_determinism``, ``max_retries``, ``stranded``,
    ``corrupt_journal``, ``cancelled``...); ``error_type`` the exception's class name.
    """

    code: str
    error_type: str
    message: str
    detail: Mapping[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "error_type": self.error_type,
            "message": self.message,
            "detail": None if self.detail is None else dict(self.detail),
        }

    def event(self, now: float) -> Event:
        """The ``run:error`` event that journals this error."""
        return make_event(
            EventType.RUN_ERROR, now, code=self.code, error_type=self.error_type,
            message=self.message, detail=None if self.detail is None else dict(self.detail),
        )

    @classmethod
    def from_dict(cls, error: Mapping[str, Any]) -> RunError:
        detail = error.get("detail")
        return cls(str(error.get("code") or "unknown"), str(error.get("error_type") or ""),
                   str(error.get("message") or ""), dict(detail) if detail else detail)


@dataclass(frozen=True, slots=True)
class RunHandle:
    """What ``submit`` returns: the workflow name and the run id."""

    name: str
    run_id: str


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run as the store knows it now.

    ``error`` is None or a dict with at least ``code``, ``error_type`` and ``message``.
    ``waiting_for`` names the signals a waiting run awaits (``pyrula.interrupt`` for an
    interrupt, whose payload is ``interrupt``). ``start_id`` is the first run of a
    ``continue_as_new`` chain; ``successor_id`` the run that continued this one.
    ``parent_id`` is the run that started this one as a child workflow (read from its
    idempotency key, which a parent gives every child it starts).
    ``priority`` (0..9) orders the run among its owner's queued runs: higher first.
    """

    run_id: str
    name: str
    status: RunStatus
    attempt: int
    params: Any
    owner: str | None
    created_at: float
    updated_at: float
    started_at: float | None = None
    finished_at: float | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    wake_at: float | None = None
    waiting_for: tuple[str, ...] = ()
    interrupt: Any = None
    idempotency_key: str | None = None
    start_id: str | None = None
    successor_id: str | None = None
    priority: int = 0

    @property
    def parent_id(self) -> str | None:
        """The run that started this one as a child (``ctx.start_child``), if one did."""
        return parent_of_key(self.idempotency_key)


class RunOutcome(NamedTuple):
    """What a wait for a run's result needs of its record, and no more: its status and,
    once it has ended, its result, its error or the run that continued it (the fields of
    those names of :class:`RunInfo`)."""

    status: RunStatus
    result: Any = None
    error: dict[str, Any] | None = None
    successor_id: str | None = None

    @classmethod
    def of(cls, info: RunInfo) -> RunOutcome:
        return cls(info.status, info.result, info.error, info.successor_id)


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """A run a worker has just claimed: ``token`` is the attempt number, its fencing token.

    ``journal`` holds the events after ``base_seq``, up to and including this attempt's
    ``run:started``. ``base_seq`` is where the run last parked (0 for a run that never
    did), so a worker that cached the journal when it parked the run reads only what is
    new; any other reader fetches events 1..base_seq by offset.

    ``crashes`` are the times of the crashes counted against the run, as the store keeps
    them (older ones than ``poison_retry_ttl_s`` no longer count but may still be listed).

    ``suspect`` is set for a *suspect*: a run with a crash counted against it that has not
    completed an attempt since (parked or ended). The store queues a suspect apart, an
    ordinary ``claim`` never returns one, and its worker runs it alone (``claim_suspect``).

    ``journal_error`` is set (and ``journal`` empty) when what the store holds for the run
    is not a journal pyrula wrote: the claimer fails the run instead of executing it.
    """

    run_id: str
    name: str
    params: Any
    owner: str | None
    token: int
    journal: list[Event]
    base_seq: int
    start_id: str
    created_at: float
    crashes: tuple[float, ...] = ()
    journal_error: JournalCorrupt | None = None
    suspect: bool = False
    #: Its concurrency and rate keys as the store keeps them; None while not computed
    #: (a run submitted by a process without its workflow's definition, on a store that
    #: enforces limits: its worker computes them and calls ``assign_limit_keys``).
    limit_keys: LimitKeys | None = None


@dataclass(frozen=True, slots=True, order=True)
class SuspectsAt:
    """Where put-aside suspects wait: a workflow name, and on a sharded store its shard."""

    name: str
    shard: int = 0


class Claimed(list[ClaimedRun]):
    """What an ordinary claim took (the list), and ``suspects``: where it saw suspects
    waiting that it passed over (empty if none), for ``claim_suspect``."""

    def __init__(self, runs: Iterable[ClaimedRun] = (),
                 suspects: Iterable[SuspectsAt] = ()) -> None:
        super().__init__(runs)
        self.suspects: tuple[SuspectsAt, ...] = tuple(sorted(set(suspects)))


@dataclass(frozen=True, slots=True)
class AppendResult:
    last_seq: int
    cancel_requested: bool = False


@dataclass(frozen=True, slots=True)
class FinishResult:
    last_seq: int
    successor_id: str | None = None


@dataclass(frozen=True, slots=True)
class ParkResult:
    """``parked`` False means the run keeps its lock: a signal it awaits had already arrived
    (``events`` holds the journal after ``known_seq``) or a cancel was requested."""

    parked: bool
    last_seq: int
    events: list[Event] = field(default_factory=list)
    cancel_requested: bool = False


@dataclass(frozen=True, slots=True)
class RenewResult:
    """Runs whose lock this worker no longer holds, and runs a client asked to cancel."""

    lost: frozenset[str] = frozenset()
    cancel_requested: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class PoisonPolicy:
    """How many crashes a run may cause within ``retry_ttl_s`` and still be retried."""

    max_retries: int = DEFAULT_POISON_MAX_RETRIES
    retry_ttl_s: float = DEFAULT_POISON_RETRY_TTL_S


@dataclass(frozen=True, slots=True)
class RequeueOutcome:
    run_id: str
    quarantined: bool


@dataclass(frozen=True, slots=True)
class FlowControl:
    owner: str
    max_concurrent: int | None = None
    max_starts_per_second: float | None = None


# --- built for every run -----------------------------------------------------------
#
# A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``, which
# makes a ``RunInfo`` (19 fields) cost ~2.5 us to build where a plain class's costs ~0.6.
# A client builds one for every result it reads, a worker a ``ClaimedRun`` for every run
# it claims: these build the same frozen instances, each field set through its slot.


def _slot_setters(cls: type) -> tuple[Callable[[Any, Any], None], ...]:
    return tuple(vars(cls)[f.name].__set__ for f in fields(cls))


(_ri_run_id, _ri_name, _ri_status, _ri_attempt, _ri_params, _ri_owner, _ri_created_at,
 _ri_updated_at, _ri_started_at, _ri_finished_at, _ri_result, _ri_error, _ri_wake_at,
 _ri_waiting_for, _ri_interrupt, _ri_idempotency_key, _ri_start_id, _ri_successor_id,
 _ri_priority) = _slot_setters(RunInfo)
(_cr_run_id, _cr_name, _cr_params, _cr_owner, _cr_token, _cr_journal, _cr_base_seq,
 _cr_start_id, _cr_created_at, _cr_crashes, _cr_journal_error, _cr_suspect,
 _cr_limit_keys) = _slot_setters(ClaimedRun)
_new = object.__new__


def build_run_info(run_id: str, name: str, status: RunStatus, attempt: int, params: Any,
                   owner: str | None, created_at: float, updated_at: float,
                   started_at: float | None, finished_at: float | None, result: Any,
                   error: dict[str, Any] | None, wake_at: float | None,
                   waiting_for: tuple[str, ...], interrupt: Any, idempotency_key: str | None,
                   start_id: str | None, successor_id: str | None, priority: int) -> RunInfo:
    """``RunInfo(...)`` with every field given, faster."""
    info: RunInfo = _new(RunInfo)
    _ri_run_id(info, run_id)
    _ri_name(info, name)
    _ri_status(info, status)
    _ri_attempt(info, attempt)
    _ri_params(info, params)
    _ri_owner(info, owner)
    _ri_created_at(info, created_at)
    _ri_updated_at(info, updated_at)
    _ri_started_at(info, started_at)
    _ri_finished_at(info, finished_at)
    _ri_result(info, result)
    _ri_error(info, error)
    _ri_wake_at(info, wake_at)
    _ri_waiting_for(info, waiting_for)
    _ri_interrupt(info, interrupt)
    _ri_idempotency_key(info, idempotency_key)
    _ri_start_id(info, start_id)
    _ri_successor_id(info, successor_id)
    _ri_priority(info, priority)
    return info


def build_claimed_run(run_id: str, name: str, params: Any, owner: str | None, token: int,
                      journal: list[Event], base_seq: int, start_id: str, created_at: float,
                      crashes: tuple[float, ...] = (),
                      journal_error: JournalCorrupt | None = None, suspect: bool = False,
                      limit_keys: LimitKeys | None = None) -> ClaimedRun:
    """``ClaimedRun(...)``, faster."""
    run: ClaimedRun = _new(ClaimedRun)
    _cr_run_id(run, run_id)
    _cr_name(run, name)
    _cr_params(run, params)
    _cr_owner(run, owner)
    _cr_token(run, token)
    _cr_journal(run, journal)
    _cr_base_seq(run, base_seq)
    _cr_start_id(run, start_id)
    _cr_created_at(run, created_at)
    _cr_crashes(run, crashes)
    _cr_journal_error(run, journal_error)
    _cr_suspect(run, suspect)
    _cr_limit_keys(run, limit_keys)
    return run
