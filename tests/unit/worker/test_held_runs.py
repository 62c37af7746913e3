"""The registry of held runs: one entry per attempt, the newest claim of a run reported."""

from __future__ import annotations

from typing import Any, cast

from pyrula.workflows.events import make_event
from pyrula.workflows.worker.cache import JournalCache
from pyrula.workflows.worker.held import Held, HeldRuns


class FakeAttempt:
    def __init__(self, run_id: str, token: int) -> None:
        self.run_id, self.token = run_id, token
        self.abandoned = self.cancelled = False

    def abandon(self) -> None:
        self.abandoned = True

    def request_cancel(self) -> None:
        self.cancelled = True


def attach(runs: HeldRuns, run_id: str, token: int) -> tuple[FakeAttempt, bool]:
    attempt = FakeAttempt(run_id, token)
    return attempt, runs.attach(cast(Any, attempt))


def test_a_claimed_run_is_held_before_its_attempt_exists_and_renewed_once_asked() -> None:
    runs = HeldRuns()
    runs.claimed("r", 1)
    assert runs.held() == {"r": 1} and runs.in_flight() == 0 and runs.renewing() == {}
    runs.renew("r", 1, 3.0)
    attach(runs, "r", 1)
    assert runs.in_flight() == 1 and runs.renewing() == {"r": Held(1, 3.0)}
    assert runs.release("r", 1) is False
    assert runs.held() == {} and runs.in_flight() == 0 and runs.attempts() == []


def test_an_attempt_stood_down_before_it_was_attached_is_abandoned_by_its_caller() -> None:
    runs = HeldRuns()
    runs.claimed("r", 1)
    runs.renew("r", 1, 3.0)
    runs.stand_down("r", 1)
    attempt, stood_down = attach(runs, "r", 1)
    assert stood_down is True and attempt.abandoned is False  # the caller abandons it
    assert runs.renewing() == {}


def test_standing_down_or_losing_an_attached_attempt_abandons_it() -> None:
    runs = HeldRuns()
    for token in (1, 2):
        runs.claimed(f"r{token}", token)
        runs.renew(f"r{token}", token, 3.0)
    first, _ = attach(runs, "r1", 1)
    second, _ = attach(runs, "r2", 2)
    runs.stand_down("r1", 1)
    runs.lost("r2", 2)
    assert first.abandoned and second.abandoned
    # A lost lock is still renewed (the attempt ends as LOST); a stood-down one is not.
    assert runs.renewing() == {"r2": Held(2, 3.0)}
    assert runs.was_stood_down("r1", 1) and not runs.was_stood_down("r2", 2)


def test_a_cancel_reaches_the_newest_attempt_of_the_run() -> None:
    runs = HeldRuns()
    runs.claimed("r", 1)
    old, _ = attach(runs, "r", 1)
    runs.stand_down("r", 1)
    runs.claimed("r", 2)
    new, _ = attach(runs, "r", 2)
    runs.request_cancel("r")
    assert (old.cancelled, new.cancelled) == (False, True)
    assert runs.held() == {"r": 2} and runs.in_flight() == 1
    assert runs.attempts() == [new]


def test_releasing_a_stood_down_attempt_drops_the_cached_journal() -> None:
    cache = JournalCache(100)
    runs = HeldRuns(cache)
    journal = [make_event("run:started", 0.0, seq=1)]
    for token, stood_down in ((1, False), (2, True)):
        cache.put("r", journal)
        runs.claimed("r", token)
        if stood_down:
            runs.stand_down("r", token)
        runs.release("r", token)
        assert len(cache) == (0 if stood_down else 1)
