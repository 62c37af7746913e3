"""Loading for deploys: load this build's Lua (``script.py``: a function library, or a
script where the server refuses functions) before its workers start; workers load it
themselves where the server lacks it (``code.py``)."""

from __future__ import annotations

import logging

from pyrula.workflows._sync import run_sync
from pyrula.workflows.stores.valkey.connection import Connection
from pyrula.workflows.stores.valkey.script import SCRIPT, SHA

logger = logging.getLogger(__name__)

__all__ = ["SCRIPT", "SHA", "upgrade_scripts"]


def upgrade_scripts(url: str, *, cluster: bool | None = None) -> str:
    """Load this build's Lua into the server (every primary of a cluster) before its
    workers start; returns the code's SHA-1 (the library is ``pyrula_<SHA[:16]>``). Old
    builds' libraries are pruned past eight (``code.py``); old scripts are not."""
    connection = Connection(url=url, cluster=cluster, eviction_policy_check="off")

    async def load() -> str:
        await connection.load_script()
        await connection.aclose()
        return SHA

    return run_sync(load())
