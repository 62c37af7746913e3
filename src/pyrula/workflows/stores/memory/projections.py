"""Projections in the memory store: each projection's head and states, written under the
store's lock (so a save's compare-and-set on the version is atomic), and the ended runs
to fold, in (finished_at, run_id) order."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pyrula.workflows.records import RunInfo
from pyrula.workflows.stores.capabilities import ProjectionHead
from pyrula.workflows.stores.memory.state import MemoryState, json_copy


class MemoryProjections:
    """The projections' heads and states (Projections)."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state
        self._heads: dict[str, ProjectionHead] = {}
        self._states: dict[str, dict[str, Any]] = {}

    async def ended_infos(
        self, names: Sequence[str], *, after: tuple[float, str] | None, until: float,
        limit: int,
    ) -> list[RunInfo]:
        wanted = set(names)
        with self._state.lock:
            ended = sorted(
                ((run.finished_at, run.run_id), run) for run in self._state.runs.values()
                if run.name in wanted and run.status.terminal and run.finished_at is not None
                and run.finished_at <= until
                and (after is None or (run.finished_at, run.run_id) > after)
            )
            return [run.info() for _, run in ended[:max(0, limit)]]

    async def projection_head(self, name: str) -> ProjectionHead | None:
        with self._state.lock:
            return self._heads.get(name)

    async def projection_heads(self) -> list[ProjectionHead]:
        with self._state.lock:
            return [self._heads[name] for name in sorted(self._heads)]

    async def projection_states(self, name: str, keys: Sequence[str] | None
                                ) -> dict[str, Any]:
        with self._state.lock:
            states = self._states.get(name, {})
            wanted = states if keys is None else [k for k in keys if k in states]
            return {key: json_copy(states[key]) for key in wanted}

    async def save_projection(
        self, head: ProjectionHead, states: Mapping[str, Any], *, expected: int,
        reset: bool,
    ) -> bool:
        with self._state.lock:
            current = self._heads.get(head.name)
            if (0 if current is None else current.version) != expected:
                return False
            kept = {} if reset else self._states.get(head.name, {})
            self._states[head.name] = {**kept, **{k: json_copy(v) for k, v in states.items()}}
            self._heads[head.name] = dataclasses.replace(head, version=expected + 1)
            return True

    async def reset_projection(self, name: str, *, now: float) -> bool:
        with self._state.lock:
            current = self._heads.get(name)
            if current is None:
                return False
            self._states[name] = {}
            self._heads[name] = ProjectionHead(name, current.version + 1, "", current.keyed,
                                               None, 0, now)
            return True
