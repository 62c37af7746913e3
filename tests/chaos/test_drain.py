"""SIGTERM to a fleet with steps in flight, while a second fleet serves the same store.

The drained fleet keeps renewing its locks while it drains: a step that runs on for twice
``lock_ttl`` after the signal finishes there, and the other fleet's orphan scan never takes
its run. Short steps finish. Steps that would outlast ``--shutdown-grace`` are handed back
when the grace ends (``run:requeued`` reason ``shutdown``), not left to lapse, and the
second fleet finishes each once. Verdict clean.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from pyrula.workflows import RunStatus, SyncWorkflowClient, ValkeyStore
from tests.chaos.harness import APP, ChaosLoad, write_chaos_app
from tests.conftest import wait_until
from tests.fleet.fleetprocs import Fleets

pytestmark = pytest.mark.slow

LOCK_TTL = 2.0  # renewed every lock_ttl / 3: room for a loaded machine
GRACE = 5.0
MEDIUM = 2 * LOCK_TTL  # runs on this long after the signal: past lock_ttl, within the grace
LONG = GRACE + 2.0  # past the grace


def test_term_drains_renewing_finishes_what_fits_and_hands_back_what_does_not(
    fleets: Fleets, tmp_path: Path, valkey_url: str, valkey_namespace: str
) -> None:
    store = ValkeyStore(valkey_url, namespace=valkey_namespace)
    try:
        client = SyncWorkflowClient(store)
        load = ChaosLoad(client, tmp_path, steps=2, hold=0.05, seed=41)
        app = write_chaos_app(tmp_path)
        gate = tmp_path / "term-sent"
        options = ("--app", app, "--namespace", valkey_namespace, "--lock-ttl", str(LOCK_TTL),
                   "--orphan-scan-interval", "0.3", "--shutdown-grace", str(GRACE),
                   "--cancel-timeout", "1")
        a = fleets.start("-n", "1", *options, app=APP, store=valkey_url, name="fleet-a")
        a_id = a.wait_ready(1, timeout=60)["children"][0]["worker_id"]

        def drain_run(seconds: float) -> str:
            run_id = client.submit("chaos.drain", {"gate": str(gate), "seconds": seconds,
                                                   "ledger": str(load.ledger)}).run_id
            load.expect(run_id, seconds, steps=1)
            return run_id

        medium = [drain_run(MEDIUM) for _ in range(3)]
        long = [drain_run(LONG) for _ in range(3)]
        wait_until(lambda: all(client.get(r).status is RunStatus.RUNNING
                               for r in medium + long), 30, what="A running every held run")
        b = fleets.start("-n", "1", *options, app=APP, store=valkey_url, name="fleet-b")
        b.wait_ready(1, timeout=60)
        short = load.submit(60)  # short runs, on both fleets
        wait_until(lambda: any(e["type"] == "run:started" and e["worker"] == a_id
                               for r in short for e in client.events(r)), 30,
                   what="A busy with short runs too")
        gate.touch()
        a.send(signal.SIGTERM)
        load.fault("SIGTERM", a.pid)
        assert a.wait(GRACE + 20) == 0
        load.wait_all(timeout=60)

        log_a, log_b = a.log(), b.log()
        assert "shutdown: 3/5 cancelling 3 runs still in flight" in log_a, log_a[-3000:]
        report = load.verdict(store, [log_a, log_b])
        load.assert_holds(report)
        assert report.stale_writes_refused == 0
        assert "run_reclaimed" not in log_b  # B's orphan scan never found a lapsed lock
        a_worker = _worker(client.events(medium[0]))
        for run_id in medium:  # finished in A's drain, its only attempt
            events = client.events(run_id)
            assert [e.get("attempt") for e in events if e["type"] == "run:started"] == [1]
            assert _worker(events) == a_worker
            assert not [e for e in events if e["type"] == "run:requeued"]
        for run_id in long:  # handed back at the grace's end, finished once by B
            events = client.events(run_id)
            assert [e["reason"] for e in events if e["type"] == "run:requeued"] == ["shutdown"]
            started = [e for e in events if e["type"] == "run:started"]
            assert [e["attempt"] for e in started] == [1, 2]
            assert started[0]["worker"] == a_worker and started[1]["worker"] != a_worker
        b.send(signal.SIGTERM)
        assert b.wait(GRACE + 20) == 0
    finally:
        store.close()


def _worker(events: list[dict[str, object]]) -> object:
    return [e for e in events if e["type"] == "run:started"][-1]["worker"]
