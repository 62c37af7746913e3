"""How the supervisor starts the fork server its children are forked from: what the fork
server is told to preload, through the environment it inherits. The fork server runs
``pyrula.supervisor.preload``, which reads these variables.

Light on purpose (multiprocessing's fork server, ``os``, ``json``): a fleet starts its fork
server before it has imported anything else (``pyrula.supervisor.prestart``).
"""

from __future__ import annotations

import json
import multiprocessing.forkserver
import multiprocessing.process
import os
import sys
from multiprocessing import resource_tracker
from typing import Any

#: The module the fork server preloads: it loads the app and the modules below itself.
PRELOAD_MODULE = "pyrula.supervisor.preload"
#: Environment variable naming the modules the fork server preloads (comma-separated;
#: internal, read by ``pyrula.supervisor.preload``).
PRELOAD_ENV = "_PYRULA_FLEET_PRELOAD"
#: Environment variable with the fork server's app check (JSON ``{"apps", "workflows",
#: "report"}``; internal): it loads the app as a child would and writes what came of it
#: (JSON ``{"ok": true}`` or ``{"ok": false, "message", "frames"}``) to ``report``.
PRELOAD_CHECK_ENV = "_PYRULA_FLEET_PRELOAD_CHECK"
#: Environment variable with the path of the supervisor's main script (the
#: ``pyrula-fleet`` console script; internal): the fork server takes it as its own
#: ``__main__.__file__``, so that a child does not run that script again at its start.
PRELOAD_MAIN_ENV = "_PYRULA_FLEET_MAIN"


def main_script() -> str | None:
    """The path multiprocessing gives each child of this process as the main script to
    run again (``__main__``'s file, made absolute as it does), or None when it gives none
    (an interpreter run with ``-c`` or ``-m``)."""
    main = sys.modules["__main__"]
    if getattr(main.__spec__, "name", None) is not None:
        return None
    path = getattr(main, "__file__", None)
    if not isinstance(path, str):
        return None
    origin = multiprocessing.process.ORIGINAL_DIR  # type: ignore[attr-defined]
    if not os.path.isabs(path) and origin is not None:
        path = os.path.join(origin, path)
    return os.path.normpath(path)


def configure(preload: list[str], check: dict[str, Any] | None) -> None:
    """Make the next fork server started preload ``preload`` and check the app as
    ``check`` says (through ``PRELOAD_MODULE``, which survives an app that fails to import,
    where multiprocessing's own preload by name would not)."""
    os.environ[PRELOAD_ENV] = ",".join(preload)
    main = main_script()
    if main is not None:
        os.environ[PRELOAD_MAIN_ENV] = main
    if check is not None:
        os.environ[PRELOAD_CHECK_ENV] = json.dumps(check)
    multiprocessing.forkserver.set_forkserver_preload([PRELOAD_MODULE])


def start(*, tracker_later: bool = False) -> None:
    """Start the fork server now, unless one is running.

    multiprocessing starts its resource tracker (another interpreter) first. With
    ``tracker_later`` it does not: at a fleet's start that interpreter would take a core
    from the fork server's imports and the supervisor's, both on the way to the first
    child. The supervisor starts it with ``start_tracker`` once its own imports are done;
    a first spawn would start it anyway (multiprocessing does when it passes the tracker
    to a child)."""
    if not tracker_later:
        multiprocessing.forkserver.ensure_running()
        return
    real = resource_tracker.ensure_running
    resource_tracker.ensure_running = _not_yet
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        resource_tracker.ensure_running = real


def _not_yet() -> None:
    """The resource tracker's start, left for later (``start``)."""


def start_tracker() -> None:
    """Start multiprocessing's resource tracker, unless it is running."""
    resource_tracker.ensure_running()
