"""The fleet's one health port: /livez, /readyz, /status (its documented shape), /metrics, the
``pyrula-fleet status`` table, and where the port and the child count come from."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

from pyrula.workflows import SQLiteStore, SyncWorkflowClient
from tests.fleet.fleetprocs import FLEET, QUICK, Fleets, child_env, ready
from tests.servers import free_port

STATUS_KEYS = {"status", "children", "shards", "restarts", "store"}
CHILD_KEYS = {"slot", "pid", "worker_id", "state", "shards", "workflows", "in_flight",
              "runs_done", "restarts", "rss_bytes", "generation"}
SAMPLE = re.compile(r'^[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? (-?[0-9.e+]+|\+Inf)$')


def test_probes_status_shape_metrics_and_the_status_table(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    fleet = fleets.start("-n", "2", *QUICK)
    fleet.wait_ready(2)
    run = client.submit("fa_load", {"tag": "h"})
    assert client.result(run.run_id, timeout=20) == ["a", "b"]

    code, body = fleet.get("/livez")
    assert code == 200 and json.loads(body)["status"] == "ok"
    code, body = fleet.get("/readyz")
    assert code == 200
    assert json.loads(body)["status"] == "ready" and json.loads(body)["ready_children"] == 2

    status = fleet.wait_status(lambda s: sum(c["runs_done"] for c in s["children"]) == 1,
                               what="the run counted")
    assert set(status) == STATUS_KEYS
    assert status["status"] == "ok" and status["restarts"] == 0
    assert status["shards"] == {}  # SQLite is not sharded
    assert [c["slot"] for c in status["children"]] == [0, 1]
    for child in status["children"]:
        assert set(child) == CHILD_KEYS
        assert child["state"] == "ready" and child["in_flight"] == 0
        assert child["restarts"] == 0 and child["shards"] == {}
        assert "fa_load" in child["workflows"]  # the names it serves, shards or not
        assert isinstance(child["pid"], int) and child["rss_bytes"] > 0
        assert f"-{child['pid']}-" in child["worker_id"]

    code, metrics = fleet.get("/metrics")
    assert code == 200
    samples = [line for line in metrics.splitlines() if not line.startswith("#")]
    assert samples and all(SAMPLE.match(line) for line in samples), metrics
    assert "pyrula_fleet_children 2" in samples
    assert "pyrula_fleet_children_ready 2" in samples
    assert "pyrula_fleet_restarts_total 0" in samples
    assert 'pyrula_fleet_child_runs_done_total{slot="0"} ' in metrics
    assert fleet.get("/nope")[0] == 404

    table = subprocess.run([*FLEET, "status", "--url", fleet.url], env=child_env(),
                           capture_output=True, text=True, timeout=30)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("fleet ok  restarts=0")
    assert lines[1] == f"store {status['store']}"  # which store, absolutely
    assert status["store"].startswith("sqlite:////")
    assert lines[2].split()[:4] == ["SLOT", "PID", "STATE", "IN-FLIGHT"]
    for child, line in zip(status["children"], lines[3:], strict=True):
        words = line.split()
        assert words[:3] == [str(child["slot"]), str(child["pid"]), "ready"]
        assert child["worker_id"] in words

    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0
    unreachable = subprocess.run([*FLEET, "status", "--url", fleet.url], env=child_env(),
                                 capture_output=True, text=True, timeout=30)
    assert unreachable.returncode == 1
    assert unreachable.stderr.startswith(f"error: cannot reach the fleet at {fleet.url}")


def test_port_and_web_concurrency_come_from_the_environment(fleets: Fleets) -> None:
    port = free_port()
    env = child_env(PORT=str(port), WEB_CONCURRENCY="3")
    fleet = fleets.start(*QUICK, health_port=False, port=port, env=env)
    status = fleet.wait_ready(3)
    assert [c["slot"] for c in status["children"]] == [0, 1, 2]
    # `pyrula-fleet status` finds the fleet through $PORT too.
    table = subprocess.run([*FLEET, "status", "--json"], env=env, capture_output=True,
                           text=True, timeout=30)
    assert table.returncode == 0, table.stderr
    assert len(json.loads(table.stdout)["children"]) == 3
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def test_health_port_0_binds_a_free_port_and_announces_it(fleets: Fleets) -> None:
    fleet = fleets.start("-n", "1", "--health-port", "0", *QUICK, health_port=False)
    announced = fleet.wait_for_log("health on http://")
    match = re.search(r"health on http://127\.0\.0\.1:(\d+) ", announced)
    assert match is not None, announced
    fleet.port = int(match.group(1))
    assert fleet.port > 0
    assert len(ready(fleet.wait_ready(1))) == 1
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def test_without_store_the_fleet_runs_on_pyrula_db_in_its_directory(
    fleets: Fleets, tmp_path: Path
) -> None:
    fleet = fleets.start("-n", "2", *QUICK, store=None)
    fleet.wait_ready(2)
    # The banner names the file absolutely: which one a fleet uses is not a guess.
    assert f"2 children on sqlite:///{tmp_path / 'pyrula.db'};" in fleet.log()
    status = fleet.status()
    assert status is not None and status["store"] == f"sqlite:///{tmp_path / 'pyrula.db'}"
    database = tmp_path / "pyrula.db"
    assert database.exists()
    store = SQLiteStore(database)
    try:
        client = SyncWorkflowClient(store)
        runs = [client.submit("fa_load", {"tag": f"e{i}"}) for i in range(4)]
        for run in runs:
            assert client.result(run.run_id, timeout=20) == ["a", "b"]
    finally:
        store.close()
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0
