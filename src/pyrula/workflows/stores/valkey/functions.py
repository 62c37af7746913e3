"""Script loading: one Lua script per build, loaded with SCRIPT LOAD, called by EVALSHA.

The operations live one per file in ``lua/`` (each opens with its KEYS/ARGV/returns
header); they are joined with a dispatch table into the one script of this build, so a
rolling deploy adds exactly one entry to the server's script cache.
"""

from __future__ import annotations

import hashlib
from importlib import resources


def _source() -> str:
    files = sorted(
        (f for f in resources.files("pyrula.workflows.stores.valkey").joinpath("lua").iterdir()
         if f.name.endswith(".lua")),
        key=lambda f: f.name,
    )
    return "\n".join(f.read_text() for f in files)


SCRIPT = _source()
SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()


def upgrade_scripts(url: str, *, cluster: bool | None = None) -> str:
    """Load this build's script into the server (every primary of a cluster) before its
    workers start; returns the script's SHA-1. Old builds' scripts are not pruned."""
    from pyrula.workflows._sync import run_sync
    from pyrula.workflows.stores.valkey.store import ValkeyStore

    store = ValkeyStore(url=url, cluster=cluster, eviction_policy_check="off")

    async def load() -> str:
        await store.load_script()
        await store.aclose()
        return SHA

    return run_sync(load())
