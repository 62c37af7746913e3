"""Which shards a claim visits, in which order, asking each for how many runs: a pure
policy over what the doorbell shows, the shards this store's workers lease, where the
last claim stopped (the cursor) and which rings this store has seen; the claim runs it.

A claim visits the rung shards, own (leased) shards first. Within each group, first the
shards rung since this store last visited them, newest ring first: a shard rings when an
owner's queue appears on it, and deficit round robin serves that owner next there, so a
newcomer waits one claim, not a round over every shard. Ahead of them, the one shard this
store never visited whose ring is oldest: a shard rings when its queue starts, so each
claim of a fresh worker (a deploy, a scale-up, a fleet started on a backlog) also takes
from the queue that started first, and the runs queued first are not the last to run, at
the cost of one shard's visit to a newcomer. Then the others in turn from where this
store's last claim of the name stopped: every rung shard is visited within a round.
(A random pick leaves some shard unvisited for many claims, and with it a small owner whom
deficit round robin serves next.)

A first round visits a few shards, each with a share of the limit (at least CLAIM_SHARE
runs): one claim is one pipelined round trip, and each shard visited pays its script call
for a batch of runs rather than for one. A claim that comes back short visits, in a next
round, the shards that gave all they were asked, then the shards not visited yet (other
workers' first), as many as runs are still wanted.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from enum import IntEnum
from typing import NamedTuple

logger = logging.getLogger(__name__)

#: The fewest runs a claim asks of each shard it visits (when it wants that many).
CLAIM_SHARE = 8


class Group(IntEnum):
    """Whose a rung shard is: a worker of this store leases it, or another worker does.
    Claims visit own shards first; a round for a short claim, other workers' first."""

    OWN = 0
    OTHER = 1


OWN, OTHER = Group.OWN, Group.OTHER
#: The ring time of a shard a bell token named (not read from the doorbell).
NAMED = -1.0


class Candidate(NamedTuple):
    """A rung shard a claim may visit."""

    group: Group
    name: str
    shard: int
    rung: float  # the doorbell's score: when the shard was last rung (ms)


class Visit(NamedTuple):
    """One shard of a round and how many runs to ask of it."""

    candidate: Candidate
    share: int


#: Where each (name, group)'s next round starts: the shard after the last one visited.
Cursor = Mapping[tuple[str, Group], int]
#: (name, shard) -> the ring time of the shard when this store last visited it.
Seen = Mapping[tuple[str, int], float]


def visits(limit: int, candidates: int) -> int:
    """How many shards a first round of ``limit`` runs visits among ``candidates``."""
    return min(candidates, -(-limit // CLAIM_SHARE)) if limit > 0 else 0


def shares(limit: int, shards: int) -> list[int]:
    """``limit`` split over ``shards`` as evenly as whole runs allow (the first get more)."""
    if shards <= 0:
        return []
    out = [limit // shards] * shards
    for i in range(limit - sum(out)):
        out[i] += 1
    return out


def candidates(rings: Sequence[tuple[str, Sequence[tuple[str, float]]]],
               held: Mapping[str, Collection[int]]) -> list[Candidate]:
    """The rung shards of each (name, its doorbell's (shard, rung) pairs), grouped by
    whether a worker of this store leases them (``held``: name -> shards)."""
    out: list[Candidate] = []
    for name, rung in rings:
        own = held.get(name, ())
        for member, score in rung:
            shard = int(member)
            out.append(Candidate(OWN if shard in own else OTHER, name, shard, float(score)))
    return out


def order(found: Sequence[Candidate], *, cursor: Cursor, seen: Seen,
          shard_count: int) -> list[Candidate]:
    """``found`` in the order a claim visits them: by group; in each, the shard never
    visited with the oldest ring, then the shards rung since last seen (never visited
    included), newest first, then the others from the group's cursor on."""

    def key(c: Candidate) -> tuple[Group, int, float]:
        if c.rung > seen.get((c.name, c.shard), -1.0):
            return c.group, 0, -c.rung
        return c.group, 1, float((c.shard - cursor[(c.name, c.group)]) % shard_count)

    ordered = sorted(found, key=key)
    never = [c for c in ordered if (c.name, c.shard) not in seen]
    if never:  # the oldest ring of the shards never visited leads its group
        oldest = min(never, key=lambda c: (c.group, c.rung))
        ordered.remove(oldest)
        ordered.insert(next(i for i, c in enumerate(ordered + [oldest])
                            if c.group >= oldest.group), oldest)
    return ordered


def first_round(ordered: Sequence[Candidate], limit: int) -> list[Visit]:
    """The first shards of ``ordered`` a claim of ``limit`` runs visits, with shares."""
    chosen = ordered[:visits(limit, len(ordered))]
    return [Visit(c, n) for c, n in zip(chosen, shares(limit, len(chosen)), strict=True)]


def named_round(name: str, shard: int, held: Collection[int], limit: int) -> list[Visit]:
    """The shard a bell token named, alone, for all ``limit`` runs."""
    return [Visit(Candidate(OWN if shard in held else OTHER, name, shard, NAMED), limit)]


def next_round(ordered: Sequence[Candidate], visited: Collection[tuple[str, int]],
               fuller: Collection[tuple[str, int]], remaining: int) -> list[Visit]:
    """A round for the ``remaining`` runs of a claim that came back short: the shards
    that gave all they were asked (``fuller``), then the ones not ``visited`` yet, other
    workers' first; as many shards as runs are wanted. Empty: nowhere left to look."""
    again = [c for c in ordered if (c.name, c.shard) in fuller]
    rest = sorted((c for c in ordered if (c.name, c.shard) not in visited),
                  key=lambda c: -c.group)  # stable: other workers' shards first
    chosen = (again + rest)[:remaining]
    return [Visit(c, n) for c, n in zip(chosen, shares(remaining, len(chosen)), strict=True)]


def cursor_after(round_: Sequence[Visit], shard_count: int) -> dict[tuple[str, Group], int]:
    """The cursor moves of a round: each (name, group) starts after its last shard."""
    return {(v.candidate.name, v.candidate.group): (v.candidate.shard + 1) % shard_count
            for v in round_}
