"""The invariant checker: journals and the side-effect ledger against what must hold.

Given every submitted run's journal, the ledger of step executions and each run's expected
end, :func:`check` counts:

- ``lost``: a submitted run with no terminal event (or no journal at all);
- ``double_completion``: a run with more than one terminal event, or a step with more than
  one ``step:completed`` in its journal;
- ``rerun_after_record``: an execution of a step that began in a later attempt than the one
  whose completion the journal recorded, or a second execution of the same try of a step
  within one attempt: a recorded step ran again, outside the documented window;
- ``rerun_in_window``: an execution whose completion was never recorded, in an attempt that
  ended by a named fault (the reason of the ``run:requeued`` that ended it, or the run's
  quarantine): the window the guarantees allow. Each is attributed to its fault (see
  ``Report.faults``); one whose attempt ended by no named fault counts as ``unattributed``;
- ``wrong_result``: a run that did not end as expected, or a recorded step result that
  differs from what the execution of that attempt returned;
- ``stale_writes_refused``: handed in by the caller (fenced writes the store refused, as
  the workers logged them, see :func:`count_stale_refusals`).

The report is one line, ``runs=… lost=0 double_completion=0 rerun_after_record=0
rerun_in_window=K stale_writes_refused=… wrong_result=0 unattributed=0``, and it is
``ok`` only when every count but ``rerun_in_window`` and ``stale_writes_refused`` is 0.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyrula.invariants.ledger import Execution
from pyrula.workflows.errors import WorkflowNotFound
from pyrula.workflows.events import TERMINAL_EVENTS, Event, EventType

#: How many details of each kind of violation a report keeps.
DETAILS = 20


@dataclass(frozen=True, slots=True)
class Fails:
    """The expected end of a run that must fail: ``run:error`` with this ``code``
    (``max_retries`` for a run that is to be quarantined, say)."""

    code: str


@dataclass(slots=True)
class Report:
    runs: int = 0
    lost: int = 0
    double_completion: int = 0
    rerun_after_record: int = 0
    rerun_in_window: int = 0
    stale_writes_refused: int = 0
    wrong_result: int = 0
    unattributed: int = 0
    #: executions the ledger holds, in all
    executions: int = 0
    #: the faults the in-window re-runs are attributed to: reason -> re-runs
    faults: Counter[str] = field(default_factory=Counter)
    #: the first few violations of each kind, for a person to read
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.double_completion or self.rerun_after_record
                    or self.wrong_result or self.unattributed)

    def line(self) -> str:
        return (f"runs={self.runs} lost={self.lost} double_completion={self.double_completion} "
                f"rerun_after_record={self.rerun_after_record} "
                f"rerun_in_window={self.rerun_in_window} "
                f"stale_writes_refused={self.stale_writes_refused} "
                f"wrong_result={self.wrong_result} unattributed={self.unattributed}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs, "lost": self.lost, "double_completion": self.double_completion,
            "rerun_after_record": self.rerun_after_record,
            "rerun_in_window": self.rerun_in_window,
            "stale_writes_refused": self.stale_writes_refused,
            "wrong_result": self.wrong_result, "unattributed": self.unattributed,
            "executions": self.executions, "faults": dict(self.faults), "ok": self.ok,
            "problems": list(self.problems),
        }

    def _problem(self, kind: str, text: str) -> None:
        if sum(p.startswith(kind + ":") for p in self.problems) < DETAILS:
            self.problems.append(f"{kind}: {text}")


def check(
    journals: Mapping[str, Sequence[Event] | None],
    expected: Mapping[str, Any],
    executions: Iterable[Execution] = (),
    *,
    stale_writes_refused: int = 0,
) -> Report:
    """Check every run of ``expected`` (run id -> its result, or :class:`Fails`) against its
    journal in ``journals`` (None or missing: the store does not know the run) and the
    ``executions`` the ledger recorded (executions of runs not in ``expected`` are
    ignored: another load's)."""
    report = Report(runs=len(expected), stale_writes_refused=stale_writes_refused)
    by_run: dict[str, list[Execution]] = defaultdict(list)
    for execution in executions:
        if execution.run_id in expected:
            by_run[execution.run_id].append(execution)
            report.executions += 1
    for run_id, want in expected.items():
        journal = journals.get(run_id)
        if not journal:
            report.lost += 1
            report._problem("lost", f"run {run_id}: the store has no journal for it")
            continue
        _check_run(report, run_id, sorted(journal, key=lambda e: int(e["seq"])), want,
                   by_run.get(run_id, []))
    return report


def _check_run(report: Report, run_id: str, journal: list[Event], want: Any,
               executions: list[Execution]) -> None:
    _check_end(report, run_id, journal, want)
    recorded, ended_by = _recorded(report, run_id, journal)
    seen: set[tuple[int, int, int]] = set()
    for execution in sorted(executions, key=lambda x: (x.call, x.attempt, x.started)):
        _check_execution(report, run_id, execution, seen, recorded, ended_by)


def _check_end(report: Report, run_id: str, journal: list[Event], want: Any) -> None:
    """One terminal event, the one expected."""
    terminal = [e for e in journal if e["type"] in TERMINAL_EVENTS]
    if not terminal:
        report.lost += 1
        report._problem("lost", f"run {run_id}: no terminal event (last: {journal[-1]['type']})")
    elif len(terminal) > 1:
        report.double_completion += 1
        report._problem("double_completion",
                        f"run {run_id}: {[e['type'] for e in terminal]}")
    if terminal and not _ended_as(terminal[0], want):
        report.wrong_result += 1
        report._problem("wrong_result", f"run {run_id}: ended {_summary(terminal[0])}, "
                                        f"want {_want(want)}")


def _recorded(report: Report, run_id: str, journal: list[Event]
              ) -> tuple[dict[int, tuple[int, Any]], dict[int, str]]:
    """call -> (the attempt that recorded it, its result); attempt -> the named fault
    that ended it. A call recorded twice is counted."""
    attempt = 0
    recorded: dict[int, tuple[int, Any]] = {}
    ended_by: dict[int, str] = {}
    for event in journal:
        kind = event["type"]
        if kind == EventType.RUN_STARTED:
            attempt = int(event.get("attempt") or attempt + 1)
        elif kind == EventType.STEP_COMPLETED and "call" in event:
            call = int(event["call"])
            if call in recorded:
                report.double_completion += 1
                report._problem("double_completion",
                                f"run {run_id}: call {call} recorded twice")
            else:
                recorded[call] = (attempt, event.get("result"))
        elif kind == EventType.RUN_REQUEUED:
            ended_by.setdefault(attempt, str(event.get("reason") or "requeued"))
        elif kind == EventType.RUN_ERROR and event.get("code") == "max_retries":
            ended_by.setdefault(attempt, "quarantined")
    return recorded, ended_by


def _check_execution(report: Report, run_id: str, execution: Execution,
                     seen: set[tuple[int, int, int]], recorded: dict[int, tuple[int, Any]],
                     ended_by: dict[int, str]) -> None:
    """One execution of a step against what the journal recorded of its call."""
    key = (execution.call, execution.attempt, execution.step_attempt)
    where = f"run {run_id} call {execution.call} ({execution.step})"
    if key in seen:
        report.rerun_after_record += 1
        report._problem("rerun_after_record",
                        f"{where}: try {execution.step_attempt} ran twice in attempt "
                        f"{execution.attempt}")
        return
    seen.add(key)
    record = recorded.get(execution.call)
    if record is not None and execution.attempt == record[0]:
        if execution.result != record[1]:
            report.wrong_result += 1
            report._problem("wrong_result", f"{where}: journal holds {record[1]!r}, the "
                                            f"execution returned {execution.result!r}")
        return
    if record is not None and execution.attempt > record[0]:
        report.rerun_after_record += 1
        report._problem("rerun_after_record",
                        f"{where}: ran in attempt {execution.attempt} (pid "
                        f"{execution.pid}) after attempt {record[0]} recorded it")
        return
    fault = ended_by.get(execution.attempt)
    if fault is None:
        report.unattributed += 1
        report._problem("unattributed",
                        f"{where}: ran in attempt {execution.attempt} (pid "
                        f"{execution.pid}), never recorded, and no fault ended that attempt")
        return
    report.rerun_in_window += 1
    report.faults[fault] += 1


def _ended_as(event: Event, want: Any) -> bool:
    if isinstance(want, Fails):
        return bool(event["type"] == EventType.RUN_ERROR and event.get("code") == want.code)
    return bool(event["type"] == EventType.RUN_COMPLETED and event.get("result") == want)


def _summary(event: Event) -> str:
    if event["type"] == EventType.RUN_COMPLETED:
        return f"completed with {event.get('result')!r}"
    if event["type"] == EventType.RUN_ERROR:
        return f"with run:error {event.get('code')} ({event.get('message')})"
    return str(event["type"])


def _want(want: Any) -> str:
    return f"run:error {want.code}" if isinstance(want, Fails) else f"result {want!r}"


async def collect_journals(store: Any, run_ids: Iterable[str],
                           batch: int = 200) -> dict[str, list[Event] | None]:
    """Every run's journal from ``store`` (``read_events``), ``batch`` reads at a time;
    None for a run the store does not know."""
    async def read(run_id: str) -> list[Event] | None:
        try:
            events: list[Event] = await store.read_events(run_id)
            return events
        except WorkflowNotFound:
            return None

    ids = list(run_ids)
    journals: dict[str, list[Event] | None] = {}
    for start in range(0, len(ids), batch):
        chunk = ids[start:start + batch]
        for run_id, journal in zip(chunk, await asyncio.gather(*map(read, chunk)), strict=True):
            journals[run_id] = journal
    return journals


def count_stale_refusals(log_text: str) -> int:
    """Fenced writes the store refused, from a worker's or a fleet's log (either format):
    each is one ``run_lock_lost`` event, logged when an attempt's write met a newer one."""
    return sum(1 for line in log_text.splitlines()
               if '"run_lock_lost"' in line or "lock lost to another attempt" in line)
