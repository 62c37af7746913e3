"""Per-key concurrency limits and start rates in the Valkey store (KeyedLimits), with the
memory store's semantics (stores/memory/limits.py), in the scripts of one shard.

The runs of a workflow with limits live on the name's shard 0, its home
(``LIMITED_SHARD``): a run submitted with keys, and a run submitted without them once the
name is known to be limited (a worker serving it records that at its start,
``Registry.prepare``; a process with the limits knows it too). So a key's waiting line,
the runs holding its slots and its rate bucket share one slot, and each decision (submit
into the line, admit, claim, hand back) is one script: exact under any crash, in a
cluster too (lua/zy_limits.lua). The limits travel in the scripts' ARGV, as flow
control's do: a claim of a name without limits runs the plain ``claim``, as before.

A run submitted without keys before its name was known to be limited lives on another
shard. Its slot is taken at the home before it runs (``assign_limit_keys``:
``away_enter``; a claim of that shard's lines: ``admit_away``), held until its lock's
expiry and renewed with it, and given back when its attempt stops (``done``): a crash
between the two scripts holds a slot one lock TTL at most, and never loses a run (it
waits in its own shard's line, atomically). Such runs wait FIFO within their shard's line.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pyrula.workflows.limits import LimitKeys, WorkflowLimits
from pyrula.workflows.stores.valkey.connection import Call, Connection
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
    """The limits this process's workers registered (``use_limits``), and the runs of
    other shards this process runs that hold slots at their name's home."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.limits: dict[str, WorkflowLimits] = {}
        self._by_hash: dict[str, WorkflowLimits] = {}
        #: Runs of a shard other than their home, running here: run id -> their keys.
        self._away: dict[str, tuple[str, str]] = {}
        #: The lock TTL of this process's last claim: how long a slot taken at the home
        #: for a run of another shard holds before its first renewal.
        self.lock_ttl = 30.0

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
        """As ``args``, for the workflow of ``run_id`` (from the name hash it starts with):
        two empty strings when this process has no limits for it, ``away`` when the run
        lives on a shard other than its home (there a run with keys never starts by
        itself)."""
        found = _args(self._by_hash.get(run_id[:12]))
        if found is None:
            return ("", "")
        return found if _shard(run_id) == LIMITED_SHARD else ("away", "")

    def _home(self, run_id: str) -> str:
        return self.connection.keys.base(run_id[:12], LIMITED_SHARD)

    async def assign_limit_keys(
        self, run_id: str, token: int, keys: LimitKeys, *, now: float
    ) -> bool:
        """Record the keys the worker computed for the run it claimed without them; True
        if its limits let it run, else it goes back to its key's line (``run:requeued``
        reason ``limit``, lock released) and False. At the home, one script, fenced; a
        run of another shard first takes its slot at the home (``away_enter``), then
        records its keys, going on or waiting in its own shard's line."""
        conn = self.connection
        base = conn.keys.base_of_run(run_id)
        assert base is not None, run_id
        limits = self.args_of_run(run_id)
        lc, lr = key_args(keys)
        if limits[0] == "away":
            found = _args(self._by_hash.get(run_id[:12])) or ("", "")
            granted = int(await conn.op(self._home(run_id), "away_enter", run_id,
                                        now + self.lock_ttl, now, lc, lr, *found))
            limits = ("granted" if granted else "away", "")
            if granted and lc:
                self._away[run_id] = (lc, lr)
        try:
            result = await conn.op(base, "assign_limit_keys", run_id, token, now, lc, lr,
                                   *limits, conn.completed_ttl)
        except BaseException:
            await self.done(run_id)  # its attempt is over: give its slot back
            raise
        return bool(int(result))

    async def admit_away(
        self, name: str, shard: int, *, worker_id: str, now: float, lock_ttl: float,
        build: str, want: int,
    ) -> list[Any]:
        """Claim up to ``want`` runs waiting in the lines of ``shard`` (not the home of
        ``name``): their slots taken at the home first, those the claim did not take
        given back. Returns the claim script's rows."""
        conn, limits = self.connection, self.args(name)
        if limits is None or want <= 0:
            return []
        base = conn.keys.base_of(name, shard)
        heads = await conn.op(base, "line_heads", now, 16, want)
        if not heads:
            return []
        plan: list[Any] = []
        keys: dict[str, tuple[str, str]] = {}
        for lc, lr, *ids in heads:
            plan += [lc, lr, len(ids), *ids]
            keys.update((str(i), (str(lc), str(lr))) for i in ids)
        home = conn.keys.base_of(name, LIMITED_SHARD)
        granted = [str(i) for i in await conn.op(home, "away_reserve", now, now + lock_ttl,
                                                 *limits, *plan)][:want]
        if not granted:
            return []
        rows = await conn.op(base, "claim_heads", worker_id, now, now + lock_ttl, build,
                             *granted)
        taken = {str(row[0]) for row in rows}
        for run_id in taken:
            if keys[run_id][0]:
                self._away[run_id] = keys[run_id]
        unused = [x for i in granted if i not in taken for x in (i, *keys[i])]
        if unused:
            await conn.op(home, "away_release", limits[1], 1, *unused)
        return list(rows)

    async def done(self, run_id: str) -> None:
        """The attempt of ``run_id`` stopped here: give back the slot it held at its home
        (a run of another shard; nothing for any other)."""
        keys = self._away.pop(run_id, None)
        if keys is not None:
            await self.connection.op(self._home(run_id), "away_release", "", 0, run_id,
                                     *keys)

    def renew_calls(self, held: Collection[str], expiry: float) -> list[Call]:
        """The script calls that extend the slots the runs of other shards in ``held``
        hold at their homes."""
        homes: dict[str, list[str]] = {}
        for run_id in held:
            keys = self._away.get(run_id)
            if keys is not None:
                homes.setdefault(self._home(run_id), []).extend((run_id, keys[0]))
        return [(home, ("away_renew", expiry, *pairs)) for home, pairs in homes.items()]

    def forget(self, run_ids: Collection[str]) -> None:
        """Runs whose locks were lost: their slots at the home expire with them."""
        for run_id in run_ids:
            self._away.pop(run_id, None)


def _shard(run_id: str) -> int:
    return int(run_id[12:16], 16)


def _args(limits: WorkflowLimits | None) -> tuple[str | int | float, ...] | None:
    if limits is None:
        return None
    return ("" if limits.max is None else limits.max,
            "" if limits.per_second is None else limits.per_second)
