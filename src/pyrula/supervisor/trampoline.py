"""The target every fleet child starts with: import the child entry point by name.

The supervisor hands the fork server this function (pickled by reference), so the
supervisor itself never imports the worker or the engine.
"""

from __future__ import annotations

import importlib
from multiprocessing.connection import Connection
from typing import Any

CHILD_ENTRY = "pyrula.workflows.worker.child:main"
#: What the fork server calls once it has loaded the app and the runtime, before any fork.
CHILD_PRELOADED = "pyrula.workflows.worker.child:preloaded"


def run(entry: str, config: dict[str, Any], conn: Connection, *more: Any) -> None:
    """``more``: the child's shared report board (``pyrula.shared_report``)."""
    module_name, _, attr = entry.partition(":")
    getattr(importlib.import_module(module_name), attr)(config, conn, *more)
