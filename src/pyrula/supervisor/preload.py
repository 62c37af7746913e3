"""What the fork server imports before its first fork: the app, once, so children share it.

multiprocessing's fork server imports its preload modules by name and survives only an
``ImportError``; anything else an app raises at import (a bad setting, a ``RuntimeError``
of its own) would kill the fork server, and every spawn after it would fail. So the fork
server preloads this module instead, which imports the modules named in ``PRELOAD_ENV``
and lets their errors go: each child imports the app again, fails the same way and reports
it as a boot failure, and the crash-loop rule stops the fleet with that error.

Imported only in the fork server (never by the supervisor, which must not import the app).
"""

from __future__ import annotations

import importlib
import os

from pyrula.wire import PRELOAD_ENV

for _name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
    try:
        importlib.import_module(_name)
    except BaseException:  # reported by each child, which imports it again
        pass
