"""Elastic sizing: the pure policy (``scaling.decide``) row by row, the host's cgroup
readings, the flags' checks and what /status says."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pyrula.config.fleet import FleetOptions, resolve_bounds
from pyrula.errors import ConfigurationError
from pyrula.metrics import Metrics
from pyrula.supervisor.autoscale import IDLE_QUEUE_READ_S, Autoscaler, Host
from pyrula.supervisor.children import Child
from pyrula.supervisor.scaling import (
    MIB,
    Decision,
    Direction,
    ScalingInputs,
    ScalingPolicy,
    decide,
)
from pyrula.supervisor.status import fleet_status
from pyrula.wire import Heartbeat, WorkerState
from pyrula.workflows.stores.capabilities import QueueStat

POLICY = ScalingPolicy(minimum=1, maximum=4, scale_up_after=2.0, scale_down_after=60.0)
NOW = 10_000.0
#: A fleet of two ready children, 50 slots each, half busy, plenty of headroom, nothing
#: queued, last changed long ago: it holds.
STEADY = ScalingInputs(
    now=NOW, size=2, ready=2, starting=0, queued=0, oldest_age=0.0, busy_slots=50,
    total_slots=100, idle_for=0.0, loop_lag=0.01, claim_tick_age=0.1, cpu_free=1.0,
    memory_free=4096 * MIB, child_rss=80 * MIB, last_change=NOW - 1000,
)
#: Runs wait: the oldest queued one for 3 s (> --scale-up-after 2).
WAITING = replace(STEADY, queued=500, oldest_age=3.0)
#: Every slot busy with runs queued (younger than --scale-up-after).
SATURATED = replace(STEADY, queued=10, oldest_age=0.5, busy_slots=100)
#: Nothing to do for a long while.
IDLE = replace(STEADY, busy_slots=0, idle_for=61.0)


def row(inputs: ScalingInputs, **changes: Any) -> ScalingInputs:
    return replace(inputs, **changes)


@pytest.mark.parametrize(
    ("inputs", "desired", "reason"),
    [
        # Steady: half busy, nothing waits.
        (STEADY, 2, "idle 0.0 s"),
        # Grow on the oldest queued run's age: just above, at and below the threshold.
        (WAITING, 3, "oldest queued run waited 3.0 s > --scale-up-after 2 s"),
        (row(WAITING, oldest_age=2.01), 3, "waited 2.0 s"),
        (row(WAITING, oldest_age=2.0), 2, "runs queued"),
        (row(WAITING, oldest_age=1.9), 2, "runs queued"),
        # One child per decision, even far behind.
        (row(WAITING, oldest_age=300.0, queued=100_000), 3, "waited 300.0 s"),
        (row(WAITING, size=1, ready=1), 2, "waited 3.0 s"),
        # Grow when every slot is busy and something is queued, before the age threshold.
        (SATURATED, 3, "every child at max_concurrent_runs (100/100 busy, 10 queued)"),
        (row(SATURATED, queued=0, oldest_age=0.0), 2, "idle 0.0 s"),  # nothing for a new one
        (row(SATURATED, busy_slots=99), 2, "runs queued"),
        (row(SATURATED, queued=None, oldest_age=None), 3, "queue unknown"),
        (row(SATURATED, ready=0, total_slots=0, busy_slots=0), 2, "runs queued"),
        # Capped at --max.
        (row(WAITING, size=4, ready=4), 4, "already at --max 4"),
        (row(SATURATED, size=4, ready=4), 4, "already at --max 4"),
        # Not before the last child added is ready.
        (row(WAITING, size=3, ready=2, starting=1), 3, "waiting for 1 starting children"),
        # Cooldown after the last change.
        (row(WAITING, last_change=NOW - 0.5), 2, "cooldown 1 s"),
        (row(WAITING, last_change=NOW - 1.0), 3, "waited 3.0 s"),
        # Headroom refusals: CPU (at the bound it grows), memory (host or cgroup, at least
        # 64 MiB, else 1.5 x the largest child), a lagging supervisor, stuck claim loops.
        (row(WAITING, cpu_free=0.1), 2, "not growing: no CPU headroom (0.10 cores free"),
        (row(WAITING, cpu_free=0.25), 3, "waited 3.0 s"),
        (row(WAITING, cpu_free=None), 3, "waited 3.0 s"),
        (row(SATURATED, cpu_free=0.0), 2, "not growing: no CPU headroom"),
        (row(WAITING, memory_free=100 * MIB), 2, "no memory headroom (100 MiB free < 120 MiB"),
        (row(WAITING, memory_free=120 * MIB), 3, "waited 3.0 s"),
        (row(WAITING, memory_free=60 * MIB, child_rss=0), 2, "< 64 MiB for a child"),
        (row(WAITING, memory_free=64 * MIB, child_rss=0), 3, "waited 3.0 s"),
        (row(WAITING, memory_free=None), 3, "waited 3.0 s"),
        (row(WAITING, loop_lag=0.6), 2, "the supervisor's loop lags 0.60 s"),
        (row(WAITING, loop_lag=0.5), 3, "waited 3.0 s"),
        (row(WAITING, claim_tick_age=6.0), 2, "claimed nothing for 6.0 s"),
        (row(WAITING, claim_tick_age=5.0), 3, "waited 3.0 s"),
        (row(WAITING, claim_tick_age=None), 3, "waited 3.0 s"),  # no free slot anywhere
        # CPU is looked at first.
        (row(WAITING, cpu_free=0.0, memory_free=0), 2, "no CPU headroom"),
        # Shrink: idle long enough, nothing queued, last change old enough; one at a time.
        (IDLE, 1, "every child idle for 61.0 s >= --scale-down-after 60 s, nothing queued"),
        (row(IDLE, size=4, ready=4), 3, "every child idle"),
        (row(IDLE, idle_for=60.0), 1, "every child idle for 60.0 s"),
        (row(IDLE, idle_for=59.9), 2, "idle 59.9 s < --scale-down-after 60 s"),
        (row(IDLE, queued=1, oldest_age=0.1), 2, "1 runs queued"),
        (row(IDLE, queued=None, oldest_age=None), 1, "every child idle"),
        (row(IDLE, last_change=NOW - 30), 2, "last change 30.0 s ago < --scale-down-after"),
        (row(IDLE, last_change=NOW - 60), 1, "every child idle"),
        # Never below --min; an idle fleet at --min stays.
        (row(IDLE, size=1, ready=1), 1, "at --min"),
        (row(STEADY, size=1, ready=1, busy_slots=0, idle_for=0.0), 1, "at --min"),
        # No headroom does not hold back a shrink.
        (row(IDLE, cpu_free=0.0, memory_free=0, loop_lag=5.0), 1, "every child idle"),
        # Out of bounds (only reachable by a bug): back within them.
        (row(STEADY, size=7), 4, "outside --min 1 .. --max 4"),
        (row(STEADY, size=0), 1, "outside --min 1 .. --max 4"),
    ],
)
def test_decide(inputs: ScalingInputs, desired: int, reason: str) -> None:
    decision = decide(POLICY, inputs)
    assert decision.desired == desired, decision
    assert reason in decision.reason, decision.reason
    assert decision.refused == ("not growing" in decision.reason)
    assert decision.figures["oldest_age_s"] == inputs.oldest_age
    assert decision.figures["queued"] == inputs.queued


@pytest.mark.parametrize(
    ("inputs", "desired"),
    [
        # One ready child with every slot busy and one run queued: the fleet grows.
        (row(SATURATED, size=1, ready=1, busy_slots=50, total_slots=50), 2),
        (row(SATURATED, size=1, ready=1, busy_slots=1, total_slots=1), 2),
        (row(SATURATED, queued=1), 3),
        # A ready child that reports no slots (its health not read yet) is not saturated.
        (row(SATURATED, ready=1, busy_slots=0, total_slots=0), 2),
    ],
)
def test_saturation_needs_one_queued_run_and_every_slot_busy(inputs: ScalingInputs,
                                                             desired: int) -> None:
    assert decide(POLICY, inputs).desired == desired


@pytest.mark.parametrize(
    ("inputs", "reason"),
    [
        (WAITING, "oldest queued run waited 3.0 s > --scale-up-after 2 s (500 queued)"),
        (row(IDLE, size=1, ready=1), "at --min"),
        (row(SATURATED, queued=None, oldest_age=None),
         "every child at max_concurrent_runs (100/100 busy, queue unknown)"),
        (row(WAITING, loop_lag=0.6),
         "oldest queued run waited 3.0 s > --scale-up-after 2 s (500 queued); not growing: "
         "the supervisor's loop lags 0.60 s > 0.5 s (host overloaded)"),
        (row(WAITING, claim_tick_age=6.0),
         "oldest queued run waited 3.0 s > --scale-up-after 2 s (500 queued); not growing: "
         "children with free slots claimed nothing for 6.0 s (the store holds the queue "
         "back, not the fleet's capacity)"),
    ],
)
def test_the_logged_reason_reads_whole(inputs: ScalingInputs, reason: str) -> None:
    """The reason is the text of the fleet_scaled and fleet_scale_held log lines."""
    assert decide(POLICY, inputs).reason == reason


def test_a_decision_carries_the_tick_figures_under_the_logged_names() -> None:
    """The figures are the fields of the fleet_scaled log record (docs/deployment.md),
    rounded for a log line: the loop lag to a millisecond, other times to 10 ms."""
    inputs = row(STEADY, now=NOW + 0.123456, oldest_age=1.23456, idle_for=7.891,
                 loop_lag=0.012345, claim_tick_age=0.4567, cpu_free=1.23456, starting=1,
                 memory_free=123, child_rss=45)
    assert decide(POLICY, inputs).figures == {
        "size": 2, "ready": 2, "starting": 1, "queued": 0, "oldest_age_s": 1.23,
        "busy_slots": 50, "total_slots": 100, "idle_for_s": 7.89, "loop_lag_s": 0.012,
        "claim_tick_age_s": 0.46, "cpu_free_cores": 1.23, "memory_free_bytes": 123,
        "child_rss_bytes": 45, "since_change_s": 1000.12,
    }
    unknown = row(inputs, oldest_age=None, queued=None, claim_tick_age=None, cpu_free=None,
                  memory_free=None)
    figures = decide(POLICY, unknown).figures
    assert [k for k, v in figures.items() if v is None] == [
        "queued", "oldest_age_s", "claim_tick_age_s", "cpu_free_cores", "memory_free_bytes"]


@pytest.mark.parametrize(
    ("policy", "inputs", "desired"),
    [
        # --scale-up-after and --scale-down-after are the policy's, not fixed.
        (replace(POLICY, scale_up_after=10.0), WAITING, 2),
        (replace(POLICY, scale_up_after=0.5), row(WAITING, oldest_age=0.6), 3),
        (replace(POLICY, scale_down_after=2.0), row(IDLE, idle_for=2.0, last_change=NOW - 2),
         1),
        (replace(POLICY, scale_down_after=2.0), row(IDLE, idle_for=1.9), 2),
        (replace(POLICY, minimum=2), IDLE, 2),
        (replace(POLICY, maximum=2), WAITING, 2),
        (replace(POLICY, min_cpu_free=0.05), row(WAITING, cpu_free=0.1), 3),
    ],
)
def test_decide_follows_the_policy(policy: ScalingPolicy, inputs: ScalingInputs,
                                   desired: int) -> None:
    assert decide(policy, inputs).desired == desired


def test_a_steady_load_never_flaps() -> None:
    """Busy at the threshold, then a load that keeps every child a little busy: the size
    grows while runs wait and never comes back down while the load lasts."""
    sizes = []
    inputs = row(WAITING, size=1, ready=1, last_change=NOW - 1000)
    now = NOW
    for tick in range(200):
        now += 0.5
        waiting = tick < 10  # runs wait for 5 s, then the fleet keeps up
        inputs = row(inputs, now=now, oldest_age=3.0 if waiting else 0.1,
                     queued=100 if waiting else 2, busy_slots=10, idle_for=0.0)
        decision = decide(POLICY, inputs)
        if decision.desired != inputs.size:
            inputs = row(inputs, size=decision.desired, ready=decision.desired,
                         last_change=now)
        sizes.append(inputs.size)
    assert sizes == sorted(sizes)  # only up
    assert 1 < sizes[-1] <= POLICY.maximum


@pytest.mark.parametrize(
    ("decision", "size", "direction"),
    [
        (Decision(3, ""), 2, Direction.UP),
        (Decision(1, ""), 2, Direction.DOWN),
        (Decision(2, ""), 2, Direction.HOLD),
    ],
)
def test_direction(decision: Decision, size: int, direction: Direction) -> None:
    assert decision.direction(size) is direction


def test_host_reads_the_cgroup_memory_limit(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text("1073741824\n")
    (tmp_path / "memory.current").write_text("1000000000\n")
    host = Host(tmp_path)
    assert host.cgroup_memory_free() == 1073741824 - 1000000000
    free = host.memory_free()
    assert free is not None and free <= 73741824
    (tmp_path / "memory.max").write_text("max\n")
    assert host.cgroup_memory_free() is None


def test_host_without_a_cgroup(tmp_path: Path) -> None:
    host = Host(tmp_path / "absent")
    assert host.cgroup_memory_free() is None
    assert (host.memory_free() or 0) > 0
    assert 0.0 <= host.cpu_free() <= host.cores


def test_host_reads_the_cgroup_cpu_quota(tmp_path: Path) -> None:
    """Half a core of quota, all of it used: no CPU headroom, however idle the host is."""
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    (tmp_path / "cpu.stat").write_text("usage_usec 0\n")
    host = Host(tmp_path)
    host.cpu_free()
    used = host._usage
    assert used is not None
    host._usage = (used[0] - 1.0, used[1])  # one second ago, usage 0 then
    (tmp_path / "cpu.stat").write_text("usage_usec 500000\n")  # 0.5 s of CPU in 1 s
    host._cpu_free = None
    assert host.cpu_free() == pytest.approx(0.0, abs=0.05)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((None, None, None, None, None), {"children": 2}),
        (("3", None, None, None, None), {"children": 3}),
        ((None, "1", "3", None, None),
         {"children": 1, "min_children": 1, "max_children": 3, "scale_up_after": 2.0,
          "scale_down_after": 60.0}),
        (("2", "1", "3", "0.5", "5"),
         {"children": 2, "min_children": 1, "max_children": 3, "scale_up_after": 0.5,
          "scale_down_after": 5.0}),
    ],
)
def test_resolve_bounds(args: tuple[Any, ...], expected: dict[str, Any]) -> None:
    resolved = resolve_bounds(*args)
    assert resolved == expected
    FleetOptions(apps=("app",), **resolved)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((None, "1", None, None, None), "--min and --max go together"),
        ((None, None, "3", None, None), "--min and --max go together"),
        ((None, "0", "3", None, None), "--min must be >= 1"),
        ((None, "3", "2", None, None), "--max (2) must be >= --min (3)"),
        (("5", "1", "3", None, None), "-n (the start size, 5) must be within --min 1 .. --max 3"),
        (("1", "2", "3", None, None), "-n (the start size, 1) must be within"),
        ((None, "1", "3", "0", None), "--scale-up-after must be > 0"),
        ((None, "1", "3", None, "soon"), "--scale-down-after must be a number"),
        ((None, None, None, "2", None), "--scale-up-after needs --min and --max"),
        ((None, "x", "3", None, None), "--min"),
    ],
)
def test_bad_bounds(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        FleetOptions(apps=("app",), **resolve_bounds(*args))
    assert message in str(caught.value)


def test_status_says_the_bounds_only_with_elastic_sizing() -> None:
    fixed = fleet_status([], desired=2, draining=False)
    assert not {"min", "max", "desired"} & set(fixed)
    elastic = fleet_status([], desired=2, draining=False, bounds=(1, 4))
    assert (elastic["min"], elastic["max"], elastic["desired"]) == (1, 4, 2)


# --- the autoscaler's queue reads ------------------------------------------------------------


class _Queues:
    """The fleet's queue figures, counting the store reads asked for."""

    def __init__(self) -> None:
        self.depth = 0
        self.reads = 0

    async def queue_figures(self, names: list[str]) -> tuple[float, dict[str, QueueStat]]:
        self.reads += 1
        at = time.time() - 1.0 if self.depth else None
        return time.time(), {name: QueueStat(self.depth, at) for name in names}


def _fleet(children: int) -> tuple[Any, list[Child], _Queues]:
    queues = _Queues()
    kids = [Child(slot=i, process=None, conn=None) for i in range(children)]  # type: ignore[arg-type]
    for i, child in enumerate(kids):
        child.workflows = ["orders"]
        child.beat = Heartbeat(WorkerState.READY, f"w{i}", 1000 + i, free=4)
    slots = {i: SimpleNamespace(child=c, incoming=None) for i, c in enumerate(kids)}
    sup = SimpleNamespace(slots=slots, desired=children, fleet_metrics=queues)
    return sup, kids, queues


def _autoscaler(sup: Any, tmp_path: Path) -> Autoscaler:
    return Autoscaler(sup, ScalingPolicy(minimum=1, maximum=4), host=Host(tmp_path))


async def test_an_idle_fleet_reads_its_queue_once_per_idle_period(tmp_path: Path) -> None:
    sup, kids, queues = _fleet(2)
    scaler = _autoscaler(sup, tmp_path)
    for _ in range(20):  # ten seconds of ticks
        inputs = await scaler.measure(0.0)
        assert inputs.queued == 0 and inputs.oldest_age == 0.0
    assert queues.reads == 1
    # Past the idle period it looks again, and again only once.
    assert scaler._empty_seen is not None
    scaler._empty_seen = (scaler._empty_seen[0] - IDLE_QUEUE_READ_S - 1, scaler._empty_seen[1])
    for _ in range(5):
        await scaler.measure(0.0)
    assert queues.reads == 2


@pytest.mark.parametrize("change", ["busy", "stalled", "full", "starting", "names"])
async def test_a_fleet_not_idle_reads_its_queue_every_tick(tmp_path: Path, change: str) -> None:
    sup, kids, queues = _fleet(2)
    scaler = _autoscaler(sup, tmp_path)
    await scaler.measure(0.0)
    assert queues.reads == 1
    beat = kids[1].beat
    assert beat is not None
    if change == "busy":  # a run in flight: what is queued behind it is not known
        beat.in_flight = 1
    elif change == "stalled":  # a claim loop that stopped turning claims nothing queued
        beat.claim_tick_age = 5.0
    elif change == "full":  # no free slot: a run queued now would wait
        beat.free = 0
    elif change == "starting":  # a child not ready yet
        beat.state = WorkerState.STARTING
    else:  # another name served
        kids[1].workflows = ["orders", "refunds"]
    queues.depth = 3  # of each name
    inputs = await scaler.measure(0.0)
    assert queues.reads == 2 and inputs.queued == (6 if change == "names" else 3)
    await scaler.measure(0.0)
    assert queues.reads == 3


@pytest.mark.parametrize(("size", "desired", "resized"), [(2, 3, 1), (2, 1, 1), (2, 2, 0)])
def test_a_decision_resizes_the_fleet_as_it_is_taken(tmp_path: Path, size: int, desired: int,
                                                     resized: int) -> None:
    # A child the fleet adds is forked as the decision is taken, not at the supervisor's
    # next tick (up to a tick later, on the way to the scale-up's first run).
    sup, _, _ = _fleet(size)
    calls: list[int] = []
    sup.resize = lambda: calls.append(sup.desired)
    sup.fleet_metrics.own = Metrics()
    _autoscaler(sup, tmp_path).apply(ScalingInputs(now=NOW, size=size),
                                     Decision(desired, "a test decision"))
    assert calls == [desired] * resized
    assert sup.desired == desired
