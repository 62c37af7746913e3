"""Replay, the pure part of the engine: a journal in, the decision for each operation out.

Each case is a journal a run could have written and what replaying one operation against
it decides. No store, no event loop: times are plain numbers.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import handlers as handlers_module
from pyrula.workflows import replay as replay_module
from pyrula.workflows.errors import NonDeterminismError
from pyrula.workflows.replay import (
    Replay,
    SleepDecision,
    StepHistory,
    WaitTurn,
    step_failed,
)

Event = dict[str, Any]
T0 = 1_000.0


def journal(*events: Event) -> list[Event]:
    """``events`` as the store holds them: seqs 1.. after a submit and a start at T0."""
    head: list[Event] = [
        {"type": "run:submitted", "ts": T0}, {"type": "run:started", "ts": T0},
    ]
    return [{**e, "seq": seq} for seq, e in enumerate(head + list(events), start=1)]


def completed(call: int, step: str, result: Any) -> Event:
    return {"type": "step:completed", "ts": T0, "step": step, "call": call, "result": result}


def failed(call: int, step: str, attempt: int, retry_at: float | None = None) -> Event:
    event = {"type": "step:failed", "ts": T0, "step": step, "call": call, "attempt": attempt,
             "error_type": "ValueError", "message": "card declined",
             "will_retry": retry_at is not None}
    if retry_at is not None:
        event["retry_at"] = retry_at
    return event


def sleeping(call: int, wake_at: float) -> Event:
    return {"type": "run:sleeping", "ts": T0, "op": "pyrula.sleep", "call": call,
            "wake_at": wake_at}


def woken(ts: float, reason: str = "timer") -> Event:
    return {"type": "run:woken", "ts": ts, "reason": reason}


def waiting(call: int, signal: str, timeout_at: float | None = None) -> Event:
    event = {"type": "run:waiting", "ts": T0, "op": "pyrula.wait_for_signal", "call": call,
             "signal": signal}
    if timeout_at is not None:
        event["timeout_at"] = timeout_at
    return event


def signal(name: str, payload: Any) -> Event:
    return {"type": "signal:received", "ts": T0, "name": name, "payload": payload}


def replay_of(*events: Event) -> Replay:
    return Replay(journal(*events), workflow="orders.checkout", run_id="run-1")


# --- steps and values -------------------------------------------------------------------


@dataclass(frozen=True)
class StepCase:
    id: str
    events: tuple[Event, ...]
    name: str
    completed: bool = False
    result: Any = None
    failed_after: int | None = None  # the attempts a step that failed for good reports
    failures: int = 0
    retry_at: float | None = None


STEP_CASES = [
    StepCase("a step not run yet runs", (), "charge"),
    StepCase("a completed step replays its result", (completed(1, "charge", {"id": 7}),),
             "charge", completed=True, result={"id": 7}),
    StepCase("a step that failed for good fails again without running",
             (failed(1, "charge", 1, retry_at=T0 + 1), failed(1, "charge", 2)),
             "charge", failed_after=2, failures=1),
    StepCase("a step awaiting its retry resumes with its failures counted",
             (failed(1, "charge", 1, retry_at=T0 + 30),), "charge",
             failures=1, retry_at=T0 + 30),
    StepCase("a step that succeeded on its retry replays the result",
             (failed(1, "charge", 1, retry_at=T0 + 1), completed(1, "charge", "ok")),
             "charge", completed=True, result="ok"),
]


@pytest.mark.parametrize("case", STEP_CASES, ids=lambda c: c.id)
def test_replaying_a_step(case: StepCase) -> None:
    replay = replay_of(*case.events)
    history = replay.step(replay.take_call(), case.name)
    assert (history.completed, history.result) == (case.completed, case.result)
    assert (history.failures, history.retry_at) == (case.failures, case.retry_at)
    if case.failed_after is None:
        assert history.failure is None
    else:
        assert history.failure is not None
        assert (history.failure.step, history.failure.attempts) == ("charge", case.failed_after)
        assert history.failure.error_type == "ValueError"


@dataclass(frozen=True)
class RenameCase:
    id: str
    events: tuple[Event, ...]
    replay: str  # which operation the code now performs at call 1
    recorded: str
    now: str


RENAME_CASES = [
    RenameCase("a renamed step", (completed(1, "charge", None),), "step", "charge", "bill"),
    RenameCase("a step where a sleep was", (sleeping(1, T0 + 60),), "step",
               "pyrula.sleep", "bill"),
    RenameCase("ctx.uuid4() where ctx.now() was", (completed(1, "pyrula.now", T0),),
               "value", "pyrula.now", "pyrula.uuid4"),
    RenameCase("a sleep where a step was", (completed(1, "charge", None),), "sleep",
               "charge", "pyrula.sleep"),
    RenameCase("a wait where a sleep was", (sleeping(1, T0 + 60),), "wait",
               "pyrula.sleep", "pyrula.wait_for_signal"),
]


@pytest.mark.parametrize("case", RENAME_CASES, ids=lambda c: c.id)
def test_a_different_operation_at_a_recorded_call_is_non_deterministic(
    case: RenameCase,
) -> None:
    replay = replay_of(*case.events)
    call = replay.take_call()
    with pytest.raises(NonDeterminismError) as raised:
        if case.replay == "step":
            replay.step(call, case.now)
        elif case.replay == "value":
            replay.value(call, case.now)
        elif case.replay == "sleep":
            replay.sleep(call, now=T0, seconds=5.0, until=None)
        else:
            replay.open_wait(call, case.now, "approved", now=T0, timeout=None, interrupt=None)
    assert str(raised.value) == (
        f"workflow 'orders.checkout' run run-1: the journal has {case.recorded!r} at call 1,"
        f" but the code now calls {case.now!r} there"
    )


def test_a_recorded_value_replays_and_a_new_one_is_not_found() -> None:
    replay = replay_of(completed(1, "pyrula.now", T0 + 5))
    assert replay.value(replay.take_call(), "pyrula.now") == StepHistory(True, T0 + 5)
    assert replay.value(replay.take_call(), "pyrula.random") == StepHistory()


def test_code_replays_while_the_journal_holds_calls_ahead_of_it() -> None:
    replay = replay_of(completed(1, "a", 1), completed(2, "b", 2))
    seen = []
    for _ in range(3):
        seen.append(replay.is_replaying)
        replay.take_call()
    assert seen + [replay.is_replaying] == [True, True, False, False]


@pytest.mark.parametrize(
    ("calls_made", "message"),
    [
        (3, None),
        (2, "the code returned after 2 calls, but the journal records call 3"),
        (0, "the code returned after 0 calls, but the journal records call 1"),
    ],
    ids=["every recorded call made", "an unreplayed call at the end", "no call made at all"],
)
def test_a_call_the_journal_records_but_the_code_never_made(
    calls_made: int, message: str | None
) -> None:
    replay = replay_of(completed(1, "a", 1), completed(2, "b", 2), sleeping(3, T0 + 9))
    for _ in range(calls_made):
        replay.take_call()
    error = replay.unreplayed()
    if message is None:
        assert error is None
    else:
        assert str(error) == f"workflow 'orders.checkout' run run-1: {message}"


# --- sleeps -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SleepCase:
    id: str
    events: tuple[Event, ...]
    now: float
    seconds: float | None
    wake_at: float | None  # None: the sleep is over and the code goes on
    records: bool = False  # a new run:sleeping is to be written
    until: float | None = None


SLEEP_CASES = [
    SleepCase("a new sleep is recorded and blocks", (), T0, 60.0, T0 + 60, records=True),
    SleepCase("a new sleep_until in the future", (), T0, None, T0 + 90, records=True,
              until=T0 + 90),
    SleepCase("a sleep_until already past goes on", (), T0, None, None, until=T0 - 1),
    SleepCase("a zero sleep goes on, recording nothing", (), T0, 0.0, None),
    SleepCase("a recorded sleep whose timer fired is over",
              (sleeping(1, T0 + 60), woken(T0 + 61)), T0 + 61, 60.0, None),
    SleepCase("a recorded sleep woken early by hand is over",
              (sleeping(1, T0 + 60), woken(T0 + 5, reason="manual")), T0 + 5, 60.0, None),
    SleepCase("a wake before the sleep's time leaves it sleeping",
              (sleeping(1, T0 + 60), woken(T0 + 5)), T0 + 5, 60.0, T0 + 60),
    SleepCase("a recorded sleep still to come blocks until its recorded time",
              (sleeping(1, T0 + 60),), T0 + 10, 5.0, T0 + 60),
    SleepCase("a recorded sleep whose time passed unwoken is over",
              (sleeping(1, T0 + 60),), T0 + 60, 60.0, None),
]


@pytest.mark.parametrize("case", SLEEP_CASES, ids=lambda c: c.id)
def test_replaying_a_sleep(case: SleepCase) -> None:
    replay = replay_of(*case.events)
    call = replay.take_call()
    decision = replay.sleep(call, now=case.now, seconds=case.seconds, until=case.until)
    assert decision.wake_at == case.wake_at
    if case.records:
        assert decision == SleepDecision(case.wake_at, {
            "type": "run:sleeping", "ts": case.now, "op": "pyrula.sleep", "call": 1,
            "wake_at": case.wake_at,
        })
    else:
        assert decision.command is None


def test_a_retry_wait_is_recorded_once() -> None:
    retry_at = T0 + 30
    event = {"type": "run:sleeping", "ts": T0, "step": "charge", "call": 1,
             "wake_at": retry_at, "reason": "retry"}
    replay = replay_of(failed(1, "charge", 1, retry_at=retry_at), event)
    assert replay.retry_recorded(1, retry_at)
    assert not replay.retry_recorded(1, retry_at + 1)
    assert not replay_of(failed(1, "charge", 1, retry_at=retry_at)).retry_recorded(1, retry_at)


# --- waits ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WaitCase:
    id: str
    events: tuple[Event, ...]
    turn: WaitTurn
    now: float = T0
    timeout: float | None = None
    payload: Any = None
    wake_at: float | None = None
    command: dict[str, Any] | None = field(default=None)


WAIT_CASES = [
    WaitCase("a signal that arrived before the wait is taken, nothing recorded",
             (signal("approved", {"by": "ana"}),), WaitTurn.SIGNALLED, payload={"by": "ana"}),
    WaitCase("a new wait is recorded with its timeout and blocks until it",
             (), WaitTurn.BLOCK, timeout=30.0, wake_at=T0 + 30,
             command={"type": "run:waiting", "ts": T0, "op": "pyrula.wait_for_signal",
                      "call": 1, "signal": "approved", "timeout_at": T0 + 30}),
    WaitCase("a signal of another name does not end the wait",
             (signal("rejected", None),), WaitTurn.BLOCK,
             command={"type": "run:waiting", "ts": T0, "op": "pyrula.wait_for_signal",
                      "call": 1, "signal": "approved"}),
    WaitCase("a signal after the recorded wait is taken",
             (waiting(1, "approved", T0 + 30), signal("approved", 42)),
             WaitTurn.SIGNALLED, now=T0 + 5, payload=42),
    WaitCase("a timeout that fired before the signal wins on replay",
             (waiting(1, "approved", T0 + 30), woken(T0 + 30), signal("approved", 42)),
             WaitTurn.TIMED_OUT, now=T0 + 40),
    WaitCase("a signal that came before the timer fired wins",
             (waiting(1, "approved", T0 + 30), signal("approved", 42), woken(T0 + 30)),
             WaitTurn.SIGNALLED, now=T0 + 40, payload=42),
    WaitCase("a timeout due but undecided is decided by writing run:woken",
             (waiting(1, "approved", T0 + 30),), WaitTurn.DECIDE_TIMEOUT, now=T0 + 31,
             command={"type": "run:woken", "ts": T0 + 31, "reason": "timeout", "call": 1}),
    WaitCase("a recorded wait with nothing in blocks until its recorded timeout",
             (waiting(1, "approved", T0 + 30),), WaitTurn.BLOCK, now=T0 + 5, wake_at=T0 + 30),
    WaitCase("a zero timeout is recorded, then decided durably",
             (), WaitTurn.DECIDE_TIMEOUT, timeout=0.0,
             command={"type": "run:woken", "ts": T0, "reason": "timeout", "call": 1}),
]


@pytest.mark.parametrize("case", WAIT_CASES, ids=lambda c: c.id)
def test_replaying_a_wait(case: WaitCase) -> None:
    """The wait's first turn (what the journal holds, a buffered signal, or a new wait),
    then its next turn as the attempt takes it."""
    replay = replay_of(*case.events)
    call = replay.take_call()
    opened = replay.open_wait(call, "pyrula.wait_for_signal", "approved", now=case.now,
                              timeout=case.timeout, interrupt=None)
    written = [] if opened.command is None else [opened.command]
    decision = opened
    if opened.turn is WaitTurn.OPEN:
        assert opened.waiting is not None
        decision = replay.resolve_wait(call, "approved", opened.waiting, case.now)
        if decision.command is not None:
            written.append(decision.command)
    assert decision.turn is case.turn
    assert (decision.payload, decision.wake_at) == (case.payload, case.wake_at)
    if case.command is None:
        assert written == []
    else:
        assert written[-1] == case.command


def test_buffered_signals_are_taken_once_each_in_order() -> None:
    replay = replay_of(signal("item", "a"), signal("item", "b"))
    taken = [
        replay.open_wait(replay.take_call(), "pyrula.wait_for_signal", "item", now=T0,
                         timeout=None, interrupt=None)
        for _ in range(3)
    ]
    assert [(t.turn, t.payload) for t in taken] == [
        (WaitTurn.SIGNALLED, "a"), (WaitTurn.SIGNALLED, "b"), (WaitTurn.OPEN, None),
    ]


def test_an_interrupt_records_what_it_asks() -> None:
    replay = replay_of()
    opened = replay.open_wait(replay.take_call(), "pyrula.interrupt", "pyrula.interrupt",
                              now=T0, timeout=None, interrupt={"question": "ship?"})
    assert opened.command == {
        "type": "run:waiting", "ts": T0, "op": "pyrula.interrupt", "call": 1,
        "signal": "pyrula.interrupt", "interrupt": {"question": "ship?"},
    }


# --- the journal as the attempt writes to it -------------------------------------------------


def test_written_events_get_their_seqs_after_what_others_wrote_between() -> None:
    replay = replay_of(waiting(1, "approved"))
    assert replay.last_seq == 3
    mine = [step_failed(T0, "charge", 2, 1, "ValueError", "no")]
    # The store put a signal at seq 4, so the event written lands at 5.
    assert replay.has_gap(len(mine), 5)
    assert not replay.has_gap(len(mine), 4)
    arrived = {**signal("approved", 1), "seq": 4}
    replay.absorb(mine, 5, [arrived, {**mine[0], "seq": 5}])
    assert [e["seq"] for e in replay.journal] == [1, 2, 3, 4, 5]
    assert replay.journal[-1] is mine[0]
    assert replay.first_unconsumed("approved") == arrived


def test_events_others_wrote_between_join_the_journal_in_seq_order() -> None:
    """Two signals arrived while the attempt wrote (read back in any order): the journal
    holds them in seq order before the attempt's event, and a wait takes the older."""
    replay = replay_of(waiting(1, "approved"))
    mine = [step_failed(T0, "charge", 2, 1, "ValueError", "no")]
    first, second = ({**signal("approved", n), "seq": n} for n in (4, 5))
    replay.absorb(mine, 6, [second, first])
    assert [e["seq"] for e in replay.journal] == [1, 2, 3, 4, 5, 6]
    assert replay.first_unconsumed("approved") == first


def test_the_run_started_when_its_first_attempt_did() -> None:
    assert replay_of().started_at() == T0
    assert Replay([], workflow="w", run_id="r").started_at() is None


@pytest.mark.parametrize("module", [replay_module, handlers_module])
def test_replay_does_no_io_and_knows_no_event_loop(module: Any) -> None:
    tree = ast.parse(Path(module.__file__).read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    pyrula = {m for m in imported if m and m.startswith("pyrula")}
    assert pyrula <= {"pyrula.workflows.errors", "pyrula.workflows.events",
                      "pyrula.workflows.handlers"}
    assert not {m.split(".")[0] for m in imported if m} & {
        "asyncio", "concurrent", "threading", "time", "socket", "os", "random",
    }
