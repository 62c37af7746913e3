"""The fleet's /metrics: its children's metrics summed under the documented Prometheus
names, and the counts of a child killed with SIGKILL kept after it is replaced."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from pyrula.workflows import RunStatus, SyncWorkflowClient
from tests.conftest import wait_until
from tests.fleet.fleetprocs import QUICK, Fleets, ready
from tests.promtext import maybe, samples, value


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

    wait_until(lambda: maybe(metrics(), "pyrula_runs_completed_total", workflow="fa_load") == 8,
               20, what="8 completed runs in the fleet's metrics")
    text = metrics()
    assert value(text, "pyrula_runs_started_total", workflow="fa_load") == 8
    # A counter is exposed from its first count on: none failed, none was requeued.
    assert maybe(text, "pyrula_runs_failed_total", workflow="fa_load") is None
    for step in ("step_a", "step_b"):
        assert value(text, "pyrula_step_duration_seconds_count", workflow="fa_load",
                     step=step) == 8
        # each step sleeps 50 ms: none is in the buckets below it
        assert value(text, "pyrula_step_duration_seconds_bucket", workflow="fa_load",
                     step=step, le="0.025") == 0
    assert value(text, "pyrula_run_duration_seconds_count", workflow="fa_load") == 8
    assert value(text, "pyrula_claim_latency_seconds_count", workflow="fa_load") == 8
    assert value(text, "pyrula_runs_in_flight") == 0
    assert maybe(text, "pyrula_runs_requeued_total", reason="orphaned") is None

    # A run held by a child killed with SIGKILL: requeued by the supervisor, finished by
    # the other child; the dead child's counts stay in the sum.
    gated = client.submit("fa_gated", {"tag": "kill"})
    status = fleet.wait_status(lambda s: any(c["in_flight"] == 1 for c in ready(s)),
                               what="a child holding the gated run")
    victim = next(c for c in status["children"] if c["in_flight"] == 1)
    wait_until(lambda: maybe(metrics(), "pyrula_runs_in_flight") == 1, 10,
               what="the held run in the fleet's metrics")
    os.kill(victim["pid"], signal.SIGKILL)
    wait_until(lambda: client.get(gated.run_id).attempt == 2, 20, what="attempt 2")
    (tmp_path / "gate-kill").touch()
    client.result(gated.run_id, timeout=30)
    assert client.get(gated.run_id).status is RunStatus.COMPLETED

    wait_until(lambda: maybe(metrics(), "pyrula_runs_completed_total",
                             workflow="fa_gated") == 1, 20,
               what="the gated run's completion in the fleet's metrics")
    text = metrics()
    assert value(text, "pyrula_runs_requeued_total", reason="orphaned") == 1
    assert value(text, "pyrula_runs_started_total", workflow="fa_gated") == 2
    assert value(text, "pyrula_runs_completed_total", workflow="fa_load") == 8  # kept
    assert value(text, "pyrula_fleet_restarts_total") == 1
    assert ("pyrula_queue_depth", frozenset({("workflow", "fa_load")})) in samples(text)
    assert value(text, "pyrula_queue_depth", workflow="fa_load") == 0
    fleet.send(signal.SIGTERM)
    assert fleet.wait(30) == 0


def test_fleet_metrics_show_the_queue_once_not_once_per_child(
    fleets: Fleets, client: SyncWorkflowClient, tmp_path: Path
) -> None:
    fleet = fleets.start("-n", "2", "--max-concurrent-runs", "1", *QUICK)
    fleet.wait_ready(2)
    runs = [client.submit("fa_gated", {"tag": "q"}) for _ in range(5)]
    fleet.wait_status(lambda s: sum(c["in_flight"] for c in ready(s)) == 2,
                      what="both children holding a run")

    def queued() -> float | None:
        return maybe(fleet.get("/metrics")[1], "pyrula_queue_depth", workflow="fa_gated")

    wait_until(lambda: queued() == 3, 20, what="3 runs queued in the fleet's metrics")
    text = fleet.get("/metrics")[1]
    assert value(text, "pyrula_queue_oldest_age_seconds", workflow="fa_gated") > 0
    (tmp_path / "gate-q").touch()
    for run in runs:
        client.result(run.run_id, timeout=30)
    wait_until(lambda: queued() == 0, 20, what="the queue emptied in the fleet's metrics")
    fleet.send(signal.SIGTERM)
    assert fleet.wait(30) == 0
