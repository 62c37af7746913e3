"""One program of submits, signals, resumes, cancels, releases and time passing, drawn by
Hypothesis, run on every store in the same example: what a user can observe must be the same
on each.

Per run (in the order the program submitted them): its status, its result and the types of
its journal's events in order; ids, timestamps and worker ids are left out. The memory
store is the oracle. A worker serving a drawn list of the names starts at a drawn point of
the program, which may start another (serving other names) and stop them; after each
operation the system comes to rest (as the model of ``test_stateful_runs`` says it must)
before the next, so the outcome does not hang on timing.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyrula.errors import RunNotActive
from pyrula.workflows.events import INTERRUPT_SIGNAL
from tests.generative.conftest import BACKENDS, StoreFactory, make_factory
from tests.generative.harness import Harness
from tests.generative.model import KINDS, Kind, Model, ModelRun
from tests.generative.strategies import PHASES, json_values, names, signal_names, tokens

EXAMPLES = int(os.environ.get("PYRULA_FUZZ_EXAMPLES", "8"))

pytestmark = [pytest.mark.valkey, pytest.mark.cluster, pytest.mark.filterwarnings(
    "ignore:Do not use the `random` module inside strategies")]  # see test_stateful_runs

#: Which run an operation names: an index taken modulo the runs submitted so far.
which = st.integers(0, 31)

submits = st.tuples(st.just("submit"), which, json_values, st.integers(1, 60),
                    st.none() | tokens, st.none() | st.integers(0, 2))

operations = st.lists(st.one_of(
    submits,
    st.tuples(st.just("signal"), which, st.booleans(), json_values),
    st.tuples(st.just("resume"), which, json_values),
    st.tuples(st.just("cancel"), which),
    st.tuples(st.just("release"), which),
    st.tuples(st.just("time"), st.integers(1, 60)),
    st.tuples(st.just("start"), st.lists(st.integers(0, 3), min_size=1, unique=True)),
    st.tuples(st.just("stop"), st.integers(0, 1)),
), max_size=12)


@dataclass(frozen=True)
class Program:
    kinds: tuple[Kind, ...]
    #: The names the first worker serves, in the order it is given them, and when it
    #: starts; ``start`` and ``stop`` operations add and stop others (two at most).
    serves: tuple[str, ...]
    worker_at: int
    operations: tuple[tuple[Any, ...], ...]
    keys: tuple[str, ...]
    other_signal: str


@st.composite
def programs(draw: st.DrawFn) -> Program:
    workflow_names = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    kinds = tuple(Kind(n, draw(st.sampled_from(KINDS)), draw(signal_names),
                       draw(st.none() | st.integers(1, 60))) for n in workflow_names)
    serves = draw(st.permutations(workflow_names).flatmap(
        lambda ns: st.integers(1, len(ns)).map(lambda k: tuple(ns[:k]))))
    # Some runs first, so that what follows has runs to act on.
    ops = tuple(draw(st.lists(submits, min_size=1, max_size=4)) + draw(operations))
    return Program(kinds, serves, draw(st.integers(0, len(ops))), ops,
                   tuple(draw(st.lists(tokens, min_size=3, max_size=3, unique=True))),
                   draw(signal_names))


Outcome = tuple[str, Any, tuple[str, ...]]


def run_program(harness: Harness, program: Program) -> list[Outcome]:
    """Run ``program``; each run's (status, result, event types), in submission order."""
    model = Model(now=harness.clock.now())
    handles: list[str] = []
    holds = itertools.count()
    for at, op in enumerate(program.operations):
        if at == program.worker_at:
            start_worker(harness, list(program.serves))
            harness.quiesce(model)
        apply(harness, model, program, op, handles, holds)
        harness.quiesce(model)
    if program.worker_at == len(program.operations):
        start_worker(harness, list(program.serves))
    infos = harness.quiesce(model)
    journals = harness.events(list(infos))
    return [(infos[rid].status.value, infos[rid].result,
             tuple(e["type"] for e in journals[rid])) for rid in handles]


def start_worker(harness: Harness, wanted: list[str]) -> None:
    """Start a worker serving those of ``wanted`` no live worker serves (two at most): with
    two serving one name, which of them claims a run, and so whether stopping one of them
    requeues it, would be down to timing."""
    served = harness.served
    names = [n for n in dict.fromkeys(wanted) if n not in served]
    if names and len(harness.workers) < 2:
        harness.start_worker(names)


def apply(harness: Harness, model: Model, program: Program, op: tuple[Any, ...],
          handles: list[str], holds: Iterator[int]) -> None:
    client = harness.client
    if op[0] == "submit":
        _, index, x, seconds, owner, key_index = op
        kind = program.kinds[index % len(program.kinds)]
        params: Any = x
        if kind.behaviour == "nap":
            params = {"seconds": seconds, "x": x}
        elif kind.behaviour == "hold":
            params = {"key": f"hold-{next(holds)}", "x": x}
        key = None if key_index is None else program.keys[key_index]
        handle = harness.call(client.submit(kind.name, params, owner=owner,
                                            idempotency_key=key))
        if model.known(kind.name, key) is None:
            model.submitted(ModelRun(handle.run_id, kind, params, owner, key, model.now))
        handles.append(handle.run_id)
        return
    if op[0] == "time":
        if not model.running_holds(harness.served):
            model.advance(op[1])
            harness.clock.advance(op[1])
        return
    if op[0] == "start":
        start_worker(harness, [program.kinds[i % len(program.kinds)].name for i in op[1]])
        return
    if op[0] == "stop":
        if harness.workers:
            harness.stop_worker(harness.workers[op[1] % len(harness.workers)])
        return
    if not handles:
        return
    run = model.runs[handles[op[1] % len(handles)]]
    if op[0] == "signal":
        name = run.kind.signal if op[2] else program.other_signal
        accepted = model.signal(run.run_id, name, op[3])
        try:
            harness.call(client.signal(run.run_id, name, op[3]))
        except RunNotActive:
            assert not accepted
    elif op[0] == "resume":
        accepted = model.signal(run.run_id, INTERRUPT_SIGNAL, op[2])
        try:
            harness.call(client.resume(run.run_id, op[2]))
        except RunNotActive:
            assert not accepted
    elif op[0] == "cancel":
        model.cancel(run.run_id)
        harness.call(client.cancel(run.run_id))
    elif run.kind.behaviour == "hold":
        model.release(run.params["key"])
        harness.release(run.params["key"])


@pytest.fixture
def factories(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, StoreFactory]]:
    made: list[Any] = []
    out = {}
    for param in BACKENDS:
        backend = param if isinstance(param, str) else param.values[0]
        (tmp_path / str(backend)).mkdir()
        factory, stores = make_factory(str(backend), request, tmp_path / str(backend))
        out[str(backend)] = factory
        made.append(stores)
    try:
        yield out
    finally:
        for stores in made:
            for store in stores:
                store.close()


@settings(max_examples=EXAMPLES, deadline=None, phases=PHASES,
          derandomize=os.environ.get("CI") == "true",
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=programs(), shard_count=st.sampled_from([1, 2, 3, 64]))
def test_every_store_shows_what_memory_shows(factories: dict[str, StoreFactory],
                                            program: Program, shard_count: int) -> None:
    outcomes = {}
    for backend, factory in factories.items():
        harness = Harness(factory(shard_count=shard_count), program.kinds)
        try:
            outcomes[backend] = run_program(harness, program)
        finally:
            harness.close()
    oracle = outcomes.pop("memory")
    for backend, seen in outcomes.items():
        for i, (want, got) in enumerate(zip(oracle, seen, strict=True)):
            assert got == want, f"run {i} on {backend}: {got} where memory shows {want}"
