"""The namespace's meta hash: its data format, each workflow name with the shard count it
was recorded with, the project binding; and the checks a worker runs before it starts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from typing import Any

from pyrula.errors import ConfigurationError, StoreUnavailable
from pyrula.workflows.stores.valkey.codec import as_hash, parse_info
from pyrula.workflows.stores.valkey.connection import Connection, EvictionCheck
from pyrula.workflows.stores.valkey.resp import Durability, ReplyError

logger = logging.getLogger(__name__)

#: The layout of a namespace's keys (recorded in its meta hash by the first store to use
#: it). 2: run:submitted is held by the run record, not written to the journal.
DATA_FORMAT = 2


class Registry:
    """The names of a namespace and the checks of its recorded layout."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._known: set[str] = set()
        #: Names a worker serving them recorded as having per-key limits: every run of
        #: such a name is queued on its shard 0 (stores/valkey/limits.py).
        self.limited: set[str] = set()

    async def prepare(self, names: Sequence[str], limited: Collection[str] = ()) -> None:
        """What a worker checks before any loop starts: cluster mode, eviction policy,
        a replica behind every primary (``durability=replicated``), the recorded shard
        count of each name. The server's checks side by side, then every name in one round
        trip: a worker's start is on the way to its first run, and a refused worker has
        written nothing. ``limited``: the names with per-key limits, recorded as such.
        (The Lua is not loaded here: every call names it, and it is loaded only where the
        server lacks it.)"""
        await asyncio.gather(self._check_eviction(), self._check_replicas())
        await self.register_all(names, limited)

    async def register_all(self, names: Sequence[str], limited: Collection[str] = ()) -> None:
        """``register`` each of ``names`` (those in ``limited`` as having per-key
        limits), in one round trip."""
        fresh = [name for name in dict.fromkeys(names)
                 if name not in self._known or (name in limited and name not in self.limited)]
        if not fresh:
            return
        conn = self.connection
        replies = await conn.batch([(conn.keys.meta, ("register", name, conn.shard_count,
                                                      DATA_FORMAT, int(name in limited)))
                                    for name in fresh])
        for name, reply in zip(fresh, replies, strict=True):
            if isinstance(reply, BaseException):
                raise reply
            self._recorded(name, *reply)

    async def _check_eviction(self) -> None:
        conn = self.connection
        if conn.eviction_policy_check is EvictionCheck.OFF:
            return
        replies = await conn.router().each_primary(("INFO", "memory"))
        where, reply = replies[0]
        if isinstance(reply, ReplyError):
            if reply.code == "NOPERM":
                logger.warning("cannot read INFO memory to check the eviction policy")
                return
            raise StoreUnavailable(f"Valkey at {where}: {reply}")
        memory = parse_info(str(reply))
        policy = str(memory.get("maxmemory_policy", "noeviction"))
        maxmemory = int(memory.get("maxmemory", 0) or 0)
        if policy.startswith("allkeys-") and maxmemory > 0:
            message = (
                f"Valkey at {conn.where()} has maxmemory-policy {policy} with maxmemory "
                f"{maxmemory}: eviction deletes live journals. Use noeviction, or accept the "
                "risk with eviction_policy_check='warn' or 'off' (PYRULA_VALKEY_EVICTION_CHECK)"
            )
            if conn.eviction_policy_check is EvictionCheck.ERROR:
                raise ConfigurationError(message)
            logger.warning("%s", message, extra={"event": "valkey_eviction_policy"})
        elif policy.startswith("allkeys-") or policy.startswith("volatile-"):
            logger.warning(
                "Valkey at %s has maxmemory-policy %s: finished-run history and short-lived "
                "keys may be evicted", conn.where(), policy,
                extra={"event": "valkey_eviction_policy"},
            )

    async def _check_replicas(self) -> None:
        """Under ``durability=replicated`` each write waits for a replica: with none
        connected every write would wait its timeout and fail, so the worker refuses to
        start instead."""
        conn = self.connection
        if conn.durability is not Durability.REPLICATED:
            return
        alone = [where for where, count in await conn.replicas() if count < 1]
        if alone:
            raise ConfigurationError(
                f"durability='replicated' waits for a replica of every write, but Valkey at "
                f"{', '.join(alone)} has no replica connected; add a replica (replicaof) or "
                "use durability='async'"
            )

    async def register(self, name: str) -> None:
        """Record ``name`` with this store's shard count, or check the one recorded; the
        namespace's data format is recorded (or checked) in the same atomic call."""
        if name in self._known:
            return
        conn = self.connection
        self._recorded(name, *await conn.op(conn.keys.meta, "register", name,
                                            conn.shard_count, DATA_FORMAT))

    def _recorded(self, name: str, found: object, recorded: object,
                  limited: object = None) -> None:
        """Check what ``register`` found recorded for ``name``: the namespace's data format
        and the name's shard count; note whether the name has per-key limits."""
        conn = self.connection
        if int(str(found)) != DATA_FORMAT:
            raise self._wrong_format(int(str(found)))
        if int(str(recorded)) != conn.shard_count:
            raise ConfigurationError(
                f"workflow {name!r} was recorded with shard_count={recorded} in namespace "
                f"{conn.namespace!r}, this store has shard_count={conn.shard_count}; use the "
                "same shard_count on every worker (drain a name before changing its count)"
            )
        self._known.add(name)
        if limited:
            self.limited.add(name)

    def _wrong_format(self, found: int) -> ConfigurationError:
        return ConfigurationError(
            f"namespace {self.connection.namespace!r} in Valkey at {self.connection.where()} "
            f"holds runs in data format {found}; this build reads and writes format "
            f"{DATA_FORMAT}. Drain the namespace with the build that wrote it (or use another "
            "namespace) first"
        )

    async def names(self) -> list[str]:
        """Every workflow name registered in the namespace, sorted."""
        meta = self.connection.keys.meta
        fields = await self.connection.read(meta, "HKEYS", meta)
        return sorted(f[len("shards:"):] for f in fields if f.startswith("shards:"))

    async def bind(
        self, project: str | None, environment: str | None
    ) -> tuple[tuple[str | None, str | None], dict[str, str]]:
        """Record the project and environment (first binding wins), in one round trip;
        returns the recorded pair, and the meta hash as read after (whose flow-control
        settings a claim needs next)."""
        conn = self.connection
        meta = conn.keys.meta
        commands: list[tuple[str | None, tuple[Any, ...]]] = [
            (meta, ("HSETNX", meta, f"binding.{key}", value))
            for key, value in (("project", project), ("environment", environment))
            if value is not None
        ]
        replies = await conn.pipeline([*commands, (meta, ("HGETALL", meta))])
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        fields = as_hash(replies[-1])
        return (fields.get("binding.project"), fields.get("binding.environment")), fields
