"""How a store calls this build's Lua on the server: FCALL of its function library, or
EVALSHA of the same code as a script where the server refuses functions.

Nothing is loaded up front: the first call names the library, and a server without it
answers "Function not found" (NOSCRIPT for a script); the store then loads it (every
primary of a cluster) and sends again only the calls so refused, which did not run. The
library is kept by the server across restarts and failovers (it is part of the data, and
replicated); a script cache is not.

A server before 7.0, or a user the ACL does not grant ``fcall`` and ``function|load``
(the recipe for a user fenced to its namespace: loading a function is server-wide, so a
user who may do it can change the code other namespaces' stores run), refuses the first
FCALL or FUNCTION LOAD; the store then calls the script by EVALSHA, for the rest of the
process's life. The refused call did not run.

Libraries are server-wide, one per build. So that deploys do not pile them up, the first
load of each process deletes the other builds' libraries once there are more than
``KEEP``: a process of such a build still running loads its own again at its next call
(one more round trip), and a reload never prunes, so two builds never take turns.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pyrula.errors import StoreUnavailable
from pyrula.workflows.stores.valkey.resp import ReplyError
from pyrula.workflows.stores.valkey.router import Router
from pyrula.workflows.stores.valkey.script import (
    FUNCTION,
    LIBRARY,
    LIBRARY_PREFIX,
    SCRIPT,
    SHA,
)

logger = logging.getLogger(__name__)

#: How many pyrula libraries a server may hold before a process's first load prunes them.
KEEP = 8

Command = tuple[Any, ...]


class Code:
    """This process's way of calling the build's Lua (shared by its event loops)."""

    def __init__(self) -> None:
        #: False once a server refused the FUNCTION commands: EVALSHA from then on.
        self.functions = True
        self._pruned = False

    def refused(self, result: Any) -> bool:
        """Was the call refused because the server does not hold the code, or because
        this user may not call functions (then: scripts from now on)? It did not run."""
        if not isinstance(result, ReplyError):
            return False
        if result.code == "NOPERM" and "'fcall'" in str(result).lower():
            self.functions = False
            return True
        return missing(result)

    def command(self, names: Sequence[str], args: Sequence[Any]) -> Command:
        if self.functions:
            return ("FCALL", FUNCTION, len(names), *names, *args)
        return ("EVALSHA", SHA, len(names), *names, *args)

    async def load(self, router: Router) -> None:
        """Load the library on every primary (the script where functions are refused)."""
        if self.functions:
            replies = await router.each_primary(("FUNCTION", "LOAD", "REPLACE", LIBRARY))
            refused = [(where, r) for where, r in replies if isinstance(r, ReplyError)]
            if not refused:
                if not self._pruned:
                    self._pruned = True
                    await self._prune(router)
                return
            if not all(_no_functions(reply) for _, reply in refused):
                where, reply = refused[0]
                raise StoreUnavailable(f"Valkey at {where} refused FUNCTION LOAD: {reply}")
            logger.info("Valkey refused functions (%s); calling scripts by EVALSHA",
                        refused[0][1])
            self.functions = False
        for where, reply in await router.each_primary(("SCRIPT", "LOAD", SCRIPT)):
            if isinstance(reply, ReplyError):
                raise StoreUnavailable(f"Valkey at {where} refused SCRIPT LOAD: {reply}")

    async def _prune(self, router: Router) -> None:
        """Delete the other builds' libraries where more than KEEP are loaded. Best
        effort: a failure costs nothing but the space."""
        try:
            listed = await router.each_primary(
                ("FUNCTION", "LIST", "LIBRARYNAME", LIBRARY_PREFIX + "*"))
            held = [library_names(r) for _, r in listed if not isinstance(r, ReplyError)]
            if all(len(names) <= KEEP for names in held):
                return
            for name in sorted({n for names in held for n in names} - {FUNCTION}):
                await router.each_primary(("FUNCTION", "DELETE", name))
        except Exception:  # pruning is housekeeping: the libraries only take space
            logger.debug("pruning old pyrula libraries failed", exc_info=True)


def library_names(reply: Any) -> list[str]:
    """The pyrula libraries in a FUNCTION LIST reply (each a flat list of name/value, or
    a map under RESP3)."""
    names = []
    for entry in reply or []:
        fields = entry if isinstance(entry, dict) else dict(
            zip(entry[::2], entry[1::2], strict=False))
        name = fields.get("library_name")
        if isinstance(name, str) and name.startswith(LIBRARY_PREFIX):
            names.append(name)
    return names


def missing(result: Any) -> bool:
    """Was the call refused because the server does not hold the code (it did not run)?"""
    if not isinstance(result, ReplyError):
        return False
    return result.code == "NOSCRIPT" or (
        result.code == "ERR" and "function not found" in str(result).lower())


def _no_functions(reply: ReplyError) -> bool:
    """A refusal of the FUNCTION commands themselves (an old server, an ACL)."""
    text = str(reply).lower()
    return reply.code == "NOPERM" or "unknown command" in text
