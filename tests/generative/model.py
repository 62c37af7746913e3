"""A small pure model of what the public API promises about runs, for the generative tests.

It knows five kinds of workflow (what each name does is drawn): ``echo`` returns its params
at once, ``gate`` waits for one signal (for up to its timeout, if it has one) and returns
its payload (None when the wait timed out), ``ask`` is a gate on ``ctx.interrupt`` (its
payload the run's params) that ``client.resume`` answers, ``nap`` sleeps its params' seconds on the
test's clock, ``hold`` runs until the test releases it (a run that stays ``running``, so
it can be cancelled or cut off by a worker's stop). Given which names the
live workers serve, ``settle`` moves every run as far as the system must move it by itself;
``expected`` then says the status and result a quiescent store shows.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from pyrula.workflows import RunStatus
from pyrula.workflows.events import INTERRUPT_SIGNAL

KINDS = ("echo", "gate", "ask", "nap", "hold")


@dataclass(frozen=True)
class Kind:
    """What the workflow called ``name`` does; a gate waits for ``signal``, for at most
    ``timeout`` seconds if it is not None."""

    name: str
    behaviour: str
    signal: str = "go"
    timeout: int | None = None

    @property
    def awaits(self) -> str | None:
        """The signal the run waits for, if it waits for one."""
        if self.behaviour == "gate":
            return self.signal
        return INTERRUPT_SIGNAL if self.behaviour == "ask" else None


@dataclass
class ModelRun:
    run_id: str
    kind: Kind
    params: Any
    owner: str | None
    idempotency_key: str | None
    created_at: float
    #: Whether an attempt has run the workflow's code (then a nap has its timer).
    started: bool = False
    #: The first payload sent under the gate's signal name before its wait timed out,
    #: boxed (a payload may be None).
    signal: tuple[Any] | None = None
    #: When a nap's timer, or a gate's timeout, falls due.
    wake_at: float | None = None
    #: A gate's timeout fired (a worker's timer loop saw it due) before any signal came.
    fired: bool = False
    #: A nap's sleep is over: its timer fell due while a worker ran (which fires it, whatever
    #: it serves), or ``client.wake`` woke it. It stays queued until a worker serves it.
    woken: bool = False
    released: bool = False
    ended: RunStatus | None = None
    #: How many signals (of any name; resumes apart) were delivered to it.
    signals: int = 0
    resumes: int = 0

    @property
    def result(self) -> Any:
        behaviour = self.kind.behaviour
        if behaviour == "echo":
            return {"params": self.params}
        if behaviour in ("gate", "ask"):
            return {"signal": self.signal[0] if self.signal else None}
        if behaviour == "nap":
            return {"slept": self.params["seconds"]}
        return {"released": self.params["key"]}


@dataclass
class Model:
    """Runs by id, what idempotency keys map to, and the time on the test's clock."""

    now: float
    runs: dict[str, ModelRun] = field(default_factory=dict)
    keys: dict[tuple[str, str], str] = field(default_factory=dict)

    def known(self, name: str, idempotency_key: str | None) -> str | None:
        """The run a submit with this key returns instead of a new one, if any."""
        if idempotency_key is None:
            return None
        return self.keys.get((name, idempotency_key))

    def submitted(self, run: ModelRun) -> None:
        if run.params is None:  # a submit without params gives the run {}
            run.params = {}
        self.runs[run.run_id] = run
        if run.idempotency_key is not None:
            self.keys[(run.kind.name, run.idempotency_key)] = run.run_id

    def signal(self, run_id: str, name: str, payload: Any) -> bool:
        """Whether the store accepts the signal (it refuses one for an ended run)."""
        run = self.runs[run_id]
        if run.ended is not None:
            return False
        if name == INTERRUPT_SIGNAL:
            run.resumes += 1
        else:
            run.signals += 1
        if name == run.kind.awaits and run.signal is None and not run.fired:
            run.signal = (payload,)
        return True

    def cancel(self, run_id: str) -> bool:
        """Whether the cancel found the run active. A running run ends once its worker hears."""
        run = self.runs[run_id]
        if run.ended is not None:
            return False
        run.ended = RunStatus.CANCELLED
        return True

    def wake(self, run_id: str, served: Collection[str]) -> bool:
        """Whether ``client.wake`` finds the run sleeping (then its sleep is over)."""
        run = self.runs[run_id]
        if self.expected(run, served) is not RunStatus.SLEEPING:
            return False
        run.woken = True
        return True

    def release(self, key: str) -> None:
        for run in self.runs.values():
            if run.kind.behaviour == "hold" and run.params["key"] == key:
                run.released = True

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def running_holds(self, served: Collection[str]) -> list[ModelRun]:
        return [r for r in self.runs.values() if r.ended is None and r.kind.name in served
                and r.kind.behaviour == "hold" and not r.released]

    def settle(self, served: Collection[str], any_worker: bool) -> None:
        """Move every run as the live workers (serving ``served``) must, until it stops."""
        for run in self.runs.values():
            if run.ended is not None:
                continue
            serving = run.kind.name in served
            if serving and not run.started:
                run.started = True
                seconds = (run.params["seconds"] if run.kind.behaviour == "nap"
                           else run.kind.timeout if run.kind.behaviour == "gate" else None)
                run.wake_at = None if seconds is None else self.now + seconds
            # Any worker's timer loop fires a due timer, whatever names it serves.
            due = (run.started and run.wake_at is not None and run.wake_at <= self.now
                   and (serving or any_worker))
            if due and run.kind.behaviour == "nap":
                run.woken = True
            if due and run.kind.behaviour == "gate" and run.signal is None:
                run.fired = True
            if serving and self._done(run):
                run.ended = RunStatus.COMPLETED

    @staticmethod
    def _done(run: ModelRun) -> bool:
        behaviour = run.kind.behaviour
        return (behaviour == "echo"
                or (behaviour in ("gate", "ask") and (run.signal or run.fired))
                or (behaviour == "nap" and run.woken)
                or (behaviour == "hold" and run.released))

    def expected(self, run: ModelRun, served: Collection[str]) -> RunStatus:
        """The status a quiescent store shows for ``run`` (after ``settle``)."""
        if run.ended is not None:
            return run.ended
        behaviour = run.kind.behaviour
        served_now = run.kind.name in served
        if behaviour == "hold":
            return RunStatus.RUNNING if served_now else RunStatus.QUEUED
        if not run.started:
            return RunStatus.QUEUED
        if behaviour in ("gate", "ask"):
            return RunStatus.QUEUED if run.signal or run.fired else RunStatus.WAITING
        if behaviour == "nap":
            return RunStatus.QUEUED if run.woken else RunStatus.SLEEPING
        raise AssertionError(f"an echo run cannot be left {run}")
