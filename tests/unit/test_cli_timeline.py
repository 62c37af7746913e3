"""The run timeline ``pyrula runs show`` prints: attempts, steps and parked spans read from
a journal, with a crash's requeue told apart from a step's own retries."""

from __future__ import annotations

from typing import Any

from pyrula.cli.timeline import describe, iso, timeline

T = 1_780_000_000.0


def _journal(*events: tuple[str, float, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"seq": i, "type": kind, "ts": T + at, **fields}
            for i, (kind, at, fields) in enumerate(events, 1)]


def _at(seconds: float) -> str:
    return iso(T + seconds, precise=True) or ""


def test_iso_is_utc_with_a_z() -> None:
    assert iso(T) == "2026-05-28T20:26:40Z"
    assert iso(T + 0.25, precise=True) == "2026-05-28T20:26:40.250Z"
    assert iso(None) is None


def test_a_requeue_after_a_crash_is_a_new_attempt_not_a_step_retry() -> None:
    entries = timeline(_journal(
        ("run:submitted", 0, {"name": "w", "params": None}),
        ("run:started", 1, {"attempt": 1, "worker": "a"}),
        ("step:started", 1, {"step": "pay", "call": 1, "attempt": 1}),
        ("run:requeued", 5, {"reason": "orphaned", "crashes": 1}),
        ("run:started", 6, {"attempt": 2, "worker": "b"}),
        ("step:started", 6, {"step": "pay", "call": 1, "attempt": 1}),
        ("step:failed", 7, {"step": "pay", "call": 1, "attempt": 1, "will_retry": True}),
        ("run:sleeping", 7, {"step": "pay", "call": 1, "wake_at": T + 9, "reason": "retry"}),
        ("run:woken", 9, {"reason": "timer"}),
        ("run:started", 9, {"attempt": 3, "worker": "b"}),
        ("step:started", 9, {"step": "pay", "call": 1, "attempt": 2}),
        ("step:completed", 10, {"step": "pay", "call": 1, "result": 1}),
        ("run:waiting", 10, {"op": "pyrula.wait", "call": 2, "signal": "ok"}),
    ))
    kinds = [(e["kind"], e.get("attempt") or e.get("name") or e.get("why")) for e in entries]
    assert kinds == [("attempt", 1), ("step", "pay"), ("attempt", 2), ("parked", "retry of "
                     "step 'pay'"), ("attempt", 3), ("parked", "waiting for signal 'ok'")]
    assert entries[2]["after"] == "requeued: orphaned"
    assert entries[4]["after"] is None  # woken from a retry's sleep: not a requeue
    step = entries[1]
    assert (step["attempts"], step["outcome"]) == (3, "completed")
    assert step["finished"] == _at(10)
    assert entries[3]["seconds"] == 2.0 and entries[3]["until"] == _at(9)
    assert entries[5]["until"] is None and "_from" not in entries[5]
    lines = [describe(e) for e in entries]
    assert lines[2].endswith("attempt 2 (requeued: orphaned) on b")
    assert lines[1].endswith("step pay (call 1): completed, 3 tries -> " + _at(10))
    assert lines[3].endswith("parked, retry of step 'pay': 2.0 s until " + _at(9))
    assert lines[5].endswith("parked, waiting for signal 'ok': still parked")


def test_a_step_that_fails_for_good_and_a_step_still_running() -> None:
    entries = timeline(_journal(
        ("run:started", 0, {"attempt": 1, "worker": "a"}),
        ("step:started", 0, {"step": "a", "call": 1, "attempt": 1}),
        ("step:failed", 1, {"step": "a", "call": 1, "attempt": 1, "will_retry": False}),
        ("step:started", 1, {"step": "b", "call": 2, "attempt": 1}),
    ))
    assert [(e.get("name"), e.get("outcome")) for e in entries[1:]] == [
        ("a", "failed"), ("b", "running")]
    assert describe(entries[2]).endswith("step b (call 2): running, 1 try")


def test_a_requeue_with_the_fleets_evidence_says_how_the_process_died() -> None:
    evidence = {"cause": "worker_crash", "worker": "vm-7-aa", "exit": "signal SIGKILL",
                "exit_code": -9, "exit_signal": "SIGKILL", "pid": 7, "rss_bytes": 28_400_000,
                "killed_for": None}
    entries = timeline(_journal(
        ("run:submitted", 0, {"name": "w", "params": None}),
        ("run:started", 1, {"attempt": 1, "worker": "vm-7-aa"}),
        ("run:requeued", 2, {"reason": "orphaned", "crashes": 1, "detail": evidence}),
        ("run:started", 3, {"attempt": 2, "worker": "vm-8-bb"}),
        ("run:requeued", 4, {"reason": "shutdown"}),
        ("run:started", 5, {"attempt": 3, "worker": "vm-9-cc"}),
    ))
    attempts = [e for e in entries if e["kind"] == "attempt"]
    assert attempts[1]["after"] == (
        "requeued: orphaned; vm-7-aa died: SIGKILL, pid 7, RSS 28 MB")
    assert attempts[1]["evidence"] == evidence
    assert (attempts[2]["after"], attempts[2]["evidence"]) == ("requeued: shutdown", None)
    assert describe(attempts[1]).endswith(
        "attempt 2 (requeued: orphaned; vm-7-aa died: SIGKILL, pid 7, RSS 28 MB) on vm-8-bb")


def test_a_patch_marker_is_an_entry_of_its_own() -> None:
    entries = timeline(_journal(
        ("run:submitted", 0, {"name": "w", "params": None}),
        ("run:started", 1, {"attempt": 1, "worker": "a"}),
        ("patch:applied", 1, {"op": "pyrula.patched", "call": 1, "patch": "fix-tax"}),
        ("step:started", 2, {"step": "pay", "call": 2, "attempt": 1}),
        ("step:completed", 3, {"step": "pay", "call": 2, "result": 1}),
    ))
    assert [e["kind"] for e in entries] == ["attempt", "patch", "step"]
    assert entries[1] == {"kind": "patch", "patch": "fix-tax", "call": 1, "at": _at(1)}
    assert describe(entries[1]) == f"{_at(1)}  patch fix-tax applied (call 1)"
