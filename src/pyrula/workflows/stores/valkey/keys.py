"""Every key pattern of the Valkey store, in one place.

All keys start with ``<namespace>:`` (an ACL on ``~<namespace>:*`` fences the store).
A run's keys and its shard's queue keys share one hash tag, ``{<name hash>.<shard>}``,
so each operation on a run is one script on one slot, in a cluster too. The run id
starts with the name hash and the shard, so any client finds a run's keys from its id.

    <ns>:{<h>.<s>}:run:<id>       hash     the run record
    <ns>:{<h>.<s>}:jnl:<id>       list     the journal (event JSON; seq = index + 1)
    <ns>:{<h>.<s>}:q:<owner>      list     FIFO of queued runs of one owner, priority 0
    <ns>:{<h>.<s>}:pq:<owner>:<p> list     FIFO of its queued runs of priority p (1..9)
    <ns>:{<h>.<s>}:prio           hash     owner -> digits of its priorities 1..9 with queued
                                           runs, highest first (absent: priority 0 only)
    <ns>:{<h>.<s>}:active         zset     owners with queued runs -> runs served (DRR)
    <ns>:{<h>.<s>}:suspects       list     FIFO of queued suspects, apart from the owners'
    <ns>:{<h>.<s>}:timers         zset     parked run -> wake time
    <ns>:{<h>.<s>}:times          zset     running run -> lock expiry; ended run ->
                                           finished_at - ENDED_OFFSET (< 0): reclaims,
                                           index pruning, the archive's reads
    <ns>:{<h>.<s>}:index          zset     run -> created_at (listing)
    <ns>:{<h>.<s>}:idem:<key>     string   idempotency key -> run id
    <ns>:{<h>.<s>}:done:<id>      list     a token pushed when the run ends (result waiters)
    <ns>:{<h>.<s>}:chain:<start>  string   a continue_as_new chain's latest run (tail record)
    <ns>:{<h>.<s>}:line:<line>    list     FIFO of queued runs waiting for their key's
                                           limit ("c:<key>" or "r:<key>"; lua/zy_limits)
    <ns>:{<h>.<s>}:lines          zset     the lines holding runs -> when last visited
    <ns>:{<h>.0}:slots:<key>      set      runs that may hold a slot of a concurrency key
                                           (counted from their records)
    <ns>:{<h>.0}:away:<key>       zset     runs of other shards holding one -> lock expiry
    <ns>:{<h>.0}:bucket:<key>     hash     a rate key's token bucket
    <ns>:{<h>.ready}:ready        zset     shard -> last time it was rung (doorbell)
    <ns>:{<h>.ready}:wake         zset     shard -> its earliest timer, or earlier (summary)
    <ns>:{bell}                   list     a token per ring: wakes one idle worker at once
    <ns>:{<h>.leases}:leases      hash     shard -> "worker|expiry"
    <ns>:{<h>.leases}:workers     zset     live workers of the name -> heartbeat expiry
    <ns>:{flow.<o>}:running       zset     flow-controlled owner's running runs -> expiry
    <ns>:{flow.<o>}:bucket        hash     its start-rate token bucket
    <ns>:meta                     hash     shards:<name> -> shard_count; binding.*; flow:<owner>;
                                           served:<name> (a worker has served it);
                                           limited:<name> (it has per-key limits)
    <ns>:workers                  hash     live worker -> {names, expires} (membership)
    <ns>:{tp.<t>}:log            zset     a topic's events: seq -> element (emit order)
    <ns>:{tp.<t>}:seq            string   the topic's last seq
    <ns>:{tp.<t>}:key:<key>      string   an emit key -> its event id
    <ns>:{tp.<t>}:subs           hash     triggered workflow -> seq its copy reached
    <ns>:{<h>.<s>}:tp:<t>:wm     string   a triggered workflow's copy of the log reached this
    <ns>:{<h>.<s>}:tp:<t>:q:<o>  list     its events pending, of one owner (emit order)
    <ns>:{<h>.<s>}:tp:<t>:owners zset     owners with events pending -> oldest emit time
    <ns>:{pj.<p>}:head            hash     a projection's head: name, version, fp, keyed,
                                           cp_at, cp_id (checkpoint), folded, updated_at
    <ns>:{pj.<p>}:states          hash     a projection's states: key -> JSON state
    <ns>:projections              zset     every projection name (score 0: listed by name)
    <ns>:{schedules}:s:<id>       hash     a schedule: def (JSON), name, paused, next, last_run,
                                           last_run_at
    <ns>:{schedules}:ids          zset     every schedule id (score 0: listed by id)
    <ns>:{schedules}:due:<name>   zset     unpaused schedules of a workflow -> next_run_at

``<t>`` is the topic's hash; a workflow's events pending from a topic are kept on the
shard its batch runs are queued on (``trigger_shard``), so that taking a batch and
queueing its run is one script on one slot (see lua/trigger.lua).

``<p>`` is the projection name's hash: a projection's head and states share one slot, so
a fold's compare-and-set write is one script (lua/projection.lua).

Every schedule lives in the one slot of ``{schedules}``, so each schedule operation is one
script call, in a cluster too.

A workflow with per-key limits queues its runs on its shard 0 (its home), where a key's
slots and bucket live beside its line: see limits.py.
"""

from __future__ import annotations

import hashlib
import os
import re
import time

_RUN_ID = re.compile(r"^[0-9a-f]{40}$")

#: Ended runs are scored in a shard's ``times`` by their finish time minus this: below
#: every lock expiry (which are times), in finish order. The Lua lib's ENDED mirrors it.
ENDED_OFFSET = 10_000_000_000


def ended_time(finished_at: float) -> float:
    """A run's finish time as a shard's ``times`` gives it back (its score plus
    ENDED_OFFSET: the same double arithmetic, so the same value, within a microsecond of
    the record's). Projections order runs, and keep their checkpoints, by this."""
    return (finished_at - ENDED_OFFSET) + ENDED_OFFSET


def name_hash(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:12]


def owner_hash(owner: str) -> str:
    return hashlib.sha1(owner.encode()).hexdigest()[:12]


#: Run ids whose shard base a key space keeps (a worker's runs in flight, a client's
#: reads): past this many it forgets them all and starts over.
_BASES_KEPT = 4096


class KeySpace:
    def __init__(self, namespace: str) -> None:
        self.ns = namespace
        #: run id -> its shard base: found for every call on a run, several times a run.
        self._bases: dict[str, str] = {}

    def base(self, name_h: str, shard: int) -> str:
        return f"{self.ns}:{{{name_h}.{shard}}}"

    def base_of(self, name: str, shard: int) -> str:
        return self.base(name_hash(name), shard)

    def base_of_run(self, run_id: str) -> str | None:
        """The shard base of a run id, or None if it is not one of ours."""
        if not isinstance(run_id, str):
            return None
        base = self._bases.get(run_id)
        if base is None:
            if not _RUN_ID.match(run_id):
                return None
            if len(self._bases) >= _BASES_KEPT:
                self._bases.clear()
            base = self._bases[run_id] = self.base(run_id[:12], int(run_id[12:16], 16))
        return base

    def new_run_id(self, name: str, shard: int, now: float | None = None) -> str:
        ms = int((time.time() if now is None else now) * 1000) & ((1 << 48) - 1)
        return f"{name_hash(name)}{shard:04x}{ms:012x}{os.urandom(6).hex()}"

    def run(self, run_id: str) -> str:
        base = self.base_of_run(run_id)
        return f"{base}:run:{run_id}"

    def journal(self, run_id: str) -> str:
        base = self.base_of_run(run_id)
        return f"{base}:jnl:{run_id}"

    def done(self, run_id: str) -> str:
        base = self.base_of_run(run_id)
        return f"{base}:done:{run_id}"

    def ready(self, name: str) -> str:
        return self.ready_of_hash(name_hash(name))

    def ready_of_hash(self, name_h: str) -> str:
        return f"{self.ns}:{{{name_h}.ready}}:ready"

    def wake(self, name: str) -> str:
        """The timer summary of a name: which shards have a timer due by when."""
        return self.wake_of_hash(name_hash(name))

    def wake_of_hash(self, name_h: str) -> str:
        return f"{self.ns}:{{{name_h}.ready}}:wake"

    @property
    def bell(self) -> str:
        return f"{self.ns}:{{bell}}"

    def leases(self, name: str) -> str:
        return f"{self.ns}:{{{name_hash(name)}.leases}}"

    def flow(self, owner: str) -> str:
        return f"{self.ns}:{{flow.{owner_hash(owner)}}}"

    def topic(self, topic: str) -> str:
        """The base key of a topic's events (one slot per topic)."""
        return f"{self.ns}:{{tp.{name_hash(topic)}}}"

    def projection(self, name: str) -> str:
        """The base key of a projection's head and states (one slot per projection)."""
        return f"{self.ns}:{{pj.{name_hash(name)}}}"

    @property
    def projections(self) -> str:
        """The index of every projection name."""
        return f"{self.ns}:projections"

    @property
    def schedules(self) -> str:
        """The base key of every schedule (one slot)."""
        return f"{self.ns}:{{schedules}}"

    @property
    def meta(self) -> str:
        return f"{self.ns}:meta"
