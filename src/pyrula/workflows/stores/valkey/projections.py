"""Projections in the Valkey store: a projection's head and states in its own slot, a save
one script that checks the version and writes both (lua/projection.lua), and the ended runs
to fold read from the shards' ``times`` (as the archive's reconcile reads them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from pyrula.workflows.records import RunInfo
from pyrula.workflows.stores.capabilities import ProjectionHead
from pyrula.workflows.stores.valkey.codec import as_hash, raise_first, run_info
from pyrula.workflows.stores.valkey.connection import Connection
from pyrula.workflows.stores.valkey.reads import Reads


def _head(fields: Mapping[str, str]) -> ProjectionHead:
    checkpoint = (float(fields["cp_at"]), fields.get("cp_id", "")) if fields.get("cp_at") \
        else None
    return ProjectionHead(fields.get("name", ""), int(fields.get("version") or 0),
                          fields.get("fp", ""), fields.get("keyed") == "1", checkpoint,
                          int(fields.get("folded") or 0), float(fields.get("updated_at") or 0))


class ValkeyProjections:
    """The projections' heads and states (Projections)."""

    def __init__(self, connection: Connection, reads: Reads) -> None:
        self.connection = connection
        self.reads = reads

    async def ended_infos(
        self, names: Sequence[str], *, after: tuple[float, str] | None, until: float,
        limit: int,
    ) -> list[RunInfo]:
        if not names or limit <= 0:
            return []
        ended = await self.reads.ended_runs(after=after, until=until, limit=limit,
                                            names=names)
        conn = self.connection
        replies = await conn.pipeline([(conn.keys.run(run_id), ("HGETALL", conn.keys.run(run_id)))
                                       for _, run_id in ended], idempotent=True)
        raise_first(replies)
        infos = []
        for (at, run_id), reply in zip(ended, replies, strict=True):
            fields = as_hash(reply)
            if fields:  # gone (expired) since it was listed: the archive may have it
                # The end time as the index holds it (ended_time of the record's): the
                # checkpoint a projection keeps is compared with the index's.
                infos.append(dataclasses.replace(run_info(run_id, fields), finished_at=at))
        return infos

    async def projection_head(self, name: str) -> ProjectionHead | None:
        head = f"{self.connection.keys.projection(name)}:head"
        fields = as_hash(await self.connection.read(head, "HGETALL", head))
        return _head(fields) if fields else None

    async def projection_heads(self) -> list[ProjectionHead]:
        conn = self.connection
        index = conn.keys.projections
        names = await conn.read(index, "ZRANGE", index, 0, -1)
        heads = [f"{conn.keys.projection(_text(n))}:head" for n in names or []]
        replies = await conn.pipeline([(h, ("HGETALL", h)) for h in heads], idempotent=True)
        raise_first(replies)
        return sorted((_head(as_hash(r)) for r in replies if r), key=lambda h: h.name)

    async def projection_states(self, name: str, keys: Sequence[str] | None
                                ) -> dict[str, Any]:
        states = f"{self.connection.keys.projection(name)}:states"
        if keys is None:
            command: tuple[Any, ...] = ("HGETALL", states)
        elif not keys:
            return {}
        else:
            command = ("HMGET", states, *keys)
        reply = await self.connection.read(states, *command)
        if keys is None:
            return {k: orjson.loads(v) for k, v in as_hash(reply).items()}
        return {k: orjson.loads(v) for k, v in zip(keys, reply, strict=True) if v is not None}

    async def save_projection(
        self, head: ProjectionHead, states: Mapping[str, Any], *, expected: int,
        reset: bool,
    ) -> bool:
        conn = self.connection
        if expected == 0:  # listed before its first write lands (ZADD is idempotent)
            index = conn.keys.projections
            raise_first(await conn.pipeline([(index, ("ZADD", index, 0, head.name))]))
        cp_at, cp_id = ("", "") if head.checkpoint is None else (repr(head.checkpoint[0]),
                                                                 head.checkpoint[1])
        pairs = [part for key, state in states.items() for part in (key, orjson.dumps(state))]
        version = await conn.op(
            conn.keys.projection(head.name), "projection_save", expected, int(reset),
            head.name, head.fingerprint, int(head.keyed), cp_at, cp_id, head.folded,
            repr(float(head.updated_at)), *pairs,
        )
        return int(version) > 0

    async def reset_projection(self, name: str, *, now: float) -> bool:
        found = await self.connection.op(self.connection.keys.projection(name),
                                         "projection_reset", repr(float(now)))
        return bool(int(found))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
