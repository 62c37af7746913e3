"""The side-effect ledger: what step code really executed, written by the step itself.

A step that calls :meth:`Ledger.record` just before it returns appends one JSON line
``{run, workflow, step, call, attempt, step_attempt, pid, started, ended, result}`` to a
file of its own process (``ledger-<pid>.jsonl`` in the ledger's directory, opened
``O_APPEND``). The line is written with one ``write`` before the step's result reaches the
engine, so it records every execution, including one whose completion the journal never
got (its process was killed between the two). The page cache outlives a killed process,
so no ``fsync`` is needed unless the machine itself is to lose power.

The journal says what the engine recorded; the ledger says what ran. The invariant checker
(:mod:`pyrula.invariants.checker`) compares the two.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pyrula.workflows.definition import StepInfo, step_info


@dataclass(frozen=True, slots=True)
class Execution:
    """One execution of a step that reached its end, as the ledger holds it."""

    run_id: str
    workflow: str
    step: str
    call: int
    attempt: int
    step_attempt: int
    pid: int
    started: float
    ended: float
    result: Any


class Ledger:
    """An append-only record of step executions in ``directory`` (created if missing)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._fd: int | None = None
        self._pid = -1
        self._lock = threading.Lock()

    def record(self, result: Any, *, started: float | None = None,
               info: StepInfo | None = None) -> None:
        """Write that the current step (``step_info()``, or ``info``) produced ``result``
        (any JSON value). Call it last in the step, just before returning ``result``;
        ``started`` is when the step began (epoch seconds; now if not given)."""
        info = info or step_info()
        if info is None:
            raise RuntimeError("Ledger.record() is called outside a journaled step")
        now = time.time()
        line = orjson.dumps({
            "run": info.run_id, "workflow": info.workflow, "step": info.step,
            "call": info.call, "attempt": info.attempt, "step_attempt": info.step_attempt,
            "pid": os.getpid(), "started": now if started is None else started, "ended": now,
            "result": result,
        }) + b"\n"
        os.write(self._file(), line)

    def _file(self) -> int:
        pid = os.getpid()
        with self._lock:
            if self._fd is None or self._pid != pid:  # a forked child opens its own file
                self.directory.mkdir(parents=True, exist_ok=True)
                path = self.directory / f"ledger-{pid}.jsonl"
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                self._pid = pid
            return self._fd

    def executions(self) -> list[Execution]:
        """Every execution recorded in the directory, by every process."""
        return list(read_ledger(self.directory))


def read_ledger(directory: str | os.PathLike[str]) -> Iterator[Execution]:
    """Read every ledger file in ``directory``; a line cut short by a kill (the only kind
    of damage an ``O_APPEND`` write can suffer) is skipped: that execution did not end."""
    for path in sorted(Path(directory).glob("ledger-*.jsonl")):
        for raw in path.read_bytes().splitlines():
            try:
                row = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            yield Execution(
                str(row["run"]), str(row["workflow"]), str(row["step"]), int(row["call"]),
                int(row["attempt"]), int(row["step_attempt"]), int(row["pid"]),
                float(row["started"]), float(row["ended"]), row["result"],
            )
