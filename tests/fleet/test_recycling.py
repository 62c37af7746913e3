"""Children are recycled one at a time, capacity kept: after ``--max-runs-per-child`` runs,
above ``--max-memory-per-child`` RSS, and when their claim loop stalls (``--stall-timeout``)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from pyrula.workflows import SyncWorkflowClient
from tests.fleet.fleetprocs import QUICK, Fleet, Fleets, StatusRecorder, pids, write_app


def _serve_until_recycled(fleet: Fleet, client: SyncWorkflowClient, restarts: int,
                          timeout: float = 40.0) -> dict[str, object]:
    """Submit batches of runs, each completing, until the fleet replaced ``restarts``
    children; the last /status."""
    deadline = time.monotonic() + timeout
    batch = 0
    while True:
        runs = [client.submit("fa_load", {"tag": f"b{batch}-{i}"}) for i in range(20)]
        for run in runs:
            assert client.result(run.run_id, timeout=30) == ["a", "b"]
        batch += 1
        status = fleet.status()
        assert status is not None
        if status["restarts"] >= restarts:
            return status
        assert time.monotonic() < deadline, f"only {status['restarts']} restarts: {status}"


def test_max_runs_per_child_recycles_children_while_runs_keep_completing(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    fleet = fleets.start("-n", "2", "--max-runs-per-child", "10", *QUICK)
    before = pids(fleet.wait_ready(2))
    with StatusRecorder(fleet) as recorder:
        _serve_until_recycled(fleet, client, restarts=3)
        after = fleet.wait_ready(2)
    print(f"max-runs-per-child: {after['restarts']} restarts, fewest ready children seen: "
          f"{recorder.min_ready()}")
    assert recorder.min_ready() >= 1  # one at a time: at most one child short
    assert set(pids(after).values()) != set(before.values())
    assert after["restarts"] == sum(c["restarts"] for c in after["children"])
    log = fleet.log()
    assert "runs done)" in log  # child_recycle: slot N queued (M runs done)
    assert "after draining" in log and "died" not in log
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def test_max_memory_per_child_recycles_children_above_it(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    # Every child is above 1 MiB of RSS: each is replaced as soon as it is measured, one
    # at a time, and the fleet still serves.
    fleet = fleets.start("-n", "2", "--max-memory-per-child", "1MiB", *QUICK)
    fleet.wait_ready(2)
    with StatusRecorder(fleet) as recorder:
        status = _serve_until_recycled(fleet, client, restarts=2)
    print(f"max-memory-per-child: {status['restarts']} restarts, fewest ready children "
          f"seen: {recorder.min_ready()}")
    assert recorder.min_ready() >= 1
    log = fleet.log()
    assert "queued (RSS" in log and "died" not in log
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


STALL_APP = '''
"""fleetapp, with a claim loop that hangs after its first claim in each child."""

import asyncio

import fleetapp  # noqa: F401  (the workflows)
from pyrula.workflows.stores.sqlite import SQLiteStore

_claim = SQLiteStore.claim
_calls = 0


async def _claim_then_hang(self, *args, **kwargs):
    global _calls
    _calls += 1
    if _calls > 1:
        await asyncio.Event().wait()  # the claim loop stops; the event loop still turns
    return await _claim(self, *args, **kwargs)


SQLiteStore.claim = _claim_then_hang
'''


def test_a_child_whose_claim_loop_stalls_is_recycled(fleets: Fleets, tmp_path: Path) -> None:
    write_app(tmp_path, STALL_APP, module="stallapp")
    fleet = fleets.start("-n", "1", "--stall-timeout", "2", *QUICK, app="stallapp")
    first = pids(fleet.wait_ready(1))[0]
    replaced = fleet.wait_status(
        lambda s: s["restarts"] >= 1 and s["children"][0]["pid"] != first
        and s["children"][0]["state"] == "ready", what="the stalled child replaced")
    assert replaced["children"][0]["restarts"] >= 1
    log = fleet.wait_for_log(f"child_exited: slot 0 pid {first} (exit code 0) after draining")
    assert f"child_stalled: slot 0 pid {first} has claimed nothing" in log
    # Its loop kept turning: it was recycled (drained), not killed as unresponsive.
    assert "child_unresponsive" not in log
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0
