"""The invariant checker on journals and ledgers built by hand: each violation it exists to
catch is caught, and the documented re-run window is counted, not blamed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pyrula.invariants import Execution, Fails, Ledger, check, count_stale_refusals, read_ledger
from pyrula.workflows import StepInfo


def _journal(*events: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"seq": i, "type": t, "ts": float(i), **f} for i, (t, f) in enumerate(events, 1)]


def _ran(call: int, attempt: int, result: Any, *, run: str = "r1", try_: int = 1,
         pid: int = 100) -> Execution:
    return Execution(run, "w", f"s{call}", call, attempt, try_, pid, 0.0, 0.0, result)


SUBMITTED = ("run:submitted", {"name": "w", "params": {}})


def _started(attempt: int) -> tuple[str, dict[str, Any]]:
    return ("run:started", {"attempt": attempt, "worker": f"w{attempt}"})


def _done(call: int, result: Any) -> tuple[str, dict[str, Any]]:
    return ("step:completed", {"step": f"s{call}", "call": call, "result": result})


def _completed(result: Any) -> tuple[str, dict[str, Any]]:
    return ("run:completed", {"result": result})


def test_a_clean_run_is_ok_and_the_line_has_every_count() -> None:
    journals = {"r1": _journal(SUBMITTED, _started(1), _done(1, 1), _done(2, 2), _completed(2))}
    report = check(journals, {"r1": 2}, [_ran(1, 1, 1), _ran(2, 1, 2)], stale_writes_refused=3)
    assert report.ok, report.problems
    assert report.line() == ("runs=1 lost=0 double_completion=0 rerun_after_record=0 "
                             "rerun_in_window=0 stale_writes_refused=3 wrong_result=0 "
                             "unattributed=0")
    assert report.executions == 2


def test_a_step_lost_to_a_crash_and_run_again_is_in_the_window_attributed_to_it() -> None:
    journals = {"r1": _journal(SUBMITTED, _started(1), _done(1, 1),
                               ("run:requeued", {"reason": "orphaned"}), _started(2),
                               _done(2, 2), _completed(2))}
    ran = [_ran(1, 1, 1), _ran(2, 1, 2, pid=100), _ran(2, 2, 2, pid=200)]
    report = check(journals, {"r1": 2}, ran)
    assert report.ok and report.rerun_in_window == 1
    assert report.faults == {"orphaned": 1}


def test_a_recorded_step_that_runs_again_is_caught() -> None:
    journals = {"r1": _journal(SUBMITTED, _started(1), _done(1, 1),
                               ("run:requeued", {"reason": "orphaned"}), _started(2),
                               _completed(1))}
    report = check(journals, {"r1": 1}, [_ran(1, 1, 1), _ran(1, 2, 1, pid=200)])
    assert not report.ok and report.rerun_after_record == 1
    assert "ran in attempt 2" in report.problems[0]


def test_the_same_try_twice_in_one_attempt_is_caught() -> None:
    journals = {"r1": _journal(SUBMITTED, _started(1), _done(1, 1), _completed(1))}
    report = check(journals, {"r1": 1}, [_ran(1, 1, 1), _ran(1, 1, 1, pid=300)])
    assert report.rerun_after_record == 1 and not report.ok


def test_a_rerun_no_fault_explains_is_unattributed() -> None:
    # Attempt 1 parked normally (no requeue); its execution of call 2 was never recorded.
    journals = {"r1": _journal(SUBMITTED, _started(1), _done(1, 1),
                               ("run:sleeping", {"call": 2, "wake_at": 0.0}), _started(2),
                               _done(3, 2), _completed(2))}
    report = check(journals, {"r1": 2}, [_ran(1, 1, 1), _ran(3, 1, 2), _ran(3, 2, 2)])
    assert report.unattributed == 1 and not report.ok


def test_lost_double_completion_and_wrong_results() -> None:
    journals = {
        "never-ended": _journal(SUBMITTED, _started(1)),
        "twice": _journal(SUBMITTED, _started(1), _completed(1), _completed(1)),
        "step-twice": _journal(SUBMITTED, _started(1), _done(1, 1), _done(1, 1), _completed(1)),
        "wrong": _journal(SUBMITTED, _started(1), _completed(41)),
        "quarantined": _journal(SUBMITTED, _started(1),
                                ("run:error", {"code": "max_retries", "message": "m"})),
    }
    expected = {"never-ended": 1, "twice": 1, "step-twice": 1, "wrong": 42,
                "quarantined": Fails("max_retries"), "unknown": 1}
    report = check(journals, expected)
    assert (report.lost, report.double_completion, report.wrong_result) == (2, 2, 1)
    assert report.runs == 6 and not report.ok


def test_a_journal_result_that_differs_from_what_the_step_returned() -> None:
    journals = {"r1": _journal(SUBMITTED, _started(1), _done(1, 7), _completed(7))}
    report = check(journals, {"r1": 7}, [_ran(1, 1, 1)])
    assert report.wrong_result == 1


def test_a_quarantined_run_s_executions_are_attributed_to_its_crashes() -> None:
    journals = {"p": _journal(SUBMITTED, _started(1), ("run:requeued", {"reason": "orphaned"}),
                              _started(2), ("run:error", {"code": "max_retries"}))}
    report = check(journals, {"p": Fails("max_retries")},
                   [_ran(1, 1, None, run="p"), _ran(1, 2, None, run="p")])
    assert report.ok and report.rerun_in_window == 2
    assert report.faults == {"orphaned": 1, "quarantined": 1}


def test_the_ledger_round_trips_and_skips_a_line_cut_by_a_kill(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger")
    info = StepInfo("r1", "w", "s", 3, 2, 1)
    ledger.record({"v": 1}, started=5.0, info=info)
    with open(next((tmp_path / "ledger").glob("ledger-*.jsonl")), "ab") as f:
        f.write(b'{"run": "r1", "wor')  # a write cut short
    [execution] = list(read_ledger(tmp_path / "ledger"))
    assert (execution.run_id, execution.call, execution.attempt, execution.result) == (
        "r1", 3, 2, {"v": 1})
    assert execution.started == 5.0 and execution.ended >= 5.0
    with pytest.raises(RuntimeError, match="outside a journaled step"):
        ledger.record(1)


def test_stale_refusals_are_counted_from_either_log_format() -> None:
    log = "\n".join([
        '{"event": "run_lock_lost", "run_id": "a"}',
        "12:00:00.000 WARNING pyrula.worker: run b: lock lost to another attempt; stood down",
        '{"event": "run_requeued"}',
    ])
    assert count_stale_refusals(log) == 2
