"""An elastic fleet under load that grows, is upgraded to new code while it is busy, and
shrinks back once the load is done: every run completes once, no step recorded is run
again (verdict clean), each change is logged."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from pyrula.workflows import SyncWorkflowClient, ValkeyStore
from tests.chaos.harness import APP, ChaosLoad, busy_child
from tests.conftest import wait_until
from tests.fleet.fleetprocs import QUICK, Fleets, child_env, write_app

pytestmark = pytest.mark.slow

#: A module the fleet serves beside the bench workflow: its step's source is the build's,
#: so rewriting it makes the upgrade's new generation another build.
MARK = '''
from pyrula.workflows import step


@step(name="chaos.build_mark")
def build_mark() -> str:
    return "{version}"
'''


def test_an_elastic_fleet_grows_upgrades_and_shrinks_under_load_losing_nothing(
    fleets: Fleets, tmp_path: Path, valkey_url: str, valkey_namespace: str
) -> None:
    write_app(tmp_path, MARK.format(version="v1"), "buildmark")
    store = ValkeyStore(valkey_url, namespace=valkey_namespace)
    try:
        load = ChaosLoad(SyncWorkflowClient(store), tmp_path, steps=3, hold=0.05, seed=53)
        fleet = fleets.start(
            "--min", "1", "--max", "3", "--scale-up-after", "0.5", "--scale-down-after", "2",
            "--max-concurrent-runs", "8", "--namespace", valkey_namespace, "--app",
            "buildmark", *QUICK, app=APP, store=valkey_url,
            env=child_env(PYRULA_SCALE_MIN_CPU_FREE="0"))
        fleet.wait_ready(1, timeout=60)
        load.submit(200)
        fleet.wait_for_log("fleet_scaled: up", 30)
        # Runs in flight when the upgrade comes, however fast the first ones went.
        load.submit(100)
        wait_until(lambda: busy_child(fleet, load), 30, what="a child with runs in flight")

        write_app(tmp_path, MARK.format(version="v2"), "buildmark")
        fleet.send(signal.SIGUSR2)
        load.fault("SIGUSR2", fleet.pid)
        fleet.wait_for_log("child_retiring", 30)
        load.submit(100)  # more while the generations change
        load.wait_all(timeout=120)
        fleet.wait_for_log("fleet_upgraded", 60)
        fleet.wait_status(lambda s: len(s["children"]) == 1 and s["desired"] == 1, 60,
                          what="back to --min")

        log = fleet.log()
        report = load.verdict(store, [log])
        load.assert_holds(report)
        assert report.stale_writes_refused == 0
        assert "NonDeterminismError" not in log and "run_build_mismatch" not in log
        assert "fleet_scaled: down" in log
        # Handed back at a step boundary, or drained: never orphaned by the change.
        assert set(load.requeues()) <= {"upgrade", "shutdown"}, load.requeues()
        assert load.requeues()["upgrade"] > 0  # runs in flight moved to the new code
        fleet.send(signal.SIGTERM)
        assert fleet.wait(60) == 0
    finally:
        store.close()
