"""A child's process has ended: the supervisor's account of it (``child_exited``).

Whether it drained on purpose, drained on its own or died; for a death, the runs it held
are requeued through the store at once, each crash charged only to the runs that were in
their own code when it died; and the restart policy says whether its slot gets another
child, and when, or whether the fleet stops in a crash loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from pyrula.logs import FLEET_LOGGER
from pyrula.supervisor import upgrades
from pyrula.supervisor.children import Child, describe_exit
from pyrula.supervisor.commands import handle_commands
from pyrula.supervisor.recycling import next_in_line
from pyrula.supervisor.restart import GiveUp
from pyrula.wire import EXIT_BOOT_FAILURE

if TYPE_CHECKING:
    from pyrula.supervisor.children import Slot
    from pyrula.supervisor.supervisor import Supervisor

logger = logging.getLogger(FLEET_LOGGER)

#: The exit code multiprocessing reports for a child whose fork server is gone.
LOST_EXIT_CODE = 255


def child_exited(sup: Supervisor, child: Child) -> None:
    """A child's process ended: account for it, recover the runs it held, and say whether
    and when its slot gets another."""
    # A signal sent to the whole process group (honcho, docker stop, systemd, a
    # terminal) reaches the children and us at once: act on ours before judging
    # their exits, so that children draining because of it count as drained.
    handle_commands(sup)
    slot = _detach(sup, child)
    text, signame = describe_exit(child.exitcode)
    if _drained(sup, child, slot, text):
        _release_drained(sup, child)
        return
    _died(sup, child, text, signame)
    if sup.draining or child.retiring or slot is None:
        return
    _respawn_or_stop(sup, child, slot)


def _detach(sup: Supervisor, child: Child) -> Slot | None:
    """Stop watching ``child``, keep what it said last, and free its place in its slot;
    the slot, if it still has one."""
    loop = asyncio.get_running_loop()
    loop.remove_reader(child.sentinel)
    child.process.join(0)
    sup._on_message(child)  # whatever it said last (a boot error, its last metrics)
    child.take_report()  # and the runs it held, if it wrote that since
    sup.fleet_metrics.retire(child.metrics)
    try:
        loop.remove_reader(child.conn.fileno())
    except (ValueError, OSError):
        pass
    child.conn.close()
    sup._leaving.discard(child)
    upgrades.exited(sup, child)
    slot = sup.slots.get(child.slot)
    if slot is not None and slot.incoming is child:
        slot.incoming = None
        next_in_line(sup._recycle_queue, child.slot)  # it failed: the others' turn
    elif slot is not None and slot.child is child:
        slot.child = None
    return slot


def _drained(sup: Supervisor, child: Child, slot: Slot | None, text: str) -> bool:
    """Whether ``child`` drained rather than died (logged; one that drained on its own
    is replaced at once): nothing of it to recover then."""
    if child.retiring and (child.exitcode == 0 or _code_lost(sup, child)):
        if child.exitcode != 0:
            text = "its exit code was lost with its replaced fork server"
        logger.info("child_exited: slot %d pid %d (%s) after draining", child.slot,
                    child.pid, text, extra={"event": "child_exited", "slot": child.slot})
        return True
    if child.exitcode == 0 and child.ready_seen:
        # Drained on its own (someone sent it SIGTERM): its runs were finished or
        # requeued by its own shutdown, so there is nothing to recover; replace it.
        logger.warning("child_exited: slot %d pid %d (%s) after draining on its own",
                       child.slot, child.pid, text,
                       extra={"event": "child_exited", "slot": child.slot})
        if not sup.draining and slot is not None and slot.child is None \
                and slot.incoming is None:
            slot.restarts += 1
            slot.respawn_at = time.monotonic()
        return True
    return False


def _release_drained(sup: Supervisor, child: Child) -> None:
    """A child that drained while the fleet serves on (a recycle, a scale-down, an
    upgrade, a SIGTERM of its own): release its shards again, in the background, in case
    the store was down when it released them itself."""
    beat = child.beat
    if sup.draining or beat is None or not beat.worker_id or not any(beat.shards.values()):
        return
    task = asyncio.get_running_loop().create_task(
        sup.recovery.child_drained(beat.worker_id, keep_trying=lambda: not sup.draining))
    sup._recoveries.add(task)
    task.add_done_callback(sup._recoveries.discard)


def _died(sup: Supervisor, child: Child, text: str, signame: str | None) -> None:
    """Log the death of ``child`` and requeue the runs it held through the store (a
    recovery task the supervisor awaits before it exits)."""
    beat = child.beat
    held = dict(beat.held) if beat is not None else {}
    worker_id = beat.worker_id if beat is not None else ""
    level = logging.ERROR if signame == "SIGKILL" or child.killed_for else logging.WARNING
    if sup.quitting:
        level = logging.WARNING  # killed on the operator's word, not by a fault
    lived = time.monotonic() - child.started_at
    logger.log(level, "child_exited: slot %d pid %d died (%s%s) after %.1f s holding %d "
               "runs", child.slot, child.pid, text,
               f", killed: {child.killed_for}" if child.killed_for else "", lived, len(held),
               extra={"event": "child_exited", "slot": child.slot, "pid": child.pid,
                      "exit": text})
    if not worker_id or not (held or child.ready_seen):
        return
    evidence = {"exit": text, "exit_code": child.exitcode, "exit_signal": signame,
                "pid": child.pid, "rss_bytes": child.rss_bytes, "killed_for": child.killed_for}
    user_code = None if beat is None or beat.user_code is None else list(beat.user_code)
    suspects = [] if beat is None else list(beat.suspects)
    if sup.quitting:
        evidence["cause"] = "forced_exit"
    task = asyncio.get_running_loop().create_task(
        _recover(sup, worker_id, held, evidence, user_code, suspects))
    sup._recoveries.add(task)
    task.add_done_callback(sup._recoveries.discard)


def _respawn_or_stop(sup: Supervisor, child: Child, slot: Slot) -> None:
    """The restart policy's word on a dead child: its slot's respawn time, or a crash loop
    that stops the fleet."""
    lived = time.monotonic() - child.started_at
    decision = sup.policy.exited(child.slot, child.ready_seen, lived, child.boot_error)
    if isinstance(decision, GiveUp):
        logger.critical("fleet_crash_loop: %s; stopping the fleet", decision.reason,
                        extra={"event": "fleet_crash_loop"})
        sup.exit_code = EXIT_BOOT_FAILURE
        sup._begin_drain()
        return
    if slot.child is None and slot.incoming is None:
        slot.restarts += 1
        slot.respawn_at = time.monotonic() + decision.delay


def _code_lost(sup: Supervisor, child: Child) -> bool:
    """Whether a drained child's exit code was lost: a child forked by a fork server
    that a reload replaced reports 255 once that server has gone, whatever it exited
    with. Its last heartbeat holding no run is then the evidence it drained."""
    return (child.exitcode == LOST_EXIT_CODE and child.server != sup.spawner.server
            and child.beat is not None and not child.beat.held)


async def _recover(sup: Supervisor, worker_id: str, held: dict[str, int],
                   evidence: dict[str, Any], user_code: list[str] | None,
                   suspects: list[str]) -> None:
    requeued, quarantined, charged = await sup.recovery.child_died(
        worker_id, held, evidence, user_code, suspects, keep_trying=lambda: not sup.draining)
    if requeued:
        sup.fleet_metrics.own.inc("pyrula.workflows.runs.requeued", requeued,
                                  reason="orphaned")
    if requeued or quarantined:
        logger.warning("runs_recovered: %d runs of dead child %s requeued, %d quarantined; "
                       "a crash counted against %d of them (the others were not in their "
                       "code)", requeued, worker_id, quarantined, charged,
                       extra={"event": "runs_recovered", "worker_id": worker_id,
                              "charged": charged})
