"""Runs ending and projection passes in any order Hypothesis chooses, checked against a
small model after every step, on every store: a projection's state is always its fold
over exactly the ended runs up to its checkpoint, in end order (each once, none missing),
whoever folds (the test's store object or another one on the same store, or both at once),
with rebuilds and a change of the fold's code in between; and once passes run until idle,
every run that ended at least the grace ago is in.

What is drawn: which workflow ends a run and how (completed, failed, cancelled, or
continued as new: never folded), its key, how time passes, the batch size and grace of
each pass, which fold code a pass runs (two versions of one projection), concurrent
passes, and rebuilds.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from pyrula.workflows.events import EventType, make_event
from pyrula.workflows.projections import FOLDED, WHOLE, ProjectionSpec
from pyrula.workflows.records import RunInfo, RunStatus
from pyrula.workflows.stores.capabilities import Projections, capabilities_of
from pyrula.workflows.worker.projections import fold_once
from tests.generative.harness import other_store
from tests.generative.strategies import PHASES

T0 = 1_800_000_000.0
WORKFLOWS = ["pj.a", "pj.b", "pj.c"]
#: The graces of the passes: never 0, since a run may still end at the pass's own time (the
#: model's clock stands still between steps) and sort before one already folded; a grace
#: is what the guarantee rests on (docs/projections.md).
GRACES = [0.5, 1.0, 2.5]
ENDINGS = [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.CONTINUED]


def appended(state: Any, run: RunInfo) -> Any:
    return [*(state or []), run.run_id]


def prepended(state: Any, run: RunInfo) -> Any:
    return [run.run_id, *(state or [])]


def counted(state: Any, run: RunInfo) -> Any:
    return {**(state or {}), run.status.value: (state or {}).get(run.status.value, 0) + 1}


#: One projection in two versions of its code, and a keyed one.
IDS = [ProjectionSpec("pj.ids", ("pj.a", "pj.b"), appended),
       ProjectionSpec("pj.ids", ("pj.a", "pj.b"), prepended)]
BY_KEY = ProjectionSpec("pj.by_key", ("pj.a", "pj.c"), counted, key=lambda r: r.params["k"])


@dataclass(frozen=True)
class Ended:
    finished_at: float
    run_id: str
    name: str
    status: RunStatus
    key: str

    def info(self) -> RunInfo:
        return RunInfo(self.run_id, self.name, self.status, 1, {"k": self.key}, None,
                       self.finished_at, self.finished_at, finished_at=self.finished_at)


class ProjectionsMachine(RuleBasedStateMachine):
    new_store: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.stores: list[Any] = []
        self.now = T0
        self.ended: list[Ended] = []
        self.checkpoints: dict[str, tuple[float, str] | None] = {}

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def _p(self, which: int) -> Projections:
        found = capabilities_of(self.stores[which]).projections
        assert found is not None
        return found

    @initialize()
    def start(self) -> None:
        store = type(self).new_store(shard_count=4)
        self.stores = [store, other_store(store)]

    @rule(name=st.sampled_from(WORKFLOWS), ending=st.sampled_from(ENDINGS),
          key=st.sampled_from(["x", "y"]), which=st.integers(0, 1))
    def end_run(self, name: str, ending: RunStatus, key: str, which: int) -> None:
        store = self.stores[which]
        handle, _ = self._run(store.submit(name, {"k": key}, now=self.now))
        claimed = self._run(store.claim_run(handle.run_id, "w", now=self.now, lock_ttl=60.0))
        assert claimed is not None
        kind = {RunStatus.COMPLETED: EventType.RUN_COMPLETED,
                RunStatus.FAILED: EventType.RUN_ERROR,
                RunStatus.CANCELLED: EventType.RUN_CANCELLED,
                RunStatus.CONTINUED: EventType.RUN_CONTINUED}[ending]
        error = ({"code": "x", "error_type": "E", "message": "m"}
                 if ending is RunStatus.FAILED else None)
        self._run(store.finish(
            handle.run_id, claimed.token, [make_event(kind, self.now, **(error or {}))],
            now=self.now, status=ending, error=error,
            successor_params={"k": key} if ending is RunStatus.CONTINUED else None))
        self.ended.append(Ended(self.now, handle.run_id, name, ending, key))

    @rule(seconds=st.sampled_from([0.0, 0.5, 1.0, 2.5]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @rule(version=st.integers(0, 1), keyed=st.booleans(), which=st.integers(0, 1),
          batch=st.integers(1, 4), grace=st.sampled_from(GRACES))
    def fold(self, version: int, keyed: bool, which: int, batch: int, grace: float) -> None:
        spec = BY_KEY if keyed else IDS[version]
        self._run(fold_once(self._p(which), spec, now=self.now, grace=grace, batch=batch))

    @rule(version=st.integers(0, 1), batch=st.integers(1, 4))
    def fold_at_once(self, version: int, batch: int) -> None:
        """Both store objects fold the same projection concurrently."""
        async def both() -> None:
            await asyncio.gather(*(fold_once(self._p(i), IDS[version], now=self.now,
                                             grace=GRACES[0], batch=batch) for i in (0, 1)))

        self._run(both())

    @rule(keyed=st.booleans(), which=st.integers(0, 1))
    def rebuild(self, keyed: bool, which: int) -> None:
        name = BY_KEY.name if keyed else IDS[0].name
        known = self._run(self._p(which).projection_head(name)) is not None
        assert self._run(self._p(which).reset_projection(name, now=self.now)) == known

    @rule(version=st.integers(0, 1), grace=st.sampled_from(GRACES))
    def settle(self, version: int, grace: float) -> None:
        """Passes until idle (or stood down): every run that ended ``grace`` ago is in."""
        spec = IDS[version]
        for _ in range(200):
            done = self._run(fold_once(self._p(0), spec, now=self.now, grace=grace, batch=3))
            if done.outcome in ("idle", "stand_down"):
                break
        else:
            raise AssertionError("the projection never went idle")
        if done.outcome == "idle":
            head = self._run(self._p(0).projection_head(spec.name))
            assert head is not None
            due = [e for e in self._mine(spec) if e.finished_at <= self.now - grace]
            assert not due or head.checkpoint is not None and \
                (due[-1].finished_at, due[-1].run_id) <= head.checkpoint

    def _mine(self, spec: ProjectionSpec) -> list[Ended]:
        return sorted((e for e in self.ended if e.name in spec.on),
                      key=lambda e: (e.finished_at, e.run_id))

    @invariant()
    def each_state_is_the_fold_of_the_runs_up_to_its_checkpoint(self) -> None:
        if not self.stores:
            return
        for spec_versions in (IDS, [BY_KEY]):
            name = spec_versions[0].name
            head = self._run(self._p(0).projection_head(name))
            states = self._run(self._p(0).projection_states(name, None))
            if head is None:
                assert states == {}
                continue
            current = (head.fingerprint.split() or [""])[0]
            spec = next((s for s in spec_versions if s.fingerprint == current), None)
            if spec is None:  # rebuilt, not folded since
                assert states == {} and head.checkpoint is None
                continue
            expected: dict[str, Any] = {}
            cp = head.checkpoint
            for e in self._mine(spec):
                if cp is None or (e.finished_at, e.run_id) > cp:
                    break
                if e.status in FOLDED:
                    key = spec.key_of(e.info())
                    expected[key] = spec.fold(expected.get(key), e.info())
            assert states == expected, (name, head)
            assert head.folded == sum(1 for e in self._mine(spec) if e.status in FOLDED
                                      and cp is not None and (e.finished_at, e.run_id) <= cp)
            if not spec.keyed:
                ids = states.get(WHOLE, [])
                assert len(ids) == len(set(ids))

    def teardown(self) -> None:
        for store in self.stores[1:]:
            if store is not self.stores[0]:
                self._run(store.aclose())
                store.close()
        if self.stores:
            self._run(self.stores[0].aclose())
        self.loop.close()


def test_projections_match_the_model(new_store: Any) -> None:
    ProjectionsMachine.new_store = staticmethod(new_store)
    run_state_machine_as_test(ProjectionsMachine, settings=settings(
        max_examples=15, stateful_step_count=30, deadline=None, phases=PHASES,
        suppress_health_check=list(HealthCheck),
    ))
