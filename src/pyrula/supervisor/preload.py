"""What the fork server does before its first fork: shield itself from the fleet's signals,
and import the app, once, so children share it.

Signals: honcho, ``docker stop`` under an init, systemd and a terminal send their signal to
the whole process group, fork server included. The fork server belongs to the supervisor
(it exits once the supervisor and its children have closed its "alive" pipe), and the
children's exits reach the supervisor through it: killed by a SIGTERM meant for the fleet,
it would make every child look dead while they drain. So it ignores the signals the
supervisor acts on. Its children inherit that; each child sets the SIGTERM handler it needs.

Imports: multiprocessing's fork server imports its preload modules by name and survives
only an ``ImportError``; anything else an app raises at import (a bad setting, a
``RuntimeError`` of its own) would kill it, and every spawn after it would fail. So the fork
server preloads this module instead. It first loads the app exactly as a child will
(``pyrula.apps.load``: ``--app`` modules, ``--workflow`` targets) and writes what came of it
to the report file ``PRELOAD_CHECK_ENV`` names: the supervisor reads it before it forks the
first child, so an app that cannot load is refused once, with the app's own frames, instead
of by every child in a crash loop. Then it imports the modules named in ``PRELOAD_ENV`` (the
worker's runtime), letting their errors go, while the supervisor goes on with its start,
and runs the children's ``CHILD_PRELOADED`` hook: what each child would otherwise do for
itself after the fork (reading the workflow code's text for the build).
(After a reload the report is not read: a new fork server's children report a failure as
boot failures, and the crash-loop rule stops the fleet.)

Main: multiprocessing starts each forked child by running the parent's main script again
(as ``__mp_main__``) unless the fork server's ``__main__`` already has that file. For the
``pyrula-fleet`` console script that would import the CLI (click and the fleet's options)
in every child before it may claim: time on the path to its first run, for nothing a
worker uses. The fork server takes the script's path (``PRELOAD_MAIN_ENV``) as its own
``__main__.__file__``, so children skip it. Their target is a function of pyrula's, found
by its module's name, never in the script.

Garbage collection: off while this module imports (the app and the runtime: some 45,000
objects, and a cyclic collection every 700 of them, ~6 % of the fork server's way to its
first fork), then every object it made is frozen (``gc.freeze``) and collection is back
on. Children inherit both: their collections never walk the preloaded modules, and never
write to their pages (which stay shared with the fork server, copy-on-write).

Imported only in the fork server (never by the supervisor, which must not import the app).
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import signal
import sys
from typing import Any

from pyrula.supervisor.forkserver import PRELOAD_CHECK_ENV, PRELOAD_ENV, PRELOAD_MAIN_ENV
from pyrula.supervisor.trampoline import CHILD_PRELOADED

gc.disable()


def _one_line(kind: type[BaseException], exc: BaseException, tb: object) -> None:
    """The fork server dies of what it cannot do (a fork the host refuses: EAGAIN under
    RLIMIT_NPROC, ENOMEM): one line, not multiprocessing's traceback; the supervisor, whose
    next spawn fails, kills the children and says what happened."""
    sys.stderr.write(f"fork_server_exited: {kind.__name__}: {exc}\n")


sys.excepthook = _one_line

for _signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU):
    signal.signal(_signum, signal.SIG_IGN)

if os.environ.get(PRELOAD_MAIN_ENV):
    sys.modules["__main__"].__file__ = os.environ[PRELOAD_MAIN_ENV]

def _check(spec: dict[str, Any]) -> dict[str, object]:
    """Load the app as a child would; what came of it, for the report."""
    from pyrula.apps import AppError, importable_from, load

    importable_from(str(spec.get("cwd") or os.getcwd()))
    try:
        load(list(spec.get("apps") or []), list(spec.get("workflows") or []))
    except AppError as exc:
        return {"ok": False, "message": str(exc), "frames": exc.frames}
    except BaseException as exc:  # a child would fail the same way: report it as the app's
        return {"ok": False, "message": f"{type(exc).__name__}: {exc}", "frames": ""}
    return {"ok": True}


def _report(path: str, outcome: dict[str, object]) -> None:
    """Write ``outcome`` to ``path`` whole (through a rename: the supervisor polls it)."""
    try:
        with open(path + ".tmp", "w") as out:
            json.dump(outcome, out)
        os.replace(path + ".tmp", path)
    except OSError:  # the supervisor is gone, or this is a reload nobody waits for
        pass


# The app first, and its report: the supervisor waits for that alone, and goes on with its
# own start while the worker's runtime is imported below (a fork waits for it anyway).
if os.environ.get(PRELOAD_CHECK_ENV):
    _spec = json.loads(os.environ[PRELOAD_CHECK_ENV])
    _report(str(_spec["report"]), _check(_spec))

for _name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
    try:
        importlib.import_module(_name)
    except BaseException:  # reported by each child, which imports it again
        pass

# What every child would do for itself after the fork, done once here (named, as the
# children's entry is: this process is the children's side).
if os.environ.get(PRELOAD_ENV):
    try:
        _module, _, _hook = CHILD_PRELOADED.partition(":")
        getattr(importlib.import_module(_module), _hook)()
    except BaseException:  # each child does it for itself then, and reports what fails
        pass

gc.freeze()
gc.enable()
