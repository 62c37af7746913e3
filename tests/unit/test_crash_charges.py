"""Who is charged when a fleet child dies: the supervisor's rule, the child's report of the
runs in user code (never missing one) and the heartbeat that carries it. Pure parts,
tested without processes (tests/fleet pins the whole)."""

from __future__ import annotations

import pytest

from pyrula.supervisor.recovery import runs_to_charge
from pyrula.wire import Heartbeat, decode, heartbeat_message, parse_heartbeat
from pyrula.workflows.worker.usercode import UserCodeTracker


@pytest.mark.parametrize(
    ("user_code", "suspects", "charged"),
    [
        # A first crash: nobody is a suspect, every run in its code may be the culprit.
        (["a", "b", "p"], [], {"a", "b", "p"}),
        # A suspect in its code is charged alone; ordinary runs beside it are spared.
        (["a", "b", "p"], ["p"], {"p"}),
        # Suspects held but not in their code are spared, and without a suspect in user
        # code the ordinary runs in it are charged.
        (["a"], ["p", "q"], {"a"}),
        # Nothing in user code (every run waited on the store): nobody is charged.
        ([], ["p"], set()),
        # A child that reported no user code (an older build) leaves every run chargeable.
        (None, ["p"], None),
    ],
)
def test_runs_to_charge(user_code: list[str] | None, suspects: list[str],
                        charged: set[str] | None) -> None:
    assert runs_to_charge(user_code, suspects) == (None if charged is None else charged)


def test_a_heartbeat_carries_the_runs_in_user_code_and_the_suspects() -> None:
    beat = Heartbeat(state="ready", worker_id="w", pid=1, held={"a": 1, "p": 3},
                     user_code=["a"], suspects=["p"])
    parsed = parse_heartbeat(decode(heartbeat_message(beat)))
    assert parsed.user_code == ["a"] and parsed.suspects == ["p"]
    older = parse_heartbeat({"type": "heartbeat", "worker_id": "w", "held": {"a": 1}})
    assert older.user_code is None and older.suspects == []


class Supervisor:
    """Keeps the last report a tracker sends, as the supervisor would."""

    def __init__(self) -> None:
        self.tracker = UserCodeTracker(self.report)
        self.sent = 0
        self.user_code: list[str] = []
        self.suspects: list[str] = []

    def report(self) -> None:
        self.send(heartbeat=False)

    def send(self, *, heartbeat: bool) -> None:
        self.sent += 1
        self.user_code, self.suspects = self.tracker.snapshot(heartbeat=heartbeat)

    def covers(self, run_id: str) -> bool:
        return run_id in self.user_code


def test_a_run_is_reported_before_its_code_runs_and_at_most_once_per_heartbeat() -> None:
    sup = Supervisor()
    t = sup.tracker
    t.enter("a")
    assert sup.covers("a") and sup.sent == 1
    # Steps and store waits in turn: no further report until a heartbeat drops it.
    for _ in range(10):
        t.leave("a")
        t.enter("a")
    assert sup.sent == 1
    t.leave("a")  # waiting on the store now; still named until the next heartbeat
    assert sup.covers("a")
    sup.send(heartbeat=True)
    assert not sup.covers("a")
    t.enter("a")
    assert sup.covers("a") and sup.sent == 3


def test_a_claim_report_covers_the_claimed_runs_but_not_suspects() -> None:
    sup = Supervisor()
    t = sup.tracker
    t.suspect("p", 2)
    t.claimed(["a", "b", "p"])
    sup.send(heartbeat=False)  # the claim's report
    assert sup.user_code == ["a", "b"] and sup.suspects == ["p"]
    t.enter("a")
    t.enter("b")
    assert sup.sent == 1  # their start needed no report of its own
    t.enter("p")  # the suspect is reported before its code runs
    assert sup.sent == 2 and sup.covers("p")


def test_a_suspect_is_named_only_while_in_its_code() -> None:
    sup = Supervisor()
    t = sup.tracker
    t.suspect("p", 2)
    t.suspect("q", 1)
    t.enter("a")
    t.enter("p")
    assert sup.user_code == ["a", "p"]
    t.leave("p")  # reported at once: a stale name would charge p for q's crash
    assert sup.user_code == ["a"]
    t.attempt_ended("p", 2)
    t.enter("q")
    assert sup.user_code == ["a", "q"] and sup.suspects == ["q"]
    # A run named earlier as an ordinary run is reported afresh once it is a suspect.
    t.enter("b")
    t.leave("b")
    t.suspect("b", 5)
    before = sup.sent
    t.enter("b")
    assert sup.sent == before + 1 and sup.covers("b")


def test_without_a_reporter_nothing_is_reported() -> None:
    t = UserCodeTracker()
    t.claimed(["a"])
    t.enter("a")
    assert t.in_user_code("a")
    t.leave("a")
    assert not t.in_user_code("a")
    assert t.snapshot(heartbeat=True) == ([], [])
