"""Submits, signals, resumes, cancels, wakes, releases, listings, time passing and workers
coming and going, in any order Hypothesis chooses, checked against a small model after
every step, on every store.

What is drawn: the workflow names, how many there are and what each does (``model.KINDS``),
the signal a gate waits for and its timeout, the shard count, owners, idempotency keys
(from a small pool, so they repeat), params, payloads and resume values, which names each
worker serves and in what order (at most two workers at a time, each through the test's
store object or one of its own on the same store, as another process would open it), and
the order of everything. After every step the system must come to rest where the model
says: each run's status, result, owner and params, what a waiting run waits for and when a
sleeping one wakes; no run held by two workers, a running run held by one; each journal
whole (seq 1..n, one ``run:submitted`` first, a terminal event last and once, every signal
and resume in it once) and read the same from an offset; listings filtered and paged as
the model says.

Time passes only while no run is running: the test's clock jumps, and a lock held across a
jump would look lapsed to the next worker that starts.

``PYRULA_FUZZ_EXAMPLES`` and ``PYRULA_FUZZ_STEPS`` raise the counts (``make fuzz``); with
``CI=true`` the examples are derandomized, so CI sees the same ones every time.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from pyrula.errors import RunCancelled, RunNotActive
from pyrula.workflows import RunStatus
from pyrula.workflows.events import INTERRUPT_SIGNAL
from tests.generative.harness import BOUND, Harness, check_journal
from tests.generative.model import KINDS, Kind, Model, ModelRun
from tests.generative.strategies import PHASES, json_values, names, signal_names, tokens

#: The workers' own threads draw from ``random`` (jittered backoff, a Valkey claim's first
#: shard) while Hypothesis draws the next step, which it would take for a strategy's use.
pytestmark = pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")

EXAMPLES = int(os.environ.get("PYRULA_FUZZ_EXAMPLES", "10"))
STEPS = int(os.environ.get("PYRULA_FUZZ_STEPS", "15"))
MAX_WORKERS = 2

kinds_drawn = st.lists(names, min_size=1, max_size=4, unique=True).flatmap(
    lambda ns: st.tuples(*[
        st.builds(Kind, st.just(n), st.sampled_from(KINDS), signal_names,
                  st.none() | st.integers(1, 60)) for n in ns
    ])
)


class RunsMachine(RuleBasedStateMachine):
    """The public API (client and workers) against ``Model``; ``new_store`` is bound by the
    test to its backend's store factory."""

    new_store: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.harness: Harness | None = None
        self.model = Model(now=0.0)
        self.keys: list[str] = []
        self.holds = itertools.count()

    @property
    def h(self) -> Harness:
        assert self.harness is not None
        return self.harness

    @initialize(kinds=kinds_drawn, shard_count=st.sampled_from([1, 2, 3, 64]),
                keys=st.lists(tokens, min_size=1, max_size=3, unique=True), data=st.data())
    def setup(self, kinds: tuple[Kind, ...], shard_count: int, keys: list[str],
              data: st.DataObject) -> None:
        """The store, and a first worker serving some names (or none) from the start."""
        self.harness = Harness(type(self).new_store(shard_count=shard_count), kinds)
        self.model = Model(now=self.h.clock.now())
        self.keys = keys
        served = data.draw(st.lists(st.sampled_from(sorted(self.h.kinds)), unique=True),
                           label="first worker serves")
        if served:
            self.h.start_worker(served)

    def teardown(self) -> None:
        if self.harness is not None:
            self.harness.close()

    # --- what a user does --------------------------------------------------------------

    def _params(self, data: st.DataObject, kind: Kind) -> Any:
        x = data.draw(json_values, label="x")
        if kind.behaviour == "nap":
            return {"seconds": data.draw(st.integers(1, 60), label="seconds"), "x": x}
        if kind.behaviour == "hold":
            return {"key": f"hold-{next(self.holds)}", "x": x}
        return x

    @rule(data=st.data(), count=st.integers(1, 3))
    def submit(self, data: st.DataObject, count: int) -> None:
        for _ in range(count):
            self._submit(data)

    def _submit(self, data: st.DataObject) -> None:
        kind = data.draw(st.sampled_from(sorted(self.h.kinds.values(), key=lambda k: k.name)))
        params = self._params(data, kind)
        owner = data.draw(st.none() | tokens, label="owner")
        key = data.draw(st.none() | st.sampled_from(self.keys), label="idempotency_key")
        handle = self.h.call(self.h.client.submit(kind.name, params, owner=owner,
                                                  idempotency_key=key))
        assert handle.name == kind.name
        first = self.model.known(kind.name, key)
        if first is not None:
            assert handle.run_id == first, "a repeated idempotency key made a new run"
            return
        assert handle.run_id not in self.model.runs
        self.model.submitted(ModelRun(handle.run_id, kind, params, owner, key, self.model.now))

    def _pick(self, data: st.DataObject) -> ModelRun:
        # In the order of submission: run ids are random, so their order would make the
        # same draws pick other runs when Hypothesis replays or shrinks an example.
        run_id = data.draw(st.sampled_from(list(self.model.runs)), label="run")
        return self.model.runs[run_id]

    @precondition(lambda self: self.model.runs)
    @rule(data=st.data(), payload=json_values, resume=st.booleans())
    def signal(self, data: st.DataObject, payload: Any, resume: bool) -> None:
        """A signal (the one its workflow waits for, or another) or a resume."""
        run = self._pick(data)
        if resume:
            name = INTERRUPT_SIGNAL
            call = self.h.client.resume(run.run_id, payload)
        else:
            name = data.draw(st.sampled_from([run.kind.signal]) | signal_names, label="signal")
            call = self.h.client.signal(run.run_id, name, payload)
        accepted = self.model.signal(run.run_id, name, payload)
        try:
            self.h.call(call)
        except RunNotActive:
            assert not accepted, f"{name!r} for active run {run.run_id} was refused"
        else:
            assert accepted, f"{name!r} for ended run {run.run_id} was accepted"

    @precondition(lambda self: self.model.runs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        run = self._pick(data)
        active = self.model.cancel(run.run_id)
        assert self.h.call(self.h.client.cancel(run.run_id)) is active

    @precondition(lambda self: self.model.runs)
    @rule(data=st.data())
    def wait_for_result(self, data: st.DataObject) -> None:
        """A caller waits on ``client.result``; it must return once the run ends, not before."""
        self.h.wait_result(self._pick(data).run_id)

    @precondition(lambda self: self.model.runs)
    @rule(data=st.data())
    def wake(self, data: st.DataObject) -> None:
        run = self._pick(data)
        sleeping = self.model.wake(run.run_id, self.h.served)
        assert self.h.call(self.h.client.wake(run.run_id)) is sleeping

    @rule(data=st.data(), limit=st.none() | st.integers(1, 5), page_size=st.integers(1, 4))
    def list_runs(self, data: st.DataObject, limit: int | None, page_size: int) -> None:
        """Filters and pages agree with the model: newest first, ties (one instant on the
        test's clock) broken by run id, however small the pages."""
        runs = list(self.model.runs.values())
        name = data.draw(st.none() | st.sampled_from(sorted(self.h.kinds)), label="name")
        owners = sorted({r.owner for r in runs if r.owner is not None})
        owner = data.draw(st.none() | st.sampled_from(owners) if owners else st.none(),
                          label="owner")
        status = data.draw(st.none() | st.sampled_from(list(RunStatus)), label="status")
        served = self.h.served
        wanted = sorted(
            (r for r in runs if name in (None, r.kind.name) and owner in (None, r.owner)
             and status in (None, self.model.expected(r, served))),
            key=lambda r: (r.created_at, r.run_id), reverse=True)
        listed = self.h.list_runs(name=name, owner=owner, status=status, limit=limit,
                                  page_size=page_size)
        assert listed == [r.run_id for r in wanted][:limit], (name, owner, status)

    @precondition(lambda self: any(r.kind.behaviour == "hold" and not r.released
                                   for r in self.model.runs.values()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        keys = sorted({r.params["key"] for r in self.model.runs.values()
                       if r.kind.behaviour == "hold" and not r.released})
        key = data.draw(st.sampled_from(keys), label="hold")
        self.model.release(key)
        self.h.release(key)

    @precondition(lambda self: not self.model.running_holds(self.h.served))
    @rule(seconds=st.integers(1, 60))
    def time_passes(self, seconds: int) -> None:
        self.model.advance(seconds)
        self.h.clock.advance(seconds)

    @precondition(lambda self: len(self.h.workers) < MAX_WORKERS)
    @rule(data=st.data(), separate=st.booleans())
    def start_worker(self, data: st.DataObject, separate: bool) -> None:
        served = data.draw(st.lists(st.sampled_from(sorted(self.h.kinds)), min_size=1,
                                    unique=True), label="serves")
        self.h.start_worker(served, separate)

    @precondition(lambda self: self.h.workers)
    @rule(data=st.data())
    def stop_worker(self, data: st.DataObject) -> None:
        live = data.draw(st.sampled_from(self.h.workers), label="worker")
        self.h.stop_worker(live)

    # --- what must hold ----------------------------------------------------------------

    def _check_waiters(self) -> None:
        for run_id, waiter in self.h.waiters.items():
            run = self.model.runs[run_id]
            if run.ended is None:
                assert not waiter.done(), f"result() of active run {run_id} returned: {waiter}"
                continue
            try:
                got = waiter.result(BOUND)
            except RunCancelled:
                assert run.ended == RunStatus.CANCELLED, f"{run_id} ended {run.ended}"
            else:
                assert (run.ended, got) == (RunStatus.COMPLETED, run.result), run_id

    @invariant()
    def agrees_with_the_model(self) -> None:
        if self.harness is None:
            return
        infos = self.h.quiesce(self.model)
        self._check_waiters()
        held = self.h.held()
        for i, a in enumerate(held):
            for b in held[i + 1:]:
                assert not set(a) & set(b), f"runs held by two workers: {set(a) & set(b)}"
        holders = {rid for one in held for rid in one}
        journals = self.h.events(list(infos))
        for run_id, info in infos.items():
            run = self.model.runs[run_id]
            assert (info.name, info.owner, info.params) == (run.kind.name, run.owner,
                                                            run.params)
            assert info.idempotency_key == run.idempotency_key
            if info.status == RunStatus.RUNNING:
                assert run_id in holders, f"running run {run_id} is held by no worker"
            journal = journals[run_id]
            check_journal(run_id, journal, info.status)
            half = len(journal) // 2
            assert self.h.call(self.h.client.events(run_id, half)) == journal[half:]
            if info.status == RunStatus.COMPLETED:
                assert self.h.call(self.h.client.result(run_id)) == run.result
            elif info.status == RunStatus.CANCELLED:
                with pytest.raises(RunCancelled):
                    self.h.call(self.h.client.result(run_id))
            types = [e["type"] for e in journals[run_id]]
            assert types.count("signal:received") == run.signals, f"{run_id}: {types}"
            assert types.count("interrupt:resumed") == run.resumes, f"{run_id}: {types}"
            if info.status == RunStatus.WAITING:
                assert info.waiting_for == (run.kind.awaits,), info
                assert info.interrupt == (run.params if run.kind.behaviour == "ask" else None)
            if info.status == RunStatus.SLEEPING:
                assert info.wake_at == run.wake_at, (info, run)


def test_runs_agree_with_the_model(new_store: Any) -> None:
    class Machine(RunsMachine):
        pass

    Machine.new_store = staticmethod(new_store)
    run_state_machine_as_test(Machine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, phases=PHASES,
        derandomize=os.environ.get("CI") == "true",
    ))
