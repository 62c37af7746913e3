"""Start the fork server before the fleet's CLI is imported.

A fleet's way to its first run goes through two imports that do not wait on each other:
the supervisor's (click, the options, psutil, asyncio, the supervisor) and the fork
server's (the app and the worker's runtime). Started one after the other they add up, and
every deploy, restart and ``make run`` waits for the sum. So ``pyrula-fleet start`` reads,
from its arguments alone and before it imports its CLI, the options that decide what the
fork server preloads (``--app`` and ``PYRULA_APP``, ``--workflow``, ``--store`` and
``PYRULA_STORE_URL``) and starts the fork server with them at once; the two imports then
run side by side.

The CLI then reads every option as usual. When what it read decides another preload (an
argument this quick read took for something else), the fork server started here is
replaced by one started from what the CLI read, before anything is forked from it: the
quick read can cost time, never correctness. A start that ends in a usage error leaves
nothing behind: the fork server exits with the process that started it.

Light on purpose (multiprocessing, and the store URL's backend by name): everything it
imports, the supervisor imports anyway.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

#: What every child imports before it serves, besides its store's backend, the archive
#: (where one is configured) and the app: imported once in the fork server, so a child
#: starts with it loaded (and shares it).
RUNTIME = ("pyrula.workflows.worker.child", "pyrula.workflows.worker.worker")
ARCHIVE = "pyrula.workflows.stores.archive"
#: The file in the scratch directory where the fork server reports the app's import.
REPORT = "app-check.json"
#: The options the quick read takes, by what they set.
VALUE_OPTIONS = {"--app": "apps", "--workflow": "workflows", "--store": "store"}
#: The default store when neither ``--store`` nor ``PYRULA_STORE_URL`` names one.
DEFAULT_STORE_URL = "sqlite:///pyrula.db"


class Early:
    """The fork server started before the CLI: what it preloads, and its scratch directory
    (where it writes its report on the app)."""

    def __init__(self, spec: dict[str, Any], scratch: str) -> None:
        self.spec = spec
        self.scratch = scratch


#: The fork server this process started early, if it did.
EARLY: Early | None = None


def fork_server_spec(apps: list[str], workflows: list[str], store_url: str,
                     cwd: str) -> dict[str, Any]:
    """What a fleet's fork server preloads and checks: the worker's runtime, the store's
    backend, the archive where one is configured and the app's modules; the app as the
    children load it."""
    from pyrula.config.defaults import archive_configured
    from pyrula.config.schemes import backend_module

    backend = backend_module(store_url)
    archive = [ARCHIVE] if archive_configured(os.environ) else []
    modules = [*apps, *(target.partition(":")[0] for target in workflows)]
    return {"preload": [*RUNTIME, *([backend] if backend else []), *archive, *modules],
            "check": {"apps": list(apps), "workflows": list(workflows), "cwd": cwd}}


def quick_read(argv: list[str], environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The apps, workflows and store URL of a ``start`` command line, as its options would
    read them; None for any other command, or for help."""
    if not argv or argv[0] != "start":
        return None
    found: dict[str, list[str]] = {"apps": [], "workflows": [], "store": []}
    rest = iter(argv[1:])
    for arg in rest:
        if arg in ("--help", "--"):
            return None
        name, equals, value = arg.partition("=")
        if name in VALUE_OPTIONS:
            if not equals:
                value = next(rest, "")
            found[VALUE_OPTIONS[name]].append(value)
    apps = found["apps"] or (environ.get("PYRULA_APP") or "").split()
    store = (found["store"][-1] if found["store"] else
             (environ.get("PYRULA_STORE_URL") or "").strip() or DEFAULT_STORE_URL)
    return {"apps": apps, "workflows": found["workflows"], "store_url": store}


def start_early(argv: list[str]) -> None:
    """Start the fork server for the ``start`` command in ``argv``, if it is one (any
    failure here only leaves the start to the CLI, as without this)."""
    global EARLY
    read = quick_read(argv, os.environ)
    if read is None:
        return
    try:
        from pyrula.supervisor import forkserver

        spec = fork_server_spec(read["apps"], read["workflows"], read["store_url"],
                                os.getcwd())
        scratch = tempfile.mkdtemp(prefix="pyrula-fleet-")
        atexit.register(shutil.rmtree, scratch, True)  # also after a usage error
        forkserver.configure(spec["preload"],
                             {**spec["check"], "report": os.path.join(scratch, REPORT)})
        forkserver.start(tracker_later=True, fork=True)
    except Exception:  # noqa: BLE001  (the CLI starts the fork server itself, and says why)
        return
    EARLY = Early(spec, scratch)
