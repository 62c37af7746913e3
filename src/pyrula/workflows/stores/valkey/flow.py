"""Flow control: per-owner caps on concurrent runs and on starts per second. A claim
reserves starts for each capped owner before it takes runs and settles the reservation
after; a run's slot is given back when its attempt parks, finishes or is requeued."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Collection, Mapping, Sequence

import orjson

from pyrula.workflows.records import ClaimedRun, FlowControl
from pyrula.workflows.stores.common import NO_OWNER, validate_flow_control
from pyrula.workflows.stores.valkey.codec import as_hash, dumps
from pyrula.workflows.stores.valkey.connection import Call, Connection

logger = logging.getLogger(__name__)


class Flow:
    """The flow-control settings and the flow-controlled runs claimed through this store."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._cache: tuple[float, dict[str, FlowControl]] = (-1e9, {})
        # Flow-controlled runs claimed through this object: run id -> owner.
        self._runs: dict[str, str] = {}

    async def _config(self) -> dict[str, FlowControl]:
        """Flow-control settings, cached for a second (local changes refresh at once)."""
        stamp, config = self._cache
        if time.monotonic() - stamp < 1.0:
            return config
        meta = self.connection.keys.meta
        return self.prime(as_hash(await self.connection.read(meta, "HGETALL", meta)))

    def prime(self, meta: dict[str, str]) -> dict[str, FlowControl]:
        """Take the flow-control settings from ``meta`` (the namespace's meta hash, read
        just now) as the cached ones: a worker reads that hash at start, so its first
        claim need not read it again."""
        config = {}
        for field, raw in meta.items():
            if field.startswith("flow:"):
                max_concurrent, rate = orjson.loads(raw)
                config[field[5:]] = FlowControl(field[5:], max_concurrent, rate)
        self._cache = (time.monotonic(), config)
        return config

    async def reserve(
        self, names: Sequence[str], limit: int, now: float, lock_ttl: float
    ) -> dict[str, tuple[int, str]]:
        """Reserve up to ``limit`` starts for each flow-controlled owner:
        owner -> (reserved, reservation prefix)."""
        config = await self._config()
        if not config:
            return {}
        keys = self.connection.keys
        owners = sorted(config)
        prefixes = {o: f"res:{os.urandom(6).hex()}" for o in owners}
        calls: list[Call] = [
            (keys.flow(o), ("flow_acquire", now, limit,
                            "" if config[o].max_concurrent is None
                            else config[o].max_concurrent,
                            "" if config[o].max_starts_per_second is None
                            else config[o].max_starts_per_second,
                            prefixes[o], now + lock_ttl))
            for o in owners
        ]
        reserved: dict[str, tuple[int, str]] = {}
        for owner, result in zip(owners, await self.connection.batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            reserved[owner] = (int(result), prefixes[owner])
        return reserved

    async def settle(
        self, reserved: dict[str, tuple[int, str]], claimed: Sequence[ClaimedRun],
        expiry: float,
    ) -> None:
        """Give back the starts of ``reserved`` the claim did not take; hold the slots of
        the runs it did until ``expiry`` (renewed with their locks)."""
        if not reserved:
            return
        config = await self._config()
        calls: list[Call] = []
        for owner, (count, prefix) in reserved.items():
            runs = [c.run_id for c in claimed if (c.owner or NO_OWNER) == owner]
            for run_id in runs:
                self._runs[run_id] = owner
            rate = config.get(owner)
            calls.append((self.connection.keys.flow(owner), (
                "flow_settle", prefix, count,
                "" if rate is None or rate.max_starts_per_second is None
                else rate.max_starts_per_second,
                expiry, *runs,
            )))
        await self.connection.batch(calls)

    async def done(self, run_id: str) -> None:
        """The attempt of ``run_id`` ended here: give back its owner's slot."""
        owner = self._runs.pop(run_id, None)
        if owner is not None:
            await self.connection.op(self.connection.keys.flow(owner), "flow_done", run_id)

    def renew_calls(self, held: Mapping[str, int], expiry: float) -> list[Call]:
        """The script calls that extend the slots of the flow-controlled runs in ``held``."""
        flows: dict[str, list[str]] = {}
        for run_id in held:
            owner = self._runs.get(run_id)
            if owner is not None:
                flows.setdefault(owner, []).append(run_id)
        return [(self.connection.keys.flow(o), ("flow_renew", expiry, *ids))
                for o, ids in flows.items()]

    def forget(self, run_ids: Collection[str]) -> None:
        """Runs whose locks were lost: their slots expire with them."""
        for run_id in run_ids:
            self._runs.pop(run_id, None)

    # --- administration -------------------------------------------------------------

    async def aflow_control_set(
        self,
        owner: str,
        max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None:
        validate_flow_control(owner, max_concurrent, max_starts_per_second)
        conn = self.connection
        meta, bucket = conn.keys.meta, f"{conn.keys.flow(owner)}:bucket"
        await conn.call(meta, "HSET", meta, f"flow:{owner}",
                        dumps([max_concurrent, max_starts_per_second]))
        await conn.call(bucket, "DEL", bucket)
        self._cache = (-1e9, {})

    async def aflow_control_get(self, owner: str) -> FlowControl | None:
        meta = self.connection.keys.meta
        raw = await self.connection.read(meta, "HGET", meta, f"flow:{owner}")
        if raw is None:
            return None
        max_concurrent, rate = orjson.loads(raw)
        return FlowControl(owner, max_concurrent, rate)

    async def aflow_control_delete(self, owner: str) -> bool:
        self._cache = (-1e9, {})
        meta = self.connection.keys.meta
        return bool(await self.connection.call(meta, "HDEL", meta, f"flow:{owner}"))
