"""The lock-renewal watchdog does not blame the event loop for time the process was suspended.

A SIGSTOPped (or paused) worker wakes with a stale loop heartbeat; before the fix its
renewal thread could run first and stand every run down as ``loop_blocked``, re-running
a step no other worker had taken over. The process test of the same case is
``test_a_worker_frozen_past_its_liveness_bound_that_nobody_replaced_keeps_its_run``.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from pyrula.workflows import MemoryStore
from pyrula.workflows.clock import SYSTEM_CLOCK
from pyrula.workflows.records import PoisonPolicy, RunStatus
from pyrula.workflows.worker.held import HeldRuns
from pyrula.workflows.worker.renewal import LockRenewer, RenewalSettings, was_suspended


@pytest.mark.parametrize(
    ("late", "cpu", "interval", "suspended"),
    [
        (0.01, 0.0, 5.0, False),  # on time
        (4.0, 0.0, 5.0, False),  # late by less than an interval: too little to tell
        (12.0, 0.1, 5.0, True),  # late with next to no CPU: SIGSTOP, a paused VM
        (3.5, 0.0, 0.333, True),
        (12.0, 11.5, 5.0, False),  # late and busy: a C call held the GIL
        (12.0, 6.5, 5.0, False),
    ],
)
def test_a_late_wake_up_without_cpu_use_means_the_process_was_suspended(
    late: float, cpu: float, interval: float, suspended: bool
) -> None:
    assert was_suspended(late, cpu, interval) is suspended


async def _renewer_holding_a_run(stale_by: float) -> tuple[MemoryStore, LockRenewer, str]:
    store = MemoryStore()
    await store.submit("wf", {}, now=time.time())
    [claimed] = await store.claim("w1", ["wf"], limit=1, now=time.time(), lock_ttl=1.0)
    runs = HeldRuns()
    runs.claimed(claimed.run_id, claimed.token)
    runs.renew(claimed.run_id, claimed.token, liveness_bound_s=3.0)
    renewer = LockRenewer(
        store=store, clock=SYSTEM_CLOCK, loop=asyncio.get_running_loop(), runs=runs,
        watch=StaleBeat(time.monotonic() - stale_by),
        settings=RenewalSettings(worker_id="w1", lock_ttl=1.0, poison=PoisonPolicy(),
                                 charge_loop_blocked=True, log_extra={"worker_id": "w1"}),
    )
    return store, renewer, claimed.run_id


class StaleBeat:
    """An event loop whose heartbeat stopped at ``at``."""

    def __init__(self, at: float) -> None:
        self.at = at

    def last_beat(self) -> float:
        return self.at


async def test_a_heartbeat_stale_from_before_a_suspension_is_not_a_blocked_loop() -> None:
    store, renewer, run_id = await _renewer_holding_a_run(stale_by=10.0)
    renewer._check_suspended(time.monotonic() - 10.0, time.process_time(), 0.333)
    assert renewer.resumed_at > time.monotonic() - 1.0

    await renewer.tick()
    assert run_id in renewer.runs.renewing() and not renewer.runs.was_stood_down(run_id, 1)
    info = await store.get_run(run_id)
    assert info is not None and info.status is RunStatus.RUNNING


async def test_the_same_stale_heartbeat_without_a_suspension_stands_the_run_down() -> None:
    store, renewer, run_id = await _renewer_holding_a_run(stale_by=10.0)
    renewer._check_suspended(time.monotonic() - 0.34, time.process_time(), 0.333)
    assert renewer.resumed_at == float("-inf")

    await renewer.tick()
    assert renewer.runs.was_stood_down(run_id, 1) and run_id not in renewer.runs.renewing()
    journal = await store.read_events(run_id)
    assert journal[-1]["type"] == "run:requeued" and journal[-1]["reason"] == "loop_blocked"
