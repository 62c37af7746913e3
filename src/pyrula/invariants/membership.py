"""Exactly-once membership: each acknowledged item is held exactly once, and nothing else.

What the chaos suite checks of deliveries that are not runs of their own: every event an
``emit`` acknowledged is in exactly one triggered run; every completed run is folded into
a projection exactly once; every terminal event a worker wrote reaches the collector
exactly once. :func:`check_once` takes the acknowledged items and, per item, what holds
it (one entry per time it is held), and counts:

- ``lost``: an acknowledged item nothing holds;
- ``duplicated``: an item held more than once;
- ``unknown``: an item held that was never acknowledged.

``ok`` only when all three are 0; ``line()`` is the one-line verdict a test prints.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: How many details of each kind of violation a verdict keeps.
DETAILS = 20


@dataclass(slots=True)
class Membership:
    """The verdict of :func:`check_once` over ``items`` acknowledged ``what``."""

    what: str
    items: int = 0
    lost: int = 0
    duplicated: int = 0
    unknown: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.unknown)

    def line(self) -> str:
        return (f"{self.what}={self.items} lost={self.lost} duplicated={self.duplicated} "
                f"unknown={self.unknown}")

    def _problem(self, kind: str, text: str) -> None:
        if sum(p.startswith(kind + ":") for p in self.problems) < DETAILS:
            self.problems.append(f"{kind}: {text}")


def check_once(what: str, acknowledged: Iterable[str],
               held: Mapping[str, Sequence[Any]]) -> Membership:
    """Check that each of ``acknowledged`` is held exactly once in ``held`` (item -> its
    holders, one entry per holding), and that ``held`` holds nothing else."""
    wanted = set(acknowledged)
    verdict = Membership(what, items=len(wanted))
    for item in sorted(wanted):
        holders = held.get(item) or ()
        if not holders:
            verdict.lost += 1
            verdict._problem("lost", f"{item} is held by nothing")
        elif len(holders) > 1:
            verdict.duplicated += 1
            verdict._problem("duplicated", f"{item} is held {len(holders)} times: "
                                           f"{list(holders)[:5]}")
    for item in sorted(set(held) - wanted):
        if held[item]:
            verdict.unknown += 1
            verdict._problem("unknown", f"{item} was never acknowledged")
    return verdict


def holdings(pairs: Iterable[tuple[str, Any]]) -> dict[str, list[Any]]:
    """``(item, holder)`` pairs as item -> its holders, one entry per pair."""
    held: dict[str, list[Any]] = {}
    for item, holder in pairs:
        held.setdefault(item, []).append(holder)
    return held
