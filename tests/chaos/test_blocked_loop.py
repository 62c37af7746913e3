"""A step that blocks its worker's event loop (``time.sleep`` in an ``async def`` step) past
the liveness bound ``max(3 x lock_ttl, timeout)``, under load.

Each time, every run on that loop stands down (requeued ``loop_blocked``) and only the
blocking run is charged a crash (``run_attempt_loop_blocked``); the charge past
``poison_max_retries`` (3) quarantines it: ``run:error`` code ``max_retries``,
``error_type`` ``EventLoopBlocked``, with ``cause``, ``blocked_for_s`` and
``liveness_bound_s`` in ``detail``. Every other run of the load completes (verdict clean).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from pyrula.invariants import Fails
from pyrula.workflows import RunStatus, SyncWorkflowClient, ValkeyStore
from tests.chaos.harness import APP, ChaosLoad, write_chaos_app
from tests.fleet.fleetprocs import QUICK, Fleets

pytestmark = pytest.mark.slow

LOCK_TTL = 1.0
BOUND = 3 * LOCK_TTL  # the liveness bound of a workflow without a timeout
POISON_MAX_RETRIES = 3  # the default


def test_a_run_that_blocks_the_loop_is_stood_down_then_quarantined_while_the_load_completes(
    fleets: Fleets, tmp_path: Path, valkey_url: str, valkey_namespace: str
) -> None:
    store = ValkeyStore(valkey_url, namespace=valkey_namespace)
    try:
        client = SyncWorkflowClient(store)
        load = ChaosLoad(client, tmp_path, steps=3, hold=0.05, seed=21)
        app = write_chaos_app(tmp_path)
        fleet = fleets.start("-n", "2", "--app", app, "--namespace", valkey_namespace,
                             "--lock-ttl", str(LOCK_TTL), "--orphan-scan-interval", "0.5",
                             *QUICK, app=APP, store=valkey_url)
        fleet.wait_ready(2, timeout=60)
        load.submit(100)
        blocker = client.submit("chaos.blocker", {"seconds": BOUND + 1.0,
                                                  "ledger": str(load.ledger)}).run_id
        load.expect(blocker, Fails("max_retries"))
        load.fault("blocking run", blocker)

        def keep_loaded() -> bool:  # more runs while the blocker is being retried
            if not client.get(blocker).status.terminal:
                if len(load.expected) < 600 and load.done() >= len(load.expected) - 20:
                    load.submit(40)
                return True
            return False

        load.wait_all(timeout=90, during=keep_loaded)
        log = fleet.log()
        report = load.verdict(store, [log])
        load.assert_holds(report)
        # Other runs caught on a blocked loop were stood down, never charged or failed.
        assert set(report.faults) <= {"loop_blocked", "quarantined"}, report.faults

        info = client.get(blocker)
        assert info.status is RunStatus.FAILED
        assert info.error is not None
        assert info.error["code"] == "max_retries"
        assert info.error["error_type"] == "EventLoopBlocked"
        detail = info.error["detail"]
        assert detail["cause"] == "loop_blocked"
        assert detail["liveness_bound_s"] == BOUND
        assert detail["blocked_for_s"] > BOUND
        events = client.events(blocker)
        requeues = [e for e in events if e["type"] == "run:requeued"]
        assert [e["reason"] for e in requeues] == ["loop_blocked"] * POISON_MAX_RETRIES
        assert sum(e["type"] == "run:started" for e in events) == POISON_MAX_RETRIES + 1
        # Charged once per attempt: the blocking run alone, the last one quarantined it.
        charged = [line for line in log.splitlines() if "run_attempt_loop_blocked" in line]
        assert len(charged) == POISON_MAX_RETRIES + 1, charged
        assert all(blocker in line for line in charged)
        assert "and quarantined" in charged[-1]
        # Only the loop was blocked: no child was killed or replaced.
        status = fleet.wait_ready(2, timeout=30)
        assert status["restarts"] == 0
        fleet.send(signal.SIGTERM)
        assert fleet.wait(60) == 0
    finally:
        store.close()
