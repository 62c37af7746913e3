"""The supervisor: desired vs running children, their health, crashes, recycling, signals.

One asyncio loop. Signal handlers only record a command; ``_tick`` acts. Children report
over their pipes (``pyrula.wire``); their exits are seen through the process sentinels.

The pure parts live apart: the restart policy (``restart``), what to do with a live child
(``watch``), the ``/status`` body (``status``), elastic sizing (``scaling``; its loop,
``autoscale``, only sets ``desired``), memory limits (``memory``) and upgrades
(``upgrade``, ``upgrades``), what a child's exit means (``exits``) and the commands the
signals record (``commands``): those two act on the supervisor's slots and queues, as the
upgrade does. What stays here is the one state machine over the slots (spawn, drain, quit,
recycle, scale), kept in one class because every one of those steps reads and changes the
same slots and queues.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

from pyrula.config.fleet import FleetOptions
from pyrula.config.store_url import shown_url
from pyrula.config.worker import WorkerOptions
from pyrula.logs import FLEET_LOGGER
from pyrula.store_wait import until_reachable
from pyrula.supervisor import upgrades
from pyrula.supervisor.autoscale import Autoscaler, policy_of
from pyrula.supervisor.boot import BootReport
from pyrula.supervisor.capacity import rss_of
from pyrula.supervisor.children import Child, ChildState, ForkFailed, Slot, Spawner
from pyrula.supervisor.commands import SIGNAL_COMMANDS, handle_commands
from pyrula.supervisor.exits import child_exited
from pyrula.supervisor.fleet_metrics import FleetMetrics
from pyrula.supervisor.memory import enforce_hard_limit, kill_over_hard_limit
from pyrula.supervisor.recovery import Recovery
from pyrula.supervisor.recycling import abandon_replacement, next_in_line, replacement_overdue
from pyrula.supervisor.restart import RestartPolicy
from pyrula.supervisor.status import SlotView, fleet_status
from pyrula.supervisor.upgrade import Upgrade
from pyrula.supervisor.watch import Kill, MemoryKill, Recycle, verdict
from pyrula.wire import WorkerState, decode, parse_heartbeat

logger = logging.getLogger(FLEET_LOGGER)

TICK = 0.1
#: How long the store may take to answer at start before the health port is served
#: anyway (to say ``store_unreachable``) rather than after the children are forked.
STORE_ANSWER_S = 0.2
#: The health port is served once the children first forked are ready, or this long after
#: they were forked, whichever comes first (bound before: a probe meanwhile waits in its
#: backlog, it is not refused).
PORT_AT_LATEST_S = 1.0


FORCED_EXIT = {signal.SIGTERM: 143, signal.SIGINT: 130}
#: After a second TERM/INT: how long the killed children's exits and the store calls that
#: requeue their runs may take before the fleet exits anyway (the orphan scan of the next
#: worker is the backstop for whatever the store did not take back by then).
QUIT_DEADLINE = 3.0



class Supervisor:
    def __init__(self, options: FleetOptions, spawner: Spawner, store: Any) -> None:
        self.options = options
        self.spawner = spawner
        self.store = store
        worker_options = WorkerOptions(**options.child_worker_options).resolve()
        self.recovery = Recovery(
            store, worker_options.poison_max_retries, worker_options.poison_retry_ttl_s,
            retry_for=max(worker_options.lock_ttl, worker_options.shard_lease_ttl))
        #: ``--store-wait``: how long to wait at start for a store that does not answer.
        self.store_wait = worker_options.store_wait
        #: Starting, and the store has not answered yet (/readyz: ``store_unreachable``).
        self.store_waiting = False
        self.policy = RestartPolicy(options.max_boot_failures)
        self.boots = BootReport()
        self.fleet_metrics = FleetMetrics(store)
        self.desired = options.children
        self.slots: dict[int, Slot] = {}
        self.draining = False
        self.exit_code = 0
        self.started_at = time.monotonic()
        self._commands: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
        self._recycle_queue: list[int] = []
        self._stopped = asyncio.Event()
        self._recoveries: set[asyncio.Task[None]] = set()
        self._drain_deadline: float | None = None
        self._quit_deadline: float | None = None  # set by a second TERM/INT
        # Children asked to drain that no longer belong to a slot (recycled, scaled down).
        self._leaving: set[Child] = set()
        #: The generation new children belong to, and the upgrade in progress.
        self.generation = 1
        self.upgrade: Upgrade | None = None
        #: Elastic sizing (``--min``/``--max``): the loop that sets ``desired``.
        self.autoscaler = Autoscaler(self, policy_of(options)) if options.elastic else None
        #: What serves the health port (``pyrula-fleet start`` sets it): started once the
        #: first children are ready (``PORT_AT_LATEST_S`` at the latest), so its imports
        #: are off their way to the first run, or as soon as the store is slow to answer
        #: at start (``/readyz`` says so).
        self.serve_port: Callable[[], Coroutine[Any, Any, None]] | None = None
        self._port_task: asyncio.Task[None] | None = None

    # --- child configuration ----------------------------------------------------

    def child_config(self, slot: int) -> dict[str, Any]:
        o = self.options
        return {
            "slot": slot,
            "apps": list(o.apps),
            "workflows": list(o.workflows),
            "store_url": o.store_url,
            "namespace": o.namespace,
            "cluster": o.cluster,
            "worker_options": o.child_worker_options,
            "log_format": o.log_format,
            "log_level": o.log_level,
            "cwd": os.getcwd(),
        }

    # --- running ----------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        if not await self._wait_for_store(loop):
            return 0
        for signum, command in SIGNAL_COMMANDS.items():
            loop.add_signal_handler(signum, self._commands.put_nowait, (command, signum))
        for index in range(self.desired):
            self.slots[index] = Slot(index)
            self._spawn(self.slots[index])
        # Served once every child is ready (its imports would hold this loop off their
        # heartbeats), or after PORT_AT_LATEST_S whatever the children do.
        port_at_latest = loop.call_later(PORT_AT_LATEST_S, self._start_port)
        # Spawned, not ready: ``fleet_ready`` follows once they all are, or boot failures.
        logger.info("fleet_started: %d children spawned (%s), store %s; not ready yet",
                    self.desired, self.spawner.method, shown_url(self.options.store_url),
                    extra={"event": "fleet_started", "children": self.desired})
        sizing = (None if self.autoscaler is None
                  else loop.create_task(self.autoscaler.run(), name="elastic-sizing"))
        try:
            while not self._stopped.is_set():
                handle_commands(self)
                await self._tick()
                try:
                    await asyncio.wait_for(self._stopped.wait(), TICK)
                except TimeoutError:
                    pass
        finally:
            port_at_latest.cancel()
            for signum in SIGNAL_COMMANDS:
                loop.remove_signal_handler(signum)
            if sizing is not None:
                sizing.cancel()
                await asyncio.gather(sizing, return_exceptions=True)
            await self._finish_recoveries()
        return self.exit_code

    async def _wait_for_store(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Before the first fork: wait for the store to answer (``pyrula.store_wait``), as
        the fleet tolerates its outage once running. False if TERM/INT came meanwhile
        (nothing was started, so nothing drains); StoreUnavailable past ``--store-wait``."""
        stop = asyncio.Event()
        for signum in FORCED_EXIT:
            loop.add_signal_handler(signum, stop.set)
        self.store_waiting = True
        try:
            waiting = asyncio.ensure_future(until_reachable(
                self.store.aping, where=shown_url(self.options.store_url),
                bound=self.store_wait, stopping=stop, log={},
            ))
            done, _ = await asyncio.wait({waiting}, timeout=STORE_ANSWER_S)
            if not done:
                self._start_port()  # a wait: /readyz says store_unreachable meanwhile
            return await waiting
        finally:
            self.store_waiting = False
            for signum in FORCED_EXIT:
                loop.remove_signal_handler(signum)

    def _start_port(self) -> None:
        if self.serve_port is not None and self._port_task is None:
            self._port_task = asyncio.get_running_loop().create_task(
                self.serve_port(), name="health-port")

    async def port_served(self) -> None:
        """Wait for the health port's start, if it was begun (raises what it raised)."""
        if self._port_task is not None:
            await self._port_task

    @property
    def quitting(self) -> bool:
        """A second TERM/INT came: the children were killed, the fleet is on its way out."""
        return self._quit_deadline is not None

    async def _finish_recoveries(self) -> None:
        """Wait for the requeueing of dead children's runs: without a bound normally, up
        to the quit deadline after a second signal (then the orphan scan takes over)."""
        if not self._recoveries:
            return
        if self._quit_deadline is None:
            await asyncio.gather(*self._recoveries, return_exceptions=True)
            return
        left = max(0.0, self._quit_deadline - time.monotonic())
        _, pending = await asyncio.wait(self._recoveries, timeout=left)
        if pending:
            logger.error("could not requeue the runs of %d killed children within %.1f s "
                         "(is the store reachable?); the orphan scan will requeue them",
                         len(pending), QUIT_DEADLINE, extra={"event": "forced_exit"})
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def _spawn(self, slot: Slot, *, incoming: bool = False) -> Child:
        try:
            child = self.spawner.spawn(slot.index, self.child_config(slot.index))
        except (OSError, EOFError) as exc:
            # The host refused a process (RLIMIT_NPROC, memory) and the fork server died
            # of it (EOF): no later spawn can succeed, and a fleet short of children it
            # cannot replace is worse than none. Kill what was forked and stop, in one line.
            forked = self._kill_and_wait("the host refused a new child")
            raise ForkFailed(
                f"cannot start child {slot.index + 1} of the fleet: {exc or type(exc).__name__}"
                f"; killed the {forked} children started so far (is -n above the host's "
                "process limit, ulimit -u, or its memory?)"
            ) from None
        child.generation = self.generation
        if self.options.max_runs_per_child:
            # Jitter, so children started together are not recycled together.
            child.run_limit = int(self.options.max_runs_per_child * random.uniform(1.0, 1.1))
        loop = asyncio.get_running_loop()
        loop.add_reader(child.conn.fileno(), self._on_message, child)
        loop.add_reader(child.sentinel, child_exited, self, child)
        if incoming:
            slot.incoming = child
        else:
            slot.child = child
        slot.respawn_at = None
        logger.info("child_spawned: slot %d pid %d", slot.index, child.pid,
                    extra={"event": "child_spawned", "slot": slot.index, "pid": child.pid})
        return child

    def _on_message(self, child: Child) -> None:
        try:
            while child.conn.poll():
                message = decode(child.conn.recv_bytes())
                self._handle_message(child, message)
        except (EOFError, OSError, ValueError):
            asyncio.get_running_loop().remove_reader(child.conn.fileno())

    def _handle_message(self, child: Child, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "heartbeat":
            child.beat = parse_heartbeat(message)
            child.last_beat = time.monotonic()
            if child.beat.state == WorkerState.READY and not child.ready_seen:
                child.ready_seen = True
                self.policy.ready(child.slot)
                logger.info("child_ready: slot %d pid %d worker %s in %.0f ms", child.slot,
                            child.pid, child.beat.worker_id,
                            (time.monotonic() - child.started_at) * 1000,
                            extra={"event": "child_ready", "slot": child.slot,
                                   "pid": child.pid, "worker_id": child.beat.worker_id})
                self.boots.ready(self.ready_children(), self.desired,
                                 time.monotonic() - self.started_at)
                if self.ready_children() >= self.desired:
                    self._start_port()
                if self.upgrade is not None:
                    self.upgrade.tell([child])
        elif kind == "boot_error":
            child.boot_error = self.boots.failed(child.slot, child.pid, message)
        elif kind == "refused":
            upgrades.refused(self, str(message.get("run_id")), str(message.get("build")))
        elif kind == "audited":
            upgrades.audited(self, message)
        elif kind == "metrics":
            child.metrics = dict(message.get("families") or {})
            child.workflows = [str(name) for name in message.get("workflows") or []]

    # --- commands ---------------------------------------------------------------

    def _begin_drain(self) -> None:
        if self.draining:
            return
        self.draining = True
        o = self.options
        # The children's own drain, plus a margin, before they are killed.
        self._drain_deadline = time.monotonic() + o.shutdown_grace + 3 * o.cancel_timeout + 5
        for slot in self.slots.values():
            for child in (slot.child, slot.incoming):
                if child is not None:
                    child.retiring = True
                    child.terminate()
        for child in self._leaving:  # an upgrade's old generation, still finishing runs
            if not child.retiring:
                child.retiring = True
                child.terminate()

    def _quit(self, signum: signal.Signals) -> None:
        """A second TERM/INT while draining: kill every child now. Their exits are then
        seen as deaths (``exits.child_exited``), which requeue the runs they held through the store
        at once, as for any child that died; the fleet exits once every child is gone and
        those calls returned, or at ``QUIT_DEADLINE`` whatever is left."""
        logger.warning("second %s while draining: quitting now (killing %d children, "
                       "requeueing their runs)", signum.name, len(self._children()),
                       extra={"event": "forced_exit"})
        self.exit_code = FORCED_EXIT.get(signum, 1)
        self._quit_deadline = time.monotonic() + QUIT_DEADLINE
        self._kill_all(f"second {signum.name} while draining")

    def _kill_all(self, reason: str) -> None:
        for child in self._children():
            child.killed_for = child.killed_for or reason
            child.kill()

    # --- the tick ---------------------------------------------------------------

    def _kill_and_wait(self, reason: str) -> int:
        """SIGKILL every child and wait for each (they may not have set their SIGTERM
        handler yet: the fork server's SIG_IGN is what they start with). Returns how many."""
        children = self._children()
        self._kill_all(reason)
        for child in children:
            child.process.join(5.0)
        return len(children)

    def _children(self) -> list[Child]:
        found = [c for s in self.slots.values() for c in (s.child, s.incoming) if c is not None]
        return found + [c for c in self._leaving if c not in found]

    async def _tick(self) -> None:
        now = time.monotonic()
        if self._quit_deadline is not None:
            if not self._children():
                self._stopped.set()
            elif now > self._quit_deadline:
                logger.error("%d killed children not seen exiting within %.1f s; exiting "
                             "without them", len(self._children()), QUIT_DEADLINE,
                             extra={"event": "forced_exit"})
                self._stopped.set()
            return
        if self.draining:
            self._measure()  # a draining child may still grow past the hard limit
            enforce_hard_limit(self._children(), self.options)
            if not self._children():
                logger.info("fleet_stopped", extra={"event": "fleet_stopped"})
                self._stopped.set()
            elif self._drain_deadline is not None and now > self._drain_deadline:
                logger.error("children still running past the drain deadline: killing them")
                self._kill_all("still running past the drain deadline")
                self._drain_deadline = now + 5
            return
        self._measure()
        for child in self._children():
            self._watch(child, now)
        self._scale()
        upgrades.tick(self, now)
        for slot in self.slots.values():
            if slot.child is None and slot.incoming is None and slot.respawn_at is not None \
                    and now >= slot.respawn_at:
                self._spawn(slot)
        self._recycle(now)

    def _measure(self) -> None:
        for child in self._children():
            rss = rss_of(child.pid)
            if rss is not None:
                child.rss_bytes = rss

    def _watch(self, child: Child, now: float) -> None:
        slot = self.slots.get(child.slot)
        action = verdict(child, slot is not None and slot.child is child, self.options, now)
        if isinstance(action, Kill):
            child.killed_for = f"no heartbeat for {action.silent:.1f} s (--child-timeout)"
            logger.error("child_unresponsive: slot %d pid %d sent no heartbeat for %.1f s; "
                         "killing it", child.slot, child.pid, action.silent,
                         extra={"event": "child_unresponsive", "slot": child.slot})
            child.kill()
        elif isinstance(action, MemoryKill):
            kill_over_hard_limit(child, action.rss_bytes, action.limit)
        elif isinstance(action, Recycle):
            if action.stalled_for is not None:
                logger.error("child_stalled: slot %d pid %d has claimed nothing for %.0f s "
                             "with free slots; recycling it", child.slot, child.pid,
                             action.stalled_for,
                             extra={"event": "child_stalled", "slot": child.slot})
            self._queue_recycle(child.slot, front=action.stalled_for is not None,
                                reason=action.reason)

    def _queue_recycle(self, index: int, *, front: bool = False, reason: str = "stalled") -> None:
        if index in self._recycle_queue:
            return
        logger.info("child_recycle: slot %d queued (%s)", index, reason,
                    extra={"event": "child_recycle", "slot": index})
        if front:
            self._recycle_queue.insert(0, index)
        else:
            self._recycle_queue.append(index)

    def _recycle(self, now: float) -> None:
        """One slot at a time: start its replacement, and once that is ready, drain the
        old child. Capacity is kept throughout."""
        if not self._recycle_queue or (self.upgrade is not None and not self.upgrade.swapped):
            return  # an upgrade replaces every slot's child itself; recycling waits
        index = self._recycle_queue[0]
        slot = self.slots.get(index)
        if slot is None:
            self._recycle_queue.pop(0)
            return
        if slot.incoming is None:
            if slot.child is None:  # nothing to replace: it died meanwhile
                self._recycle_queue.pop(0)
                return
            self._spawn(slot, incoming=True)
            return
        if not slot.incoming.ready_seen:
            if replacement_overdue(slot.incoming, self.options.child_timeout, now):
                abandon_replacement(slot.incoming, now)
                next_in_line(self._recycle_queue, index)
            return
        old, slot.child, slot.incoming = slot.child, slot.incoming, None
        slot.restarts += 1
        self._recycle_queue.pop(0)
        if old is not None:
            old.retiring = True
            old.terminate()
            self._leaving.add(old)

    def resize(self) -> None:
        """Move the fleet's size one child towards ``desired`` (each tick does; elastic
        sizing calls it as it decides, so a child it adds is forked at once)."""
        if not self.draining:
            self._scale()

    def _scale(self) -> None:
        live = sorted(self.slots)
        if len(live) < self.desired:
            index = next(i for i in range(len(live) + 1) if i not in self.slots)
            self.slots[index] = Slot(index)
            self._spawn(self.slots[index])
        elif len(live) > self.desired:
            index = live[-1]
            slot = self.slots.pop(index)
            for child in (slot.child, slot.incoming):
                if child is not None:
                    child.retiring = True
                    child.terminate()
                    self._leaving.add(child)

    # --- health -----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        o = self.options
        body = upgrades.status(self, fleet_status(
            (SlotView(i, s.child, s.restarts) for i, s in self.slots.items()),
            self.desired, self.draining,
            bounds=(o.min_children, o.max_children) if self.autoscaler is not None else None,
        ))
        # Which store: a SQLite file by its absolute path, a Valkey URL redacted.
        body["store"] = shown_url(o.store_url)
        return body

    async def metrics(self) -> dict[str, Any]:
        """The fleet's metrics families (``FleetMetrics.families``), with the queues of the
        workflows its children serve read from the store once, not once per child."""
        await self.fleet_metrics.read_queues(self.served_workflows())
        return self.families()

    def families(self) -> dict[str, Any]:
        """The children's metrics summed with the fleet's own, without asking the store
        (what the dashboard samples every second)."""
        return self.fleet_metrics.families(child.metrics for child in self._children())

    def served_workflows(self) -> list[str]:
        """The workflow names the fleet's children serve."""
        return sorted({name for child in self._children() for name in child.workflows})

    def ready_children(self) -> int:
        return sum(1 for c in self._children() if c.state is ChildState.READY)

    def serving_children(self) -> int:
        """Ready children whose store answers (what the fleet's /readyz counts)."""
        return sum(1 for c in self._children() if c.state is ChildState.READY
                   and c.beat is not None and c.beat.store_ok)
