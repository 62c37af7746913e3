"""Projections under faults: a fleet over Valkey folds every ended run into a projection
while its children are killed with SIGKILL (a fold in progress among them) and the Valkey
server is killed and restarted (append-only file, fsync on every write), and runs keep
being submitted throughout. The verdict: the projection, which lists the ids of the runs
it folded, holds every completed run exactly once.

A submit that meets the outage raises; the submitter sends it again with the same
idempotency key, as a producer would, so it is one run. The order of the faults is drawn
from a seed (printed, so a failure can be replayed).
"""

from __future__ import annotations

import os
import random
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
from tests.servers import start_server

pytestmark = pytest.mark.slow

APP = "chaosprojections"
WORKFLOW, PROJECTION = "chaos_folded", "chaos_folded.ids"
APP_TEXT = f'''
"""A workflow and its projection for the projection chaos test (written by the test)."""

import time

from pyrula.workflows import projection, step, workflow


@step
def work(n: int) -> int:
    time.sleep(0.02)  # a kill lands while runs are in their step
    return n


@workflow(name="{WORKFLOW}")
async def folded(ctx, params):
    return await work(params["n"])


@projection("{PROJECTION}", on=["{WORKFLOW}"])
def ids(state, run):
    return [*(state or []), run.run_id]
'''
RUNS = 600
KILLS = 3





def test_every_completed_run_is_folded_exactly_once_through_kills_and_a_restart(
        fleets: Fleets, tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.randrange(2**32))  # to replay one
    print(f"seed={seed}")
    rng = random.Random(seed)
    valkey = start_server(tmp_path / "valkey", appendonly="yes", appendfsync="always")
    store = ValkeyStore(valkey.url, namespace="chaos", socket_timeout=2.0)
    try:
        client = SyncWorkflowClient(store)
        write_app(tmp_path, APP_TEXT, module=APP)
        fleet = fleets.start("-n", "2", "--namespace", "chaos", "--projection-interval", "0.1",
                             "--projection-grace", "1", "--lock-ttl", "5",
                             "--orphan-scan-interval", "1", "--shutdown-grace", "5",
                             "--cancel-timeout", "1", app=APP, store=valkey.url)
        fleet.wait_ready(2, timeout=60)
        submitted: dict[str, str] = {}
        faults = ["kill"] * KILLS
        faults.insert(rng.randrange(len(faults) + 1), "restart")
        while faults or len(submitted) < RUNS:
            submit_some(client, WORKFLOW, submitted, rng.randrange(10, 60), RUNS)
            due = len(submitted) >= RUNS * (KILLS + 2 - len(faults)) // (KILLS + 2)
            if faults and due:
                if faults[0] == "restart":
                    restart_valkey(valkey)
                elif not kill_a_ready_child(fleet, rng):
                    continue
                faults.pop(0)
        wanted = set(submitted.values())

        def folded() -> list[str] | None:
            try:
                done = all(client.get(r).status is RunStatus.COMPLETED for r in wanted)
                state = client.projection(PROJECTION) if done else None
            except (StoreUnavailable, OSError):
                return None
            return state if state is not None and set(state) >= wanted else None

        state = wait_until(folded, 180, what="every completed run folded")
        verdict = check_once("folded_runs", wanted, holdings((run, PROJECTION)
                                                             for run in state))
        print(verdict.line())
        assert verdict.ok, f"seed={seed}: {verdict.line()} {verdict.problems}"
        stop_after_kills(fleet, KILLS)
    finally:
        store.close()
        valkey.kill()
