"""Children recycled under load, by ``--max-runs-per-child`` and by
``--max-memory-per-child``: one at a time, the replacement ready before the old child
drains, so the fleet never has zero ready children (``/status`` polled throughout), and
every run completes once (verdict clean)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from pyrula.workflows import SyncWorkflowClient, ValkeyStore
from tests.chaos.harness import APP, ChaosLoad
from tests.fleet.fleetprocs import QUICK, Fleets, StatusRecorder

pytestmark = pytest.mark.slow

RECYCLES = 4


@pytest.mark.parametrize("limit", [("--max-runs-per-child", "40"),
                                   ("--max-memory-per-child", "1MiB")],
                         ids=["max-runs", "max-memory"])
def test_recycling_under_load_keeps_capacity_and_loses_nothing(
    fleets: Fleets, tmp_path: Path, valkey_url: str, valkey_namespace: str,
    limit: tuple[str, str],
) -> None:
    store = ValkeyStore(valkey_url, namespace=valkey_namespace)
    try:
        load = ChaosLoad(SyncWorkflowClient(store), tmp_path, steps=3, hold=0.02, seed=31)
        fleet = fleets.start("-n", "2", "--namespace", valkey_namespace, *limit, *QUICK,
                             app=APP, store=valkey_url)
        fleet.wait_ready(2, timeout=60)
        with StatusRecorder(fleet) as recorder:
            load.submit(100)

            def until_recycled() -> bool:
                status = recorder.samples[-1] if recorder.samples else None
                recycled = status is not None and status["restarts"] >= RECYCLES
                if not recycled and load.done() >= len(load.expected) - 30:
                    load.submit(50)  # keep the children busy while they are replaced
                return not recycled

            load.wait_all(timeout=90, during=until_recycled)
            final = fleet.wait_ready(2, timeout=30)
        log = fleet.log()
        recycled = log.count("child_recycle")
        print(f"{limit[0]} {limit[1]}: {final['restarts']} recycles under load of "
              f"{len(load.expected)} runs; fewest ready children seen: {recorder.min_ready()} "
              f"in {len(recorder.samples)} /status samples")
        report = load.verdict(store, [log])
        load.assert_holds(report)
        assert final["restarts"] >= RECYCLES and recycled >= RECYCLES
        assert "child_unresponsive" not in log and "died" not in log  # recycled, not killed
        assert recorder.min_ready() >= 1
        # Drained ones finished their runs (or handed them back on shutdown): nothing
        # was orphaned by a recycle.
        assert set(report.faults) <= {"shutdown"}, report.faults
        fleet.send(signal.SIGTERM)
        assert fleet.wait(60) == 0
    finally:
        store.close()
