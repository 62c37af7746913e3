"""The read-ahead of a synchronous client's results (``pyrula.workflows.readahead``)
against a small model, in orders Hypothesis draws: it hands out only ended runs' outcomes
that were read, each once and unchanged; it plans reads only of runs submitted after the
one asked for, in order, within its window; asked out of order, it plans nothing."""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pyrula.workflows.readahead import MAX_WINDOW, OUTCOMES_KEPT, SUBMITTED_KEPT, ReadAhead
from pyrula.workflows.records import RunOutcome, RunStatus

IDS = [f"run-{i}" for i in range(10)]
ENDED = st.sampled_from([RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED,
                        RunStatus.CONTINUED])
#: Mostly ended runs (a reader behind the workers: where the read-ahead reads at all).
OUTCOMES = st.one_of(
    st.tuples(ENDED, st.integers(0, 5)).map(lambda drawn: RunOutcome(*drawn)),
    st.tuples(ENDED, st.integers(0, 5)).map(lambda drawn: RunOutcome(*drawn)),
    st.none(),
    st.tuples(st.sampled_from(list(RunStatus)), st.integers(0, 5)).map(
        lambda drawn: RunOutcome(*drawn)),
)


class ReadAheadMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ahead = ReadAhead()
        self.order: list[str] = []  # submissions, in order
        self.kept: dict[str, RunOutcome] = {}  # what the model says is read ahead
        self.asked: str | None = None

    @initialize(order=st.permutations(IDS))
    def submit_a_batch(self, order: list[str]) -> None:
        for run_id in order:
            self.submit(run_id)

    @rule(run_id=st.sampled_from(IDS))
    def submit(self, run_id: str) -> None:
        self.ahead.submitted(run_id)
        if not self.order or self.order[-1] != run_id:
            self.order.append(run_id)

    @rule(data=st.data(), in_order=st.sampled_from([True, True, True, False]),
          run_id=st.sampled_from(IDS), ended=st.sampled_from([True, True, False]))
    def ask(self, data: Any, in_order: bool, run_id: str, ended: bool) -> None:
        """A client's result(): the run submitted after the last one asked for (mostly),
        or any; its kept outcome, else a planned read with drawn outcomes."""
        if in_order and self.asked is not None and self._next_of(self.asked) is not None:
            run_id = self._next_of(self.asked)  # type: ignore[assignment]
        got = self.ahead.take(run_id)
        assert got == self.kept.pop(run_id, None)
        if got is not None:
            self.asked = run_id
            return
        plan = self.ahead.plan(run_id)
        was_in_order = self.asked is not None and self._next_of(self.asked) == run_id
        self.asked = run_id
        if not was_in_order or self._next_of(run_id) is None:
            assert plan is None
            return
        if plan is None:
            return
        assert len(plan) <= MAX_WINDOW
        assert not set(plan) & set(self.kept)
        later = [r for r in self._walk(run_id) if r not in self.kept]
        assert plan == later[:len(plan)], (plan, later)
        outcomes = [data.draw(OUTCOMES) for _ in plan]
        self.ahead.read(ended, plan, outcomes)
        for planned, outcome in zip(plan, outcomes, strict=True):
            if outcome is not None and outcome.status.terminal:
                self.kept[planned] = outcome

    def _next_of(self, run_id: str) -> str | None:
        """The run submitted right after ``run_id`` (its latest submission)."""
        nexts = {a: b for a, b in zip(self.order, self.order[1:], strict=False)}
        return nexts.get(run_id)

    def _walk(self, run_id: str) -> list[str]:
        seen, at, out = {run_id}, run_id, []
        while (following := self._next_of(at)) is not None and following not in seen:
            seen.add(following)
            out.append(following)
            at = following
        return out

    @invariant()
    def only_ended_outcomes_are_kept(self) -> None:
        assert all(o.status.terminal for o in self.kept.values())


ReadAheadMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40,
                                              deadline=None)
test_read_ahead_against_a_model = ReadAheadMachine.TestCase


def test_a_reader_ahead_of_the_workers_looks_again_ever_more_rarely() -> None:
    """Each run asked for in order had not ended: the read-ahead looks once, then after
    1, 2, 4 ... results the usual way, at most MAX_WINDOW."""
    ahead = ReadAhead()
    ids = [f"r{i}" for i in range(400)]
    for run_id in ids:
        ahead.submitted(run_id)
    looked = []
    ahead.take(ids[0])
    assert ahead.plan(ids[0]) is None  # nothing asked before: not in order
    for i, run_id in enumerate(ids[1:], 1):
        plan = ahead.plan(run_id)
        if plan is not None:
            looked.append(i)
            ahead.read(False, plan, [None] * len(plan))
    gaps = [b - a for a, b in zip(looked, looked[1:], strict=False)]
    assert gaps[:7] == [2, 3, 5, 9, 17, 33, 65]
    assert set(gaps[7:]) <= {MAX_WINDOW + 1}


def test_a_reader_behind_the_workers_reads_ahead_in_a_window_that_doubles() -> None:
    ahead = ReadAhead()
    ids = [f"r{i}" for i in range(300)]
    for run_id in ids:
        ahead.submitted(run_id)
    done = RunOutcome(RunStatus.COMPLETED, 1)
    assert ahead.plan(ids[0]) is None
    sizes = []
    for run_id in ids[1:]:
        if ahead.take(run_id) is not None:
            continue
        plan = ahead.plan(run_id)
        assert plan is not None
        sizes.append(len(plan))
        ahead.read(True, plan, [done] * len(plan))
    assert sizes[:6] == [0, 4, 8, 16, 32, 64]
    assert set(sizes[6:-1]) == {MAX_WINDOW}


def test_a_client_that_submits_and_waits_in_turn_reads_nothing_ahead() -> None:
    ahead = ReadAhead()
    for i in range(200):
        ahead.submitted(f"r{i}")
        assert ahead.take(f"r{i}") is None
        assert ahead.plan(f"r{i}") is None


def test_what_it_keeps_is_bounded() -> None:
    """The oldest submissions and outcomes go first: memory stays bounded however many
    runs one client submits and never asks for."""
    ahead = ReadAhead()
    ids = [f"r{i}" for i in range(SUBMITTED_KEPT + 10)]
    for run_id in ids:
        ahead.submitted(run_id)
    ahead.take(ids[0])
    assert ahead.plan(ids[0]) is None
    assert ahead.plan(ids[1]) is None  # the order of the oldest is forgotten
    assert ahead.plan(ids[-3]) is None  # not asked in order
    assert ahead.plan(ids[-2]) == []  # the newest order is known: a look, window 0

    done = RunOutcome(RunStatus.COMPLETED, 1)
    kept = ids[:OUTCOMES_KEPT + 10]
    ahead.read(True, kept, [done] * len(kept))
    assert ahead.take(kept[0]) is None
    assert ahead.take(kept[-1]) == done
