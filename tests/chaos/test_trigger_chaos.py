"""Batch triggers under faults: a fleet over Valkey starts runs from batches of events
while its children are killed with SIGKILL and the Valkey server is killed and restarted
(append-only file, fsync on every write), and events keep being emitted throughout. The
verdict: every event whose emit was acknowledged lands in exactly one run, and every run a
batch started completes with exactly the events it was given.

An emit that meets the outage raises; the emitter sends it again with the same key, as a
producer would, and the key makes the resend the same event. The order of the faults and
of the events is drawn from a seed (printed, so a failure can be replayed).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from pyrula.invariants import check_once
from pyrula.workflows import RunStatus, StoreUnavailable, SyncWorkflowClient, ValkeyStore
from tests.chaos.harness import (
    kill_a_ready_child,
    restart_valkey,
    stop_after_kills,
)
from tests.conftest import wait_until
from tests.fleet.fleetprocs import Fleets, write_app
from tests.servers import start_server

pytestmark = pytest.mark.slow

APP = "chaostriggers"
WORKFLOW = "chaos_batches"
TOPIC = "chaos.events"
APP_TEXT = f'''
"""A triggered workflow for the trigger chaos test (written by the test)."""

import time

from pyrula.workflows import BatchTrigger, step, workflow


@step
def count(ids: list) -> int:
    time.sleep(0.05)  # a kill lands while runs are in their step, not only between them
    return len(ids)


@workflow(name="{WORKFLOW}", trigger=BatchTrigger("{TOPIC}", max_size=25, max_wait=0.3))
async def batches(ctx, params):
    ids = [event["id"] for event in params["events"]]
    await count(ids)
    return ids
'''
EVENTS = 1500
KILLS = 3


class Emitter:
    """Emits ``EVENTS`` events with keys, resending the same key after a failure."""

    def __init__(self, client: SyncWorkflowClient, rng: random.Random) -> None:
        self.client = client
        self.rng = rng
        self.acknowledged: dict[str, str] = {}  # key -> event id
        self.resent = 0

    def emit_some(self, count: int) -> None:
        for _ in range(count):
            if len(self.acknowledged) >= EVENTS:
                return
            key = f"e{len(self.acknowledged)}"
            payload = {"n": len(self.acknowledged), "blob": "x" * self.rng.randrange(0, 200)}
            try:
                self.acknowledged[key] = self.client.emit(TOPIC, payload, key=key)
            except (StoreUnavailable, OSError):
                self.resent += 1  # not acknowledged: the same key again next time
                return




def _membership(client: SyncWorkflowClient) -> tuple[dict[str, list[str]], list[Any]]:
    """Event id -> the runs whose params hold it; and every run of the workflow."""
    runs = list(client.list_runs(name=WORKFLOW))
    holders: dict[str, list[str]] = {}
    for info in runs:
        for event in info.params["events"]:
            holders.setdefault(event["id"], []).append(info.run_id)
    return holders, runs


def test_every_acknowledged_event_lands_in_exactly_one_run_through_kills_and_a_restart(
        fleets: Fleets, tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.randrange(2**32))  # to replay one
    print(f"seed={seed}")
    rng = random.Random(seed)
    valkey = start_server(tmp_path / "valkey", appendonly="yes", appendfsync="always")
    store = ValkeyStore(valkey.url, namespace="chaos", socket_timeout=2.0)
    try:
        client = SyncWorkflowClient(store)
        write_app(tmp_path, APP_TEXT, module=APP)
        fleet = fleets.start("-n", "2", "--namespace", "chaos", "--trigger-interval", "0.1",
                             "--lock-ttl", "5", "--orphan-scan-interval", "1",
                             "--shutdown-grace", "5", "--cancel-timeout", "1",
                             app=APP, store=valkey.url)
        fleet.wait_ready(2, timeout=60)
        emitter = Emitter(client, rng)
        faults = ["kill"] * KILLS
        faults.insert(rng.randrange(len(faults) + 1), "restart")
        while faults or len(emitter.acknowledged) < EVENTS:
            emitter.emit_some(rng.randrange(20, 120))
            if faults and len(emitter.acknowledged) >= EVENTS * (KILLS + 2 - len(faults)) // (
                    KILLS + 2):
                if faults[0] == "restart":
                    restart_valkey(valkey)
                elif not kill_a_ready_child(fleet, rng):
                    continue
                faults.pop(0)
        wanted = set(emitter.acknowledged.values())

        def all_done() -> tuple[dict[str, list[str]], list[Any]] | None:
            try:
                holders, runs = _membership(client)
            except (StoreUnavailable, OSError):
                return None
            done = all(r.status is RunStatus.COMPLETED for r in runs)
            return (holders, runs) if done and wanted <= set(holders) else None

        holders, runs = wait_until(all_done, 120, what="every event's run completed")
        verdict = check_once("events", wanted, holders)
        print(verdict.line())
        assert verdict.ok, f"seed={seed}: {verdict.line()} {verdict.problems}"
        for info in runs:  # each run returns exactly the events it was given
            assert info.result == [e["id"] for e in info.params["events"]], info.run_id
        print(f"events={len(wanted)} runs={len(runs)} resent={emitter.resent}")
        stop_after_kills(fleet, KILLS)
    finally:
        store.close()
        valkey.kill()
