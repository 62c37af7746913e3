"""A ``pyrula-fleet`` whose children report to a real ``pyrula cloud serve``."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import SyncWorkflowClient
from tests.conftest import wait_until
from tests.fleet.fleetprocs import QUICK, Fleets, child_env
from tests.integration.cloudprocs import Collector

pytestmark = pytest.mark.slow


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    c = Collector(tmp_path)
    try:
        yield c.start()
    finally:
        c.reap()


def test_a_fleets_children_report_under_one_fleet_and_their_runs_once(
    collector: Collector, fleets: Fleets, client: SyncWorkflowClient, tmp_path: Path
) -> None:
    key = collector.create_key("prod")
    env = child_env(PYRULA_CLOUD_API_KEY=key, PYRULA_CLOUD_URL=collector.url,
                    PYRULA_CLOUD_OUTBOX_PATH=str(tmp_path / "outbox"))
    fleet = fleets.start("-n", "2", *QUICK, env=env)
    fleet.wait_ready(2)
    runs = [client.submit("fa_load", {"tag": f"t{i}"}).run_id for i in range(20)]

    def fleet_seen() -> dict[str, Any] | None:
        found = collector.get("/api/fleets", key)[1]["fleets"]
        children = [f for f in found if len(f["workers"]) == 2]
        return children[0] if children else None

    seen = wait_until(fleet_seen, timeout=30, what="one fleet with two children reported")
    assert {w["kind"] for w in seen["workers"]} == {"fleet-child"}

    def done() -> bool:
        body = collector.get("/api/runs?workflow=fa_load&status=completed", key)[1]
        return {r["run_id"] for r in body["runs"]} >= set(runs)

    wait_until(done, timeout=60, what="every run reported completed")
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0
    _, body = collector.get("/api/runs?workflow=fa_load", key)
    assert sorted(r["run_id"] for r in body["runs"]) == sorted(runs)
