"""``pyrula-fleet``: the console script's entry point.

It starts the fork server (``pyrula.supervisor.prestart``) before it imports the CLI
(``pyrula.cli.fleet_commands``, with click and the fleet's options), so that the fleet's
two imports on the way to its first run, the supervisor's and the fork server's, run side
by side instead of one after the other.
"""

from __future__ import annotations

import sys


def main() -> None:
    from pyrula.supervisor.prestart import start_early

    start_early(sys.argv[1:])
    from pyrula.cli.fleet_commands import main as run

    run()
