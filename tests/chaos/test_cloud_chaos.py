"""Reporting under faults: a fleet over Valkey reports its runs to a collector while its
children are killed with SIGKILL (their connectors' queues with them), the Valkey server
is killed and restarted (append-only file, fsync on every write), and the collector is
killed and restarted, and runs keep being submitted throughout. The verdict: every run
completes, and the collector holds each run's terminal event exactly once.

What a killed child never sent comes from the store (the connectors' reconcile pass);
what a down collector refused waits in the queue or the spool. The order of the faults is
drawn from a seed (printed, so a failure can be replayed).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.invariants import check_once, holdings
from pyrula.workflows import RunStatus, StoreUnavailable, SyncWorkflowClient, ValkeyStore
from tests.chaos.harness import (
    kill_a_ready_child,
    restart_valkey,
    stop_after_kills,
    submit_some,
)
from tests.conftest import wait_until
from tests.fleet.fleetprocs import Fleets, write_app
from tests.integration.cloudprocs import Collector
from tests.integration.workerprocs import child_env
from tests.servers import start_server

pytestmark = pytest.mark.slow

APP = "chaoscloud"
WORKFLOW = "chaos_reported"
APP_TEXT = f'''
"""A workflow for the Cloud chaos test (written by the test)."""

import time

from pyrula.workflows import step, workflow


@step
def work(n: int) -> int:
    time.sleep(0.02)  # a kill lands while runs are in their step
    return n


@workflow(name="{WORKFLOW}")
async def reported(ctx, params):
    return await work(params["n"])
'''
RUNS = 500
KILLS = 3


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    directory = tmp_path / "collector"
    directory.mkdir()
    c = Collector(directory)
    try:
        yield c.start()
    finally:
        c.reap()


def _restart_collector(collector: Collector) -> None:
    collector.kill()
    collector.start()


def _unfinished(client: SyncWorkflowClient, run_ids: set[str]) -> str:
    """What a failed wait reports: the runs not completed, with their records."""
    lines = []
    for run_id in sorted(run_ids):
        try:
            record = client.get(run_id)
        except (StoreUnavailable, OSError) as exc:
            lines.append(f"{run_id}: unreadable ({exc})")
            continue
        if record.status is not RunStatus.COMPLETED:
            lines.append(f"{run_id}: {record!r}")
    return f"{len(lines)} runs not completed:\n" + "\n".join(lines[:20])


@pytest.mark.timeout(300)  # a failed wait below reports what is stuck, before this fires
def test_every_terminal_event_reaches_the_collector_once_through_kills_and_restarts(
        fleets: Fleets, collector: Collector, tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.randrange(2**32))  # to replay one
    print(f"seed={seed}")
    rng = random.Random(seed)
    valkey = start_server(tmp_path / "valkey", appendonly="yes", appendfsync="always")
    store = ValkeyStore(valkey.url, namespace="chaos", socket_timeout=2.0)
    key = collector.create_key("chaos")
    env = child_env(PYRULA_CLOUD_API_KEY=key, PYRULA_CLOUD_URL=collector.url,
                    PYRULA_CLOUD_OUTBOX_PATH=str(tmp_path / "outbox"),
                    PYRULA_CLOUD_RECONCILE_S="1")
    try:
        client = SyncWorkflowClient(store)
        write_app(tmp_path, APP_TEXT, module=APP)
        fleet = fleets.start("-n", "2", "--namespace", "chaos", "--lock-ttl", "5",
                             "--orphan-scan-interval", "1", "--shutdown-grace", "5",
                             "--cancel-timeout", "1", app=APP, store=valkey.url, env=env)
        fleet.wait_ready(2, timeout=60)
        submitted: dict[str, str] = {}
        faults = ["kill"] * KILLS + ["restart", "collector"]
        rng.shuffle(faults)
        steps = len(faults) + 1
        while faults or len(submitted) < RUNS:
            submit_some(client, WORKFLOW, submitted, rng.randrange(10, 60), RUNS)
            due = len(submitted) >= RUNS * (steps - len(faults)) // (steps + 1)
            if faults and due:
                if faults[0] == "restart":
                    restart_valkey(valkey)
                elif faults[0] == "collector":
                    _restart_collector(collector)
                elif not kill_a_ready_child(fleet, rng):
                    continue
                faults.pop(0)
        wanted = set(submitted.values())

        def completed() -> bool:
            try:
                return all(client.get(r).status is RunStatus.COMPLETED for r in wanted)
            except (StoreUnavailable, OSError):
                return False

        try:
            wait_until(completed, 150, what="every submitted run completed")
        except AssertionError as exc:
            raise AssertionError(f"seed={seed}: {exc}\n{_unfinished(client, wanted)}\n"
                                 f"fleet log (tail):\n{fleet.log()[-6000:]}") from None
        wait_until(lambda: {r for r, _ in collector.terminal_events()} >= wanted, 120,
                   what="every run's terminal event at the collector")
        verdict = check_once("terminal_events", wanted,
                             holdings(collector.terminal_events()))
        print(verdict.line())
        assert verdict.ok, f"seed={seed}: {verdict.line()} {verdict.problems}"
        stop_after_kills(fleet, KILLS)
    finally:
        store.close()
        valkey.kill()
