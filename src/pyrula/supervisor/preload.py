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
server preloads this module instead, which imports the modules named in ``PRELOAD_ENV`` and
lets their errors go: each child imports the app again, fails the same way and reports it
as a boot failure, and the crash-loop rule stops the fleet with that error.

Imported only in the fork server (never by the supervisor, which must not import the app).
"""

from __future__ import annotations

import importlib
import os
import signal

from pyrula.wire import PRELOAD_ENV

for _signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU):
    signal.signal(_signum, signal.SIG_IGN)

for _name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
    try:
        importlib.import_module(_name)
    except BaseException:  # reported by each child, which imports it again
        pass
