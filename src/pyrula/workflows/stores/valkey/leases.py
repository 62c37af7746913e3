"""Shard leases (which worker scans which shards of a name) and worker membership (the
live workers and the names they serve: a name no live worker serves is stranded)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from pyrula.workflows.stores.valkey.codec import as_hash, dumps, raise_first
from pyrula.workflows.stores.valkey.connection import Connection
from pyrula.workflows.stores.valkey.registry import Registry

if TYPE_CHECKING:
    from pyrula.config.worker import WorkerOptions

logger = logging.getLogger(__name__)


class Leases:
    """The shards leased through this store object, and the namespace's live workers."""

    def __init__(self, connection: Connection, registry: Registry) -> None:
        self.connection = connection
        self.registry = registry
        #: Shard leases held through this store object: worker -> name -> shards.
        self.held: dict[str, dict[str, set[int]]] = {}

    def held_shards(self, name: str) -> set[int]:
        """The shards of ``name`` any worker of this store object leases."""
        held: set[int] = set()
        for names in self.held.values():
            held |= names.get(name, set())
        return held

    def shards_to_scan(self, name: str) -> list[int]:
        """The shards of ``name`` this store object looks after: its leased ones, or all."""
        held = self.held_shards(name)
        return sorted(held) if held else list(range(self.connection.shard_count))

    def shards_held(self, worker_id: str) -> dict[str, int]:
        return {name: len(s) for name, s in self.held.get(worker_id, {}).items()}

    async def shard_lease_tick(
        self, *, worker_id: str, names: Sequence[str], now: float, options: WorkerOptions
    ) -> None:
        conn = self.connection
        ttl = float(options.shard_lease_ttl)
        calls = [(conn.keys.leases(n), ("lease", worker_id, now, ttl, conn.shard_count))
                 for n in names]
        held = self.held.setdefault(worker_id, {})
        for name, result in zip(names, await conn.batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            held[name] = {int(s) for s in result}

    async def release_shards(self, worker_id: str) -> None:
        """Give back every shard ``worker_id`` leases, and drop it from the live workers.
        Also for a worker that leased through another store object (a fleet's supervisor
        releasing a dead child's shards): then every registered name is released."""
        names = list(self.held.get(worker_id, {})) or await self.registry.names()
        calls = [(self.connection.keys.leases(n), ("release", worker_id)) for n in names]
        await self.connection.batch(calls)
        self.held.pop(worker_id, None)

    # --- membership -----------------------------------------------------------------

    async def register_worker(
        self, worker_id: str, names: Sequence[str], *, now: float, ttl: float
    ) -> None:
        key = f"{self.connection.keys.ns}:workers"
        served = f"{self.connection.keys.ns}:served"
        entry = dumps({"names": list(names), "expires": now + ttl})
        raise_first(await self.connection.pipeline(
            [(key, ("HSET", key, worker_id, entry))]
            + ([(served, ("SADD", served, *names))] if names else [])))

    async def served_names(self) -> list[str]:
        served = f"{self.connection.keys.ns}:served"
        return sorted(str(n) for n in await self.connection.read(served, "SMEMBERS", served))

    async def unregister_worker(self, worker_id: str) -> None:
        key = f"{self.connection.keys.ns}:workers"
        await self.connection.call(key, "HDEL", key, worker_id)

    async def stranded(self, *, now: float) -> list[str]:
        conn = self.connection
        key = f"{conn.keys.ns}:workers"
        workers = as_hash(await conn.read(key, "HGETALL", key))
        served: set[str] = set()
        gone = []
        for worker_id, raw in workers.items():
            entry = orjson.loads(raw)
            if float(entry["expires"]) > now:
                served.update(entry["names"])
            else:
                gone.append(worker_id)
        if gone:
            await conn.call(key, "HDEL", key, *gone)
        found = []
        for name in await self.registry.names():
            ready = conn.keys.ready(name)
            if name not in served and await conn.read(ready, "ZCARD", ready):
                found.append(name)
        return found

    async def shard_map(self, *, now: float) -> dict[str, Any]:
        """The live workers of the namespace and each registered name's shard leases, as
        stored (every host's workers, not only those of this store object)."""
        conn = self.connection
        key = f"{conn.keys.ns}:workers"
        workers = []
        for worker_id, raw in sorted(as_hash(await conn.read(key, "HGETALL", key)).items()):
            entry = orjson.loads(raw)
            if float(entry["expires"]) > now:
                workers.append({"worker_id": worker_id, "names": list(entry["names"]),
                                "expires": float(entry["expires"])})
        names: dict[str, Any] = {}
        for name in sorted(await self.registry.names()):
            leases = conn.keys.leases(name) + ":leases"
            held: dict[str, list[int]] = {}
            for shard, value in as_hash(await conn.read(leases, "HGETALL", leases)).items():
                worker, _, expires = str(value).rpartition("|")
                if worker and float(expires or 0) > now:
                    held.setdefault(worker, []).append(int(shard))
            count = sum(len(s) for s in held.values())
            names[name] = {"shards": conn.shard_count,
                           "held": {w: sorted(s) for w, s in sorted(held.items())},
                           "unleased": max(0, conn.shard_count - count)}
        return {"workers": workers, "names": names}

    async def fail_stranded(
        self, name: str, *, older_than: float, now: float, limit: int, error: dict[str, Any]
    ) -> list[str]:
        conn = self.connection
        failed: list[str] = []
        for shard in range(conn.shard_count):
            if len(failed) >= limit:
                break
            ids = await conn.op(conn.keys.base_of(name, shard), "fail_stranded", older_than,
                                now, limit - len(failed), dumps(error), conn.completed_ttl)
            failed.extend(str(i) for i in ids)
        return failed
