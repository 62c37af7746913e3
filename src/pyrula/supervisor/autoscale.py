"""Elastic sizing's mechanism: measure every ``INTERVAL``, ask ``scaling.decide``, set
``supervisor.desired``. The supervisor's ``_scale`` then adds a slot or drains the highest
one (SIGTERM: the worker's own shutdown, which finishes or hands back its runs and releases
its shards), exactly as for SIGTTIN/SIGTTOU.

What it measures: the queue of the workflows the children serve (the store's
``QueueStats``, on the store's clock), the ready children's heartbeats (runs in flight,
free slots, claim-loop progress), how long each has been idle, its own loop's lag, and the
host's CPU and memory headroom (psutil, and the cgroup v2 limits where the fleet runs in
a container). Every change is logged ``fleet_scaled`` with its reason and figures and
counted in ``pyrula_fleet_scaled_total{direction}``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyrula.config.parse import env_value, parse_float
from pyrula.logs import FLEET_LOGGER
from pyrula.supervisor.children import Child, ChildState
from pyrula.supervisor.scaling import (
    DEFAULT_MIN_CPU_FREE,
    Decision,
    Direction,
    ScalingInputs,
    ScalingPolicy,
    decide,
)

if TYPE_CHECKING:
    from pyrula.supervisor.supervisor import Supervisor

logger = logging.getLogger(FLEET_LOGGER)

INTERVAL = 0.5
#: How often an idle fleet reads its queue anyway (``Autoscaler._queue_known_empty``).
IDLE_QUEUE_READ_S = 30.0
SCALED = "pyrula.fleet.scaled"
CGROUP = Path("/sys/fs/cgroup")
#: How much of the last CPU reading the smoothed figure keeps per tick (about 2 s memory).
CPU_SMOOTHING = 0.3


class Host:
    """CPU and memory headroom of the host, and of the cgroup v2 the fleet runs in."""

    def __init__(self, cgroup: Path = CGROUP) -> None:
        self.cgroup = cgroup
        self.cores = os.cpu_count() or 1
        self._cpu_free: float | None = None
        self._usage: tuple[float, float] | None = None  # (monotonic, cgroup usage seconds)
        import psutil  # an elastic fleet's only: not on every fleet's way to its children

        self._psutil = psutil
        psutil.cpu_percent(None)  # the first call only starts the measurement

    def _read(self, name: str) -> str | None:
        try:
            return (self.cgroup / name).read_text().strip()
        except OSError:
            return None

    def cgroup_memory_free(self) -> int | None:
        """Room under ``memory.max`` (None without a limit or without cgroup v2)."""
        limit, current = self._read("memory.max"), self._read("memory.current")
        if limit is None or current is None or limit == "max":
            return None
        try:
            return max(0, int(limit) - int(current))
        except ValueError:
            return None

    def memory_free(self) -> int | None:
        free: list[int] = [int(self._psutil.virtual_memory().available)]
        room = self.cgroup_memory_free()
        if room is not None:
            free.append(room)
        return min(free)

    def _cgroup_cpu_free(self) -> float | None:
        """Cores left of the ``cpu.max`` quota since the last reading (None: no quota)."""
        quota, stat = self._read("cpu.max"), self._read("cpu.stat")
        if quota is None or stat is None or quota.startswith("max"):
            return None
        try:
            allowed, period = (float(x) for x in quota.split()[:2])
            usage = next(float(line.split()[1]) / 1e6 for line in stat.splitlines()
                         if line.startswith("usage_usec"))
        except (ValueError, StopIteration):
            return None
        now, last = time.monotonic(), self._usage
        self._usage = (now, usage)
        if last is None or now <= last[0]:
            return None
        used = (usage - last[1]) / (now - last[0])
        return max(0.0, allowed / period - used)

    def cpu_free(self) -> float:
        """Free cores (smoothed): the host's, or the container quota's if smaller."""
        free = self.cores * (1.0 - self._psutil.cpu_percent(None) / 100.0)
        quota_free = self._cgroup_cpu_free()
        if quota_free is not None:
            free = min(free, quota_free)
        if self._cpu_free is None:
            self._cpu_free = free
        else:
            self._cpu_free += CPU_SMOOTHING * (free - self._cpu_free)
        return self._cpu_free


class Autoscaler:
    """The loop that sizes an elastic fleet (started by the supervisor)."""

    def __init__(self, supervisor: Supervisor, policy: ScalingPolicy,
                 host: Host | None = None) -> None:
        self.supervisor = supervisor
        self.policy = policy
        self.host = host or Host()
        self.last_change = time.monotonic()
        self._idle_since: dict[Child, tuple[float, int]] = {}  # since, runs done then
        self._refusal: str | None = None  # the last refusal logged (logged once per kind)
        #: When a queue read last found the queue empty, and of which names.
        self._empty_seen: tuple[float, tuple[str, ...]] | None = None

    async def run(self) -> None:
        due = time.monotonic() + INTERVAL
        while True:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            lag = max(0.0, time.monotonic() - due)
            due = time.monotonic() + INTERVAL
            if self.supervisor.draining:
                continue
            try:
                await self.tick(lag)
            except Exception:  # a bad reading must not stop the sizing for good
                logger.exception("elastic sizing: a tick failed; trying again")

    async def tick(self, lag: float) -> Decision:
        inputs = await self.measure(lag)
        decision = decide(self.policy, inputs)
        self.apply(inputs, decision)
        return decision

    async def measure(self, lag: float) -> ScalingInputs:
        sup = self.supervisor
        serving = [s.child for s in sup.slots.values()
                   if s.child is not None and not s.child.retiring]
        ready = [c for c in serving if c.state is ChildState.READY and c.beat is not None]
        names = sorted({name for c in serving for name in c.workflows})
        queued: int | None = None
        oldest: float | None = None
        now = time.monotonic()
        if self._queue_known_empty(serving, ready, names, now):
            queued, oldest = 0, 0.0
        else:
            stats = await sup.fleet_metrics.queue_figures(names)
            if stats is not None:
                now_store, by_name = stats
                queued = sum(stat.depth for stat in by_name.values())
                oldest = max((max(0.0, now_store - stat.oldest_at) for stat in by_name.values()
                              if stat.oldest_at is not None), default=0.0)
                self._empty_seen = (now, tuple(names)) if queued == 0 else None
        busy = total = 0
        claim_ages: list[float] = []
        for child in ready:
            beat = child.beat
            assert beat is not None
            busy += beat.in_flight
            total += beat.in_flight + beat.free
            if beat.free > 0:
                claim_ages.append(beat.claim_tick_age)
        return ScalingInputs(
            now=now, size=sup.desired, ready=len(ready),
            starting=sum(1 for s in sup.slots.values() for c in (s.child, s.incoming)
                         if c is not None and c.state is ChildState.STARTING),
            queued=queued, oldest_age=oldest, busy_slots=busy, total_slots=total,
            idle_for=self._idle_for(ready, now), loop_lag=lag,
            claim_tick_age=min(claim_ages) if claim_ages else None,
            cpu_free=self.host.cpu_free(), memory_free=self.host.memory_free(),
            child_rss=max((c.rss_bytes for c in serving), default=0),
            last_change=self.last_change,
        )

    def _queue_known_empty(self, serving: list[Child], ready: list[Child], names: list[str],
                           now: float) -> bool:
        """Whether the queue is known to be empty without asking the store: the last read
        (under ``IDLE_QUEUE_READ_S`` ago, of the same names) found it empty, and every
        child since is ready, running nothing and claiming (its claim loop turned within two
        seconds), so a run queued meanwhile would have been claimed, and would show as a run
        in flight. An idle fleet then reads its queue every ``IDLE_QUEUE_READ_S`` instead of
        every tick: on Valkey a read is a script call per shard of every name."""
        seen = self._empty_seen
        if seen is None or seen[1] != tuple(names) or now - seen[0] > IDLE_QUEUE_READ_S:
            return False
        if not ready or len(ready) != len(serving):
            return False
        for child in ready:
            beat = child.beat
            if beat is None or beat.in_flight or beat.free <= 0 or beat.claim_tick_age > 2.0:
                return False
        return True

    def _idle_for(self, ready: list[Child], now: float) -> float:
        """How long every ready child has had no run in flight (0 if one has one now). A
        child that ended a run between two readings was not idle meanwhile."""
        seen: dict[Child, tuple[float, int]] = {}
        for child in ready:
            beat = child.beat
            assert beat is not None
            if beat.in_flight:
                continue
            since, done = self._idle_since.get(child, (now, beat.runs_done))
            seen[child] = (since, done) if done == beat.runs_done else (now, beat.runs_done)
        self._idle_since = seen
        if not ready or len(seen) < len(ready):
            return 0.0
        return now - max(since for since, _ in seen.values())

    def apply(self, inputs: ScalingInputs, decision: Decision) -> None:
        direction = decision.direction(inputs.size)
        if decision.refused:
            kind = decision.reason.partition("not growing: ")[2].partition(" (")[0]
            if kind != self._refusal:
                self._refusal = kind
                logger.info("fleet_scale_held: %d children, %s", inputs.size, decision.reason,
                            extra={"event": "fleet_scale_held", "reason": decision.reason,
                                   **decision.figures})
            return
        if direction is Direction.HOLD:
            return
        self._refusal = None
        self.supervisor.desired = decision.desired
        self.supervisor.resize()  # now, not at the supervisor's next tick
        self.last_change = inputs.now
        self.supervisor.fleet_metrics.own.inc(SCALED, direction=direction.value)
        logger.info("fleet_scaled: %s %d -> %d children: %s; %s", direction.value,
                    inputs.size, decision.desired, decision.reason, _describe(decision),
                    extra={"event": "fleet_scaled", "direction": direction.value,
                           "from": inputs.size, "to": decision.desired,
                           "reason": decision.reason, **decision.figures})


def _describe(decision: Decision) -> str:
    return " ".join(f"{k}={v}" for k, v in decision.figures.items() if v is not None)


def policy_of(options: Any) -> ScalingPolicy:
    """The policy of ``FleetOptions`` with elastic sizing (``--min``/``--max``...).
    ``PYRULA_SCALE_MIN_CPU_FREE`` (cores, default 0.25; 0 turns the check off) tunes the
    CPU headroom a new child needs: on a host shared with other work, whole-host CPU may
    stay busy while this fleet still has room."""
    raw = env_value("PYRULA_SCALE_MIN_CPU_FREE")
    cpu_free = DEFAULT_MIN_CPU_FREE if raw in (None, "") else parse_float(
        "PYRULA_SCALE_MIN_CPU_FREE", raw, minimum=0.0, strict=False)
    return ScalingPolicy(minimum=options.min_children, maximum=options.max_children,
                         scale_up_after=options.scale_up_after,
                         scale_down_after=options.scale_down_after, min_cpu_free=cpu_free)
