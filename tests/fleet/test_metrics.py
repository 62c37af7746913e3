"""The fleet's /metrics: its children's metrics summed under the documented Prometheus
names, and the counts of a child killed with SIGKILL kept after it is replaced."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from pyrula.workflows import RunStatus, SyncWorkflowClient
from tests.conftest import wait_until
from tests.fleet.fleetprocs import QUICK, Fleets, ready
from tests.promtext import value


def test_fleet_metrics_sum_the_children_and_keep_a_killed_childs_counts(
    fleets: Fleets, client: SyncWorkflowClient, tmp_path: Path
) -> None:
    fleet = fleets.start("-n", "2", *QUICK)
    fleet.wait_ready(2)
    runs = [client.submit("fa_load", {"tag": f"m{i}"}) for i in range(8)]
    for run in runs:
        assert client.result(run.run_id, timeout=30) == ["a", "b"]

    def metrics() -> str:
        code, text = fleet.get("/metrics")
        assert code == 200
        return text

    wait_until(lambda: value(metrics(), "pyrula_runs_completed_total", workflow="fa_load") == 8,
               20, what="8 completed runs in the fleet's metrics")
    text = metrics()
    assert value(text, "pyrula_runs_started_total", workflow="fa_load") == 8
    assert value(text, "pyrula_runs_failed_total", workflow="fa_load") == 0
    for step in ("step_a", "step_b"):
        assert value(text, "pyrula_step_duration_seconds_count", workflow="fa_load",
                     step=step) == 8
        # each step sleeps 50 ms: none is in the buckets below it
        assert value(text, "pyrula_step_duration_seconds_bucket", workflow="fa_load",
                     step=step, le="0.025") == 0
    assert value(text, "pyrula_run_duration_seconds_count", workflow="fa_load") == 8
    assert value(text, "pyrula_claim_latency_seconds_count", workflow="fa_load") == 8
    assert value(text, "pyrula_runs_in_flight") == 0
    assert value(text, "pyrula_runs_requeued_total", reason="orphaned") == 0

    # A run held by a child killed with SIGKILL: requeued by the supervisor, finished by
    # the other child; the dead child's counts stay in the sum.
    gated = client.submit("fa_gated", {"tag": "kill"})
    status = fleet.wait_status(lambda s: any(c["in_flight"] == 1 for c in ready(s)),
                               what="a child holding the gated run")
    victim = next(c for c in status["children"] if c["in_flight"] == 1)
    wait_until(lambda: value(metrics(), "pyrula_runs_in_flight") == 1, 10,
               what="the held run in the fleet's metrics")
    os.kill(victim["pid"], signal.SIGKILL)
    wait_until(lambda: client.get(gated.run_id).attempt == 2, 20, what="attempt 2")
    (tmp_path / "gate-kill").touch()
    client.result(gated.run_id, timeout=30)
    assert client.get(gated.run_id).status is RunStatus.COMPLETED

    wait_until(lambda: value(metrics(), "pyrula_runs_completed_total", workflow="fa_gated") == 1,
               20, what="the gated run's completion in the fleet's metrics")
    text = metrics()
    assert value(text, "pyrula_runs_requeued_total", reason="orphaned") == 1
    assert value(text, "pyrula_runs_started_total", workflow="fa_gated") == 2
    assert value(text, "pyrula_runs_completed_total", workflow="fa_load") == 8  # kept
    assert value(text, "pyrula_fleet_restarts_total") == 1
    fleet.send(signal.SIGTERM)
    assert fleet.wait(30) == 0
