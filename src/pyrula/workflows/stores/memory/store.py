"""MemoryStore: the reference implementation of the Store protocol, in one process.

Every call runs under one lock, so each is atomic and the store may be shared between an
event loop and other threads. Its behaviour is the specification the other backends are
tested against (the conformance suite).

The store is a facade over one component per concern, all holding the one
:class:`~pyrula.workflows.stores.memory.state.MemoryState`: each public method below is the
component's own method (see :class:`_Via`), so its signature is written once, where it is
implemented.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from pyrula.workflows.stores.admin import SyncAdmin
from pyrula.workflows.stores.memory.attempts import MemoryAttempts
from pyrula.workflows.stores.memory.control import MemoryControl
from pyrula.workflows.stores.memory.flow import MemoryFlowControl
from pyrula.workflows.stores.memory.limits import MemoryLimits
from pyrula.workflows.stores.memory.membership import MemoryMembership
from pyrula.workflows.stores.memory.projections import MemoryProjections
from pyrula.workflows.stores.memory.queue import MemoryQueue
from pyrula.workflows.stores.memory.reads import MemoryReads
from pyrula.workflows.stores.memory.schedules import MemorySchedules
from pyrula.workflows.stores.memory.state import MemoryState
from pyrula.workflows.stores.memory.triggers import MemoryTriggers

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C")


class _Via(Generic[C, P, R]):
    """A store method that is ``method`` of the component in attribute ``part``.

    Read on a store it is that component's bound method (its signature, its docstring);
    a class attribute, so a subclass may override it and a test may patch one store's.
    """

    def __init__(self, part: str, method: Callable[Concatenate[C, P], R]) -> None:
        self._part = part
        self._name = method.__name__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        if name != self._name:
            raise TypeError(f"{owner.__name__}.{name} would answer with {self._name}")

    @overload
    def __get__(self, store: None, owner: type[Any] | None = None) -> _Via[C, P, R]: ...

    @overload
    def __get__(self, store: object, owner: type[Any] | None = None) -> Callable[P, R]: ...

    def __get__(
        self, store: object | None, owner: type[Any] | None = None
    ) -> _Via[C, P, R] | Callable[P, R]:
        if store is None:
            return self
        method: Callable[P, R] = getattr(getattr(store, self._part), self._name)
        return method


class MemoryStore(SyncAdmin):
    """An in-process store for development and tests. Nothing survives the process."""

    #: Every operation runs under a threading lock and never awaits (``wait_result`` under
    #: ``SYNC_DRIVE`` blocks the calling thread on a condition instead), so synchronous
    #: callers (the admin twins, ``SyncWorkflowClient``) run it on their own thread.
    sync_driven = True

    def __init__(self) -> None:
        self._state = MemoryState()
        self._flow = MemoryFlowControl(self._state)
        self._limits = MemoryLimits(self._state)
        self._queue = MemoryQueue(self._state, self._flow, self._limits)
        self._attempts = MemoryAttempts(self._state)
        self._control = MemoryControl(self._state)
        self._reads = MemoryReads(self._state)
        self._membership = MemoryMembership(self._state)
        self._schedules = MemorySchedules(self._state)
        self._triggers = MemoryTriggers(self._state)
        self._projections = MemoryProjections(self._state)
        self._binding: tuple[str | None, str | None] = (None, None)

    # the work queue
    submit = _Via("_queue", MemoryQueue.submit)
    claim = _Via("_queue", MemoryQueue.claim)
    claim_suspect = _Via("_queue", MemoryQueue.claim_suspect)
    claim_run = _Via("_queue", MemoryQueue.claim_run)
    wake_due = _Via("_queue", MemoryQueue.wake_due)
    queue_stats = _Via("_queue", MemoryQueue.queue_stats)

    # per-key concurrency limits and rates (KeyedLimits)
    use_limits = _Via("_limits", MemoryLimits.use_limits)
    assign_limit_keys = _Via("_limits", MemoryLimits.assign_limit_keys)

    # an attempt's writes, and requeues of attempts nobody holds
    append = _Via("_attempts", MemoryAttempts.append)
    park = _Via("_attempts", MemoryAttempts.park)
    finish = _Via("_attempts", MemoryAttempts.finish)
    requeue = _Via("_attempts", MemoryAttempts.requeue)
    renew = _Via("_attempts", MemoryAttempts.renew)
    reclaim = _Via("_attempts", MemoryAttempts.reclaim)
    reclaim_worker = _Via("_attempts", MemoryAttempts.reclaim_worker)
    requeue_unheld = _Via("_attempts", MemoryAttempts.requeue_unheld)
    arecover_pending_runs = _Via("_attempts", MemoryAttempts.arecover_pending_runs)

    # run control
    signal = _Via("_control", MemoryControl.signal)
    nudge = _Via("_control", MemoryControl.nudge)
    cancel = _Via("_control", MemoryControl.cancel)
    wake_run = _Via("_control", MemoryControl.wake_run)

    # reads, and the archiver's (ArchiveSource)
    get_run = _Via("_reads", MemoryReads.get_run)
    read_events = _Via("_reads", MemoryReads.read_events)
    list_runs = _Via("_reads", MemoryReads.list_runs)
    wait_result = _Via("_reads", MemoryReads.wait_result)
    ended_runs = _Via("_reads", MemoryReads.ended_runs)
    expire_finished = _Via("_reads", MemoryReads.expire_finished)

    # membership
    register_worker = _Via("_membership", MemoryMembership.register_worker)
    unregister_worker = _Via("_membership", MemoryMembership.unregister_worker)
    served_names = _Via("_membership", MemoryMembership.served_names)
    stranded = _Via("_membership", MemoryMembership.stranded)
    fail_stranded = _Via("_membership", MemoryMembership.fail_stranded)

    # flow control
    aflow_control_set = _Via("_flow", MemoryFlowControl.aflow_control_set)
    aflow_control_get = _Via("_flow", MemoryFlowControl.aflow_control_get)
    aflow_control_delete = _Via("_flow", MemoryFlowControl.aflow_control_delete)

    # schedules
    aschedule_create = _Via("_schedules", MemorySchedules.aschedule_create)
    aschedule_get = _Via("_schedules", MemorySchedules.aschedule_get)
    aschedule_list = _Via("_schedules", MemorySchedules.aschedule_list)
    aschedule_delete = _Via("_schedules", MemorySchedules.aschedule_delete)
    schedules_due = _Via("_schedules", MemorySchedules.schedules_due)
    schedule_advance = _Via("_schedules", MemorySchedules.schedule_advance)
    schedule_set_paused = _Via("_schedules", MemorySchedules.schedule_set_paused)

    # events and batch triggers (Triggers)
    emit = _Via("_triggers", MemoryTriggers.emit)
    take_batches = _Via("_triggers", MemoryTriggers.take_batches)

    # projections (Projections)
    ended_infos = _Via("_projections", MemoryProjections.ended_infos)
    projection_head = _Via("_projections", MemoryProjections.projection_head)
    projection_heads = _Via("_projections", MemoryProjections.projection_heads)
    projection_states = _Via("_projections", MemoryProjections.projection_states)
    save_projection = _Via("_projections", MemoryProjections.save_projection)
    reset_projection = _Via("_projections", MemoryProjections.reset_projection)

    # lifecycle

    async def bind(
        self, project: str | None, environment: str | None
    ) -> tuple[str | None, str | None]:
        with self._state.lock:
            if self._binding[0] is None:
                self._binding = (project, self._binding[1])
            if self._binding[1] is None:
                self._binding = (self._binding[0], environment)
            return self._binding

    async def aping(self) -> None:
        return None

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"MemoryStore(runs={len(self._state.runs)})"
