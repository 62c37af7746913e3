"""The doorbell: which shards of a name may have queued runs (a sorted set per name, each
shard scored with when it was rung) and the bell idle workers block on (a list of tokens,
each naming the shard rung). Claims read it to choose shards; the sweep repairs it."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from typing import Any

from pyrula.workflows.stores.valkey.codec import as_scored, raise_first
from pyrula.workflows.stores.valkey.connection import Connection
from pyrula.workflows.stores.valkey.keys import name_hash
from pyrula.workflows.stores.valkey.leases import Leases

logger = logging.getLogger(__name__)

#: Seconds a claim may reuse the doorbell read of the claim before it.
RINGS_FRESH = 0.05

#: Shards found empty, by name, with their ring times: taken out of the doorbell later.
Empty = dict[str, list[tuple[int, float]]]


def _rung(shards: Sequence[int], now: float) -> list[Any]:
    """ZADD arguments: each shard scored with the time it was rung (ms)."""
    ms = int(now * 1000)
    out: list[Any] = []
    for shard in shards:
        out.extend((ms, shard))
    return out


class Doorbell:
    """The doorbell of a namespace, and what this store object last learnt from it."""

    def __init__(self, connection: Connection, leases: Leases) -> None:
        self.connection = connection
        self.leases = leases
        # Dry shards a claim found, to take out of the doorbell off the claim's path.
        self._deferred_unring: list[tuple[Empty, float]] = []
        #: The shard the last bell token named: (name, shard), claimed first next.
        self.hint: tuple[str, int] | None = None
        # names -> (when read, each name's doorbell) for claims in quick succession.
        self._rings_cache: dict[tuple[str, ...], tuple[float, list[list[tuple[str, float]]]]] = {}
        #: The names with per-key limits (the store's, kept current): their shards also
        #: hold runs waiting in their keys' lines, out of every owner's queue.
        self.limited: Collection[str] = ()

    def forget_rings(self) -> None:
        """The next claim reads the doorbell anew."""
        self._rings_cache.clear()

    async def ring(self, name: str, shards: Sequence[int], now: float, *,
                   missing_only: bool = False) -> None:
        """Mark shards that may have queued runs and wake an idle worker."""
        await self.ring_hash(name_hash(name), shards, now, missing_only=missing_only)

    async def ring_rung(self, rung: dict[str, list[int]], now: float) -> None:
        """Ring the shards of each name in ``rung``."""
        for name, shards in rung.items():
            await self.ring(name, shards, now)

    async def ring_run(self, run_id: str, now: float) -> None:
        """Ring the shard of ``run_id``: the run id carries its name's hash and its shard
        (no need to read the run)."""
        await self.ring_hash(run_id[:12], [int(run_id[12:16], 16)], now)

    async def ring_hash(self, name_h: str, shards: Sequence[int], now: float, *,
                        missing_only: bool = False) -> None:
        """Ring ``shards`` of the name whose hash is ``name_h``; ``missing_only`` adds the
        shards the doorbell lacks and leaves the others' ring times alone (claims visit
        the shards rung last first). Each token on the bell names its shard."""
        if not shards:
            return
        self._rings_cache.clear()  # rung here: what this store read before is stale
        keys = self.connection.keys
        ready, bell = keys.ready_of_hash(name_h), keys.bell
        raise_first(await self.connection.pipeline([
            (ready, ("ZADD", ready, "NX" if missing_only else "GT", *_rung(shards, now))),
            (bell, ("LPUSH", bell, *(f"{name_h}.{s}" for s in shards[:64]))),
            (bell, ("LTRIM", bell, 0, 63)),
        ]))

    async def wait_for_work(self, names: Sequence[str], timeout: float) -> bool:
        """Block until something rings the doorbell (or ``timeout``); True if it rang."""
        await self.flush_unring()
        bell = self.connection.keys.bell
        wait = max(timeout, 0.01)
        popped = (await self.connection.blocking(bell, [("BLPOP", bell, wait)], wait))[0]
        if isinstance(popped, BaseException):
            raise popped
        self._rings_cache.clear()  # rung or not: the next claim reads the doorbell anew
        if popped:
            # The token names the shard rung: the next claim goes there first, without
            # reading the doorbell (one round trip less between a submit and its start).
            name_h, _, shard = str(popped[1]).partition(".")
            for name in names:
                if name_hash(name) == name_h and shard.isdigit():
                    self.hint = (name, int(shard))
        return bool(popped)

    async def rings(self, names: Sequence[str]) -> list[list[tuple[str, float]]]:
        """The doorbell of each name: (shard, when rung). Claims that follow each other
        closely (a worker working off a backlog) share one read for RINGS_FRESH seconds."""
        key = tuple(names)
        stamp, cached = self._rings_cache.get(key, (-1.0, []))
        if time.monotonic() - stamp < RINGS_FRESH:
            return cached
        keys = self.connection.keys
        replies = await self.connection.pipeline(
            [(keys.ready(n), ("ZRANGE", keys.ready(n), 0, -1, "WITHSCORES")) for n in names],
            idempotent=True,
        )
        raise_first(replies)
        rings = [as_scored(reply) for reply in replies]
        self._rings_cache[key] = (time.monotonic(), rings)
        return rings

    def defer_unring(self, empty: Empty, now: float) -> None:
        """Take these dry shards out of the doorbell before the next wait or claim."""
        self._deferred_unring.append((empty, now))

    async def flush_unring(self) -> None:
        deferred, self._deferred_unring = self._deferred_unring, []
        for empty, now in deferred:
            await self._unring(empty, now)

    async def _unring(self, empty: Empty, now: float) -> None:
        """Take shards found empty out of the doorbell, then look again: a run enqueued
        meanwhile was either seen by the second look (and the shard is rung again) or
        enqueued after it, and its own ring comes after our removal."""
        keys = self.connection.keys
        for name, shards in empty.items():
            members = [str(s) for s, _ in shards]
            await self.connection.call(keys.ready(name), "ZREM", keys.ready(name), *members)
            looks = await self._queued(name, [s for s, _ in shards])
            busy = [s for (s, _), n in zip(shards, looks, strict=True) if n != 0]
            if busy:
                await self.ring(name, busy, now)

    async def _queued(self, name: str, shards: Sequence[int]) -> list[int]:
        """How many owners have queued runs on each of ``shards`` (-1: unknown, an error);
        of a limited name, plus how many of its keys' lines hold waiting runs."""
        parts = ("active", "lines") if name in self.limited else ("active",)
        keys = [f"{self.connection.keys.base_of(name, s)}:{part}"
                for s in shards for part in parts]
        replies = await self.connection.pipeline([(k, ("ZCARD", k)) for k in keys],
                                                 idempotent=True)
        counts = [-1 if isinstance(r, BaseException) else int(r) for r in replies]
        step = len(parts)
        return [-1 if -1 in counts[i:i + step] else sum(counts[i:i + step])
                for i in range(0, len(counts), step)]

    async def sweep(self, names: Sequence[str], now: float) -> None:
        """Safety net for the doorbell (a client that died between its submit and its
        ring): ring every shard we scan that has queued runs and is not rung."""
        self._rings_cache.clear()
        for name, rung in zip(names, await self.rings(names), strict=True):
            marked = {int(s) for s, _ in rung}
            shards = [s for s in self.leases.shards_to_scan(name) if s not in marked]
            looks = await self._queued(name, shards)
            busy = [s for s, n in zip(shards, looks, strict=True) if n > 0]
            await self.ring(name, busy, now, missing_only=True)
