"""The fleet's signals, as commands: each handler only records one (``SIGNAL_COMMANDS``);
the supervisor's loop acts on them here, in order (``handle_commands``)."""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING

from pyrula.logs import FLEET_LOGGER
from pyrula.supervisor import upgrades

if TYPE_CHECKING:
    from pyrula.supervisor.supervisor import Supervisor

logger = logging.getLogger(FLEET_LOGGER)

#: Signals and the command each one records (the handler does nothing else).
SIGNAL_COMMANDS = {
    signal.SIGTERM: "stop",
    signal.SIGINT: "stop",
    signal.SIGHUP: "reload",
    signal.SIGTTIN: "add",
    signal.SIGTTOU: "remove",
    signal.SIGUSR2: "upgrade",
}


def handle_commands(sup: Supervisor) -> None:
    """Act on the commands the signal handlers recorded, in order."""
    while not sup._commands.empty():
        command, signum = sup._commands.get_nowait()
        if command == "stop":
            if sup.quitting:
                continue
            if sup.draining:
                sup._quit(signal.Signals(signum))
                continue
            logger.info("received %s: draining every child (send it again to quit at "
                        "once)", signal.Signals(signum).name,
                        extra={"event": "fleet_draining"})
            sup._begin_drain()
        elif command == "reload":
            logger.info("received SIGHUP: loading the code anew, replacing children one "
                        "at a time", extra={"event": "fleet_reload"})
            sup.spawner.reload()
            sup._recycle_queue = [i for i in sorted(sup.slots)
                                   if i not in sup._recycle_queue] + sup._recycle_queue
        elif command in ("add", "remove") and sup.autoscaler is not None:
            logger.warning("received %s: ignored, --min/--max size this fleet (%d "
                           "desired); restart it with other bounds to change them",
                           signal.Signals(signum).name, sup.desired,
                           extra={"event": "fleet_scale", "desired": sup.desired})
        elif command == "upgrade":
            upgrades.begin(sup)
        elif command == "add":
            sup.desired += 1
            logger.info("received SIGTTIN: %d children desired", sup.desired,
                        extra={"event": "fleet_scale", "desired": sup.desired})
        elif command == "remove":
            if sup.desired > 1:
                sup.desired -= 1
            logger.info("received SIGTTOU: %d children desired", sup.desired,
                        extra={"event": "fleet_scale", "desired": sup.desired})
