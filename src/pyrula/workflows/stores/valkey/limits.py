"""Per-key concurrency limits and start rates in the Valkey store (KeyedLimits), with the
memory store's semantics (stores/memory/limits.py), in the scripts of one shard.

Every run of a workflow with limits lives on the name's shard 0 (``LIMITED_SHARD``): a run
submitted with keys, and a run submitted without them once the name is known to be
limited (a worker serving it records that at its start, ``Registry.prepare``). So a key's
waiting line, the runs holding its slots and its rate bucket share one slot, and each
decision (submit into the line, admit, claim, hand back) is one script: exact under any
crash, in a cluster too (lua/01_limits.lua). The limits themselves travel in the claim's
ARGV, as flow control's do: a claim of a name without limits runs the plain ``claim``.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyrula.workflows.limits import LimitKeys, WorkflowLimits
from pyrula.workflows.stores.valkey.connection import Connection
from pyrula.workflows.stores.valkey.keys import name_hash

#: The shard every run of a limited workflow is queued on.
LIMITED_SHARD = 0


def key_args(keys: LimitKeys | None) -> tuple[str, str]:
    """A run's keys as a script takes them ('' for none)."""
    if keys is None:
        return "", ""
    return keys.concurrency or "", keys.rate or ""


def keys_of(concurrency: str, rate: str) -> LimitKeys | None:
    """A run's keys as a claim script gives them back (None: it has none)."""
    if not concurrency and not rate:
        return None
    return LimitKeys(concurrency=concurrency or None, rate=rate or None)


class Limits:
    """The limits this process's workers registered (``use_limits``)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.limits: dict[str, WorkflowLimits] = {}
        self._by_hash: dict[str, WorkflowLimits] = {}

    def use_limits(self, limits: Mapping[str, WorkflowLimits]) -> None:
        """Enforce ``limits`` (workflow name -> its limits) from the next claim on."""
        self.limits.update(limits)
        self._by_hash.update((name_hash(n), lim) for n, lim in limits.items())

    def limited_run(self, run_id: str) -> bool:
        """Whether this process has limits for the workflow of ``run_id``."""
        return run_id[:12] in self._by_hash

    def args(self, name: str) -> tuple[str | int | float, ...] | None:
        """The max and rate a claim of ``name`` passes ('' for none); None: no limits."""
        return _args(self.limits.get(name))

    def args_of_run(self, run_id: str) -> tuple[str | int | float, ...]:
        """As ``args``, for the workflow of ``run_id`` (from the name hash it starts with);
        two empty strings when this process has no limits for it."""
        return _args(self._by_hash.get(run_id[:12])) or ("", "")

    async def assign_limit_keys(
        self, run_id: str, token: int, keys: LimitKeys, *, now: float
    ) -> bool:
        """Record the keys the worker computed for the run it claimed without them; True
        if its limits let it run, else it goes back to its key's line (``run:requeued``
        reason ``limit``, lock released) and False. One script, fenced."""
        conn = self.connection
        base = conn.keys.base_of_run(run_id)
        assert base is not None, run_id
        result = await conn.op(base, "assign_limit_keys", run_id, token, now, *key_args(keys),
                               *self.args_of_run(run_id), conn.completed_ttl)
        return bool(int(result))


def _args(limits: WorkflowLimits | None) -> tuple[str | int | float, ...] | None:
    if limits is None:
        return None
    return ("" if limits.max is None else limits.max,
            "" if limits.per_second is None else limits.per_second)
