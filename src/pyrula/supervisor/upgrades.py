"""The supervisor's side of an upgrade (``supervisor.upgrade`` says what one is): starting
it, swapping each slot to its new child once that is ready, handing over the runs the new
code cannot replay, and ending it once the old generation is gone."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from pyrula.logs import FLEET_LOGGER
from pyrula.supervisor.children import Child, ChildState
from pyrula.supervisor.status import child_entry
from pyrula.supervisor.upgrade import Upgrade

if TYPE_CHECKING:
    from pyrula.supervisor.supervisor import Supervisor

logger = logging.getLogger(FLEET_LOGGER)


def begin(sup: Supervisor) -> None:
    """SIGUSR2 (``pyrula-fleet upgrade``): load the code anew and start a new generation."""
    if sup.draining:
        return
    if sup.upgrade is not None:
        logger.warning("received SIGUSR2 while generation %d is still retiring: ignored; "
                       "upgrade again once it is gone", sup.upgrade.old,
                       extra={"event": "fleet_upgrade"})
        return
    old = sup.generation
    sup.generation += 1
    sup.spawner.reload()
    sup.upgrade = Upgrade(old, sup.generation, sup.options.drain_deadline, time.monotonic())
    logger.info("fleet_upgrade: received SIGUSR2: starting generation %d on the code loaded "
                "anew beside generation %d", sup.generation, old,
                extra={"event": "fleet_upgrade", "generation": sup.generation})
    for slot in sup.slots.values():
        if slot.incoming is None:
            sup._spawn(slot, incoming=True)


def _new_children(sup: Supervisor) -> list[Child]:
    upgrade = sup.upgrade
    return [c for c in sup._children()
            if upgrade is not None and c.generation == upgrade.new]


def tick(sup: Supervisor, now: float) -> None:
    upgrade = sup.upgrade
    if upgrade is None:
        return
    for slot in sup.slots.values():
        incoming = slot.incoming
        if upgrade.swapped or incoming is None or incoming.generation != upgrade.new \
                or not incoming.ready_seen:
            continue
        old, slot.child, slot.incoming = slot.child, incoming, None
        if old is not None:
            sup._leaving.add(old)
            upgrade.retire(old, _new_children(sup))

    def drain(child: Child, why: str) -> None:
        logger.info("child_retired: slot %d pid %d (generation %d) drains: %s", child.slot,
                    child.pid, upgrade.old, why,
                    extra={"event": "child_retired", "slot": child.slot, "pid": child.pid})
        child.retiring = True
        child.terminate()
        upgrade.tell(_new_children(sup))

    if upgrade.swapped or all(slot.incoming is None for slot in sup.slots.values()):
        # Every slot serves the new code: from here on a slot's incoming child is a
        # recycling's, which runs as it does outside an upgrade.
        upgrade.swapped = True
        upgrade.audit(now, _new_children(sup))
        upgrade.tick(now, drain)


def audited(sup: Supervisor, message: dict[str, Any]) -> None:
    """A new child's audit of the old build: how many of its open runs it cannot replay."""
    if sup.upgrade is None:
        return
    sup.upgrade.audited(str(message.get("build")), int(message.get("open") or 0),
                        [str(r) for r in message.get("runs") or []], time.monotonic())


def refused(sup: Supervisor, run_id: str, build: str) -> None:
    if sup.upgrade is not None and sup.upgrade.refused(run_id, build):
        return
    logger.warning("run %s needs build %s, and no child of that build is left to take it; "
                   "the new generation parks it (pyrula runs stuck lists it)", run_id, build,
                   extra={"event": "run_build_mismatch", "run_id": run_id})


def exited(sup: Supervisor, child: Child) -> None:
    upgrade = sup.upgrade
    if upgrade is None or not upgrade.exited(child):
        return
    upgrade.tell(_new_children(sup))  # the builds still alive to take what they cannot run
    if upgrade.done:
        logger.info("fleet_upgraded: generation %d is gone; generation %d serves alone",
                    upgrade.old, upgrade.new,
                    extra={"event": "fleet_upgraded", "generation": upgrade.new})
        sup.upgrade = None


def status(sup: Supervisor, body: dict[str, Any]) -> dict[str, Any]:
    """``/status`` with each child's ``generation`` and, during an upgrade, the retiring
    children and ``generations``."""
    by_pid = {c.pid: c for c in sup._children()}
    for entry in body["children"]:
        child = by_pid.get(entry["pid"])
        entry["generation"] = child.generation if child is not None else sup.generation
    upgrade = sup.upgrade
    if upgrade is None:
        return body
    for retired in upgrade.retired.values():
        entry = child_entry(retired.child, retired.child.slot, 0)
        body["children"].append({**entry, "state": ChildState.DRAINING,
                                 "generation": upgrade.old})
    serving = [s.child for s in sup.slots.values()
               if s.child is not None and s.child.generation == upgrade.new]
    new_build = next((c.beat.build for c in serving if c.beat is not None), None)
    old_build = next((r.child.beat.build for r in upgrade.retired.values()
                      if r.child.beat is not None), None)
    ready = all(s.incoming is None for s in sup.slots.values())
    body["generations"] = upgrade.generations(serving, new_build, old_build, ready)
    return body
