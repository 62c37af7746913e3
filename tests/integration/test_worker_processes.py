"""Recovery between real worker processes over one SQLite file, with real signals.

A worker killed (SIGKILL) or frozen (SIGSTOP) while a step runs loses its run to another
worker after ``lock_ttl``; the run completes there, a recorded step never runs twice, and
the frozen worker, once continued, can neither append to nor complete the run. A frozen
worker that nobody replaced simply carries on when it wakes.
"""

from __future__ import annotations

import signal
import time
from typing import Any

from pyrula.workflows import SyncWorkflowClient
from tests.integration.workerprocs import WorkerProcess, Workers

FAST_RECOVERY = ("--lock-ttl", "1", "--orphan-scan-interval", "0.5")


def _of(journal: list[dict[str, Any]], type_: str, **fields: Any) -> list[dict[str, Any]]:
    return [
        e for e in journal
        if e["type"] == type_ and all(e.get(k) == v for k, v in fields.items())
    ]


def _worker_of(started: dict[str, Any], worker: WorkerProcess) -> bool:
    return f"-{worker.pid}-" in str(started["worker"])


def _assert_recovered_by(
    journal: list[dict[str, Any]], first: WorkerProcess, second: WorkerProcess
) -> None:
    """Attempt 1 on ``first``, reclaimed as an orphan, attempt 2 on ``second``, one end."""
    started = _of(journal, "run:started")
    assert [e["attempt"] for e in started] == [1, 2]
    assert _worker_of(started[0], first) and _worker_of(started[1], second)
    requeued = _of(journal, "run:requeued")
    assert [e["reason"] for e in requeued] == ["orphaned"]
    assert started[0]["seq"] < requeued[0]["seq"] < started[1]["seq"]
    assert len(_of(journal, "step:completed", step="one")) == 1
    assert len(_of(journal, "step:completed", step="two")) == 1
    assert len(_of(journal, "run:completed")) == 1
    assert journal[-1]["type"] == "run:completed"


def test_a_run_killed_mid_step_is_finished_by_another_worker(
    workers: Workers, client: SyncWorkflowClient
) -> None:
    run = client.submit("pp_two_steps", {"tag": "k"})
    a = workers.start(*FAST_RECOVERY, name="a")
    workers.wait_ran("two", "k", a.pid)  # step one is recorded; step two is blocked in A

    a.send(signal.SIGKILL)
    assert a.wait() == -signal.SIGKILL
    workers.open_gate("k")
    b = workers.start(*FAST_RECOVERY, name="b")

    result = client.result(run.run_id, timeout=20)
    assert result == {"one": "one", "two": f"two-{b.pid}"}
    # The recorded step never runs again; the one that was running when A died runs
    # again once, in B: the documented window (the lock was lost while it ran).
    assert workers.ran("one", "k") == [a.pid]
    assert workers.ran("two", "k") == [a.pid, b.pid]
    _assert_recovered_by(client.events(run.run_id), a, b)
    assert client.get(run.run_id).attempt == 2
    b.wait_for_log("run_reclaimed")

    b.send(signal.SIGTERM)
    assert b.wait() == 0


def test_a_frozen_worker_that_wakes_cannot_write_to_the_run_it_lost(
    workers: Workers, client: SyncWorkflowClient
) -> None:
    run = client.submit("pp_two_steps", {"tag": "f"})
    a = workers.start(*FAST_RECOVERY, "--log-format", "json", name="a")
    workers.wait_ran("two", "f", a.pid)

    a.send(signal.SIGSTOP)  # the whole process: its loop, its renewal thread, its step
    b = workers.start(*FAST_RECOVERY, name="b")
    workers.wait_ran("two", "f", b.pid)  # B reclaimed the run and re-runs step two
    workers.open_gate("f")
    assert client.result(run.run_id, timeout=20) == {"one": "one", "two": f"two-{b.pid}"}
    finished = client.events(run.run_id)

    # A wakes and stands down without touching the run: either its step two returns and
    # the store refuses the write (stale fencing token), or its renewal thread finds the
    # lock lost first; both end the attempt as run_lock_lost.
    a.send(signal.SIGCONT)
    a.wait_for_log('"event": "run_lock_lost"')
    lost = [e for e in a.json_events() if e.get("event") == "run_lock_lost"]
    assert [e["run_id"] for e in lost] == [run.run_id]

    assert client.events(run.run_id) == finished
    _assert_recovered_by(finished, a, b)
    info = client.get(run.run_id)
    assert info.status == "completed" and info.attempt == 2
    assert info.result == {"one": "one", "two": f"two-{b.pid}"}
    assert workers.ran("one", "f") == [a.pid]
    assert workers.ran("two", "f") == [a.pid, b.pid]

    for worker in (a, b):
        worker.send(signal.SIGTERM)
    assert [a.wait(), b.wait()] == [0, 0]


def test_a_worker_frozen_past_its_liveness_bound_that_nobody_replaced_keeps_its_run(
    workers: Workers, client: SyncWorkflowClient
) -> None:
    run = client.submit("pp_two_steps", {"tag": "z"})
    # lock_ttl 0.5: renewal every 0.17 s, liveness bound 1.5 s; no orphan scan meanwhile.
    a = workers.start("--lock-ttl", "0.5", name="a")
    workers.wait_ran("two", "z", a.pid)

    a.send(signal.SIGSTOP)
    time.sleep(2.5)  # the length of the freeze is what is tested: past the 1.5 s bound
    a.send(signal.SIGCONT)
    a.wait_for_log("worker_resumed")
    workers.open_gate("z")

    assert client.result(run.run_id, timeout=15) == {"one": "one", "two": f"two-{a.pid}"}
    # The loop was not blocked, the whole process was stopped: no stand-down, no re-run.
    journal = client.events(run.run_id)
    assert _of(journal, "run:requeued") == []
    assert [e["attempt"] for e in _of(journal, "run:started")] == [1]
    assert workers.ran("two", "z") == [a.pid]
    assert "stood down" not in a.log()
    a.send(signal.SIGTERM)
    assert a.wait() == 0
