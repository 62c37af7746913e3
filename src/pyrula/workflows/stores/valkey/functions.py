"""Script loading for deploys: load this build's script (``script.py``) before its workers
start; workers call it by EVALSHA and reload it on NOSCRIPT."""

from __future__ import annotations

import logging

from pyrula.workflows._sync import run_sync
from pyrula.workflows.stores.valkey.connection import Connection
from pyrula.workflows.stores.valkey.script import SCRIPT, SHA

logger = logging.getLogger(__name__)

__all__ = ["SCRIPT", "SHA", "upgrade_scripts"]


def upgrade_scripts(url: str, *, cluster: bool | None = None) -> str:
    """Load this build's script into the server (every primary of a cluster) before its
    workers start; returns the script's SHA-1. Old builds' scripts are not pruned."""
    connection = Connection(url=url, cluster=cluster, eviction_policy_check="off")

    async def load() -> str:
        await connection.load_script()
        await connection.aclose()
        return SHA

    return run_sync(load())
