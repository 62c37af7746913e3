"""The Valkey claim's shard choice, pure: which rung shards a claim visits, in which order,
asking each for how many runs; and where the next claim's round starts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from pyrula.workflows.stores.valkey.shard_choice import (
    NAMED,
    OTHER,
    OWN,
    Candidate,
    Group,
    Visit,
    candidates,
    cursor_after,
    first_round,
    named_round,
    next_round,
    order,
    shares,
    visits,
)

N = "wf"
#: Rings read from the doorbell: (shard, when rung in ms).
Rings = Sequence[tuple[int, float]]


def plan(rings: Rings, *, limit: int, shard_count: int = 8,
         held: Sequence[int] = (), cursor: Mapping[Group, int] | None = None,
         seen: Mapping[int, float] | None = None) -> list[tuple[int, int]]:
    """(shard, share) of a first round of one name's claim."""
    found = candidates([(N, [(str(s), at) for s, at in rings])], {N: set(held)})
    start = {(N, OWN): 0, (N, OTHER): 0}
    start.update({(N, group): at for group, at in (cursor or {}).items()})
    ordered = order(found, cursor=start, seen={(N, s): at for s, at in (seen or {}).items()},
                    shard_count=shard_count)
    return [(v.candidate.shard, v.share) for v in first_round(ordered, limit)]


#: Every shard rung at 100 ms and seen by this store at that ring (none rung since).
SEEN_ALL = {s: 100.0 for s in range(8)}


@pytest.mark.parametrize(
    ("rings", "options", "expected"),
    [
        pytest.param([(3, 100.0)], {"limit": 10}, [(3, 10)], id="one-shard-gets-the-whole-limit"),
        pytest.param([], {"limit": 10}, [], id="nothing-rung-nothing-visited"),
        pytest.param([(3, 100.0)], {"limit": 0}, [], id="limit-zero-visits-nothing"),
        pytest.param([(s, 100.0) for s in range(4)], {"limit": 3, "seen": SEEN_ALL},
                     [(0, 3)], id="limit-smaller-than-shards-one-shard-of-8-runs-at-most"),
        pytest.param([(s, 100.0) for s in range(8)], {"limit": 20, "seen": SEEN_ALL},
                     [(0, 7), (1, 7), (2, 6)], id="limit-split-over-a-shard-per-8-runs"),
        pytest.param([(s, 100.0) for s in range(8)], {"limit": 64, "seen": SEEN_ALL},
                     [(s, 8) for s in range(8)], id="never-more-shards-than-are-rung"),
        pytest.param([(1, 100.0), (5, 100.0), (6, 100.0)],
                     {"limit": 24, "held": [5, 6], "seen": SEEN_ALL},
                     [(5, 8), (6, 8), (1, 8)], id="own-shards-first"),
        pytest.param([(s, 100.0) for s in range(4)],
                     {"limit": 16, "cursor": {OTHER: 2}, "seen": SEEN_ALL},
                     [(2, 8), (3, 8)], id="cursor-rotation-starts-where-the-last-claim-stopped"),
        pytest.param([(s, 100.0) for s in (0, 6, 7)],
                     {"limit": 24, "cursor": {OTHER: 6}, "seen": SEEN_ALL},
                     [(6, 8), (7, 8), (0, 8)], id="cursor-rotation-wraps-past-the-last-shard"),
        pytest.param([(0, 100.0), (1, 300.0), (2, 200.0)], {"limit": 16, "seen": SEEN_ALL},
                     [(1, 8), (2, 8)], id="rung-since-last-visit-first-newest-ring-first"),
        pytest.param([(0, 100.0), (1, 300.0), (2, 100.0)],
                     {"limit": 16, "held": [2], "seen": SEEN_ALL},
                     [(2, 8), (1, 8)], id="own-shards-before-a-newer-ring-on-another-workers"),
        pytest.param([(0, 100.0), (1, 200.0)], {"limit": 8, "cursor": {OTHER: 0}},
                     [(0, 8)], id="shards-never-visited-oldest-ring-first-the-oldest-runs"),
        pytest.param([(0, 100.0), (1, 300.0), (2, 50.0), (3, 200.0), (4, 250.0)],
                     {"limit": 32, "seen": {0: 90.0, 1: 250.0}},
                     [(2, 8), (1, 8), (4, 8), (3, 8)],
                     id="the-oldest-never-visited-then-rung-since-seen-newest-first"),
    ],
)
def test_first_round(rings: Rings, options: dict[str, Any],
                     expected: list[tuple[int, int]]) -> None:
    assert plan(rings, **options) == expected


def c(shard: int, group: Group = OTHER, rung: float = 100.0) -> Candidate:
    return Candidate(group, N, shard, rung)


@pytest.mark.parametrize(
    ("ordered", "visited", "fuller", "remaining", "expected"),
    [
        pytest.param([c(0), c(1), c(2)], {(N, 0)}, set(), 16,
                     [(1, 8), (2, 8)], id="short-claim-visits-the-shards-not-visited-yet"),
        pytest.param([c(0), c(1), c(2)], {(N, 0)}, {(N, 0)}, 3,
                     [(0, 1), (1, 1), (2, 1)], id="shards-that-gave-all-they-were-asked-first"),
        pytest.param([c(0, OWN), c(1, OWN), c(2), c(3)], {(N, 0)}, set(), 3,
                     [(2, 1), (3, 1), (1, 1)], id="then-other-workers-shards-before-own"),
        pytest.param([c(0), c(1), c(2), c(3)], {(N, 0)}, set(), 2,
                     [(1, 1), (2, 1)], id="as-many-shards-as-runs-still-wanted"),
        pytest.param([c(0), c(1)], {(N, 0), (N, 1)}, set(), 5,
                     [], id="every-shard-visited-and-dry-nowhere-left"),
    ],
)
def test_next_round(ordered: list[Candidate], visited: set[tuple[str, int]],
                    fuller: set[tuple[str, int]], remaining: int,
                    expected: list[tuple[int, int]]) -> None:
    round_ = next_round(ordered, visited, fuller, remaining)
    assert [(v.candidate.shard, v.share) for v in round_] == expected


@pytest.mark.parametrize(
    ("held", "group"),
    [pytest.param({4}, OWN, id="a-leased-shard-is-own"),
     pytest.param(set(), OTHER, id="an-unleased-shard-is-another-workers")],
)
def test_a_named_shard_is_visited_alone_for_the_whole_limit(held: set[int],
                                                            group: Group) -> None:
    assert named_round(N, 4, held, 10) == [Visit(Candidate(group, N, 4, NAMED), 10)]


def test_the_cursor_moves_past_the_last_shard_of_each_group_and_wraps() -> None:
    round_ = [Visit(c(2, OWN), 8), Visit(c(7, OWN), 8), Visit(c(5), 8)]
    assert cursor_after(round_, 8) == {(N, OWN): 0, (N, OTHER): 6}


@pytest.mark.parametrize(
    ("limit", "shards", "expected"),
    [(10, 1, [10]), (10, 3, [4, 3, 3]), (2, 3, [1, 1, 0]), (5, 0, [])],
)
def test_shares_split_as_evenly_as_whole_runs_allow(limit: int, shards: int,
                                                    expected: list[int]) -> None:
    assert shares(limit, shards) == expected


@pytest.mark.parametrize(
    ("limit", "rung", "expected"),
    [(1, 5, 1), (8, 5, 1), (9, 5, 2), (100, 5, 5), (0, 5, 0), (10, 0, 0), (-9, 5, 0)],
)
def test_a_first_round_visits_one_shard_per_claim_share(limit: int, rung: int,
                                                        expected: int) -> None:
    assert visits(limit, rung) == expected


def test_the_shards_of_a_name_no_worker_here_leases_are_other_workers() -> None:
    found = candidates([(N, [("3", 100.0), ("4", 150)]), ("other", [("3", 200.0)])],
                       {N: {3}})
    assert found == [Candidate(OWN, N, 3, 100.0), Candidate(OTHER, N, 4, 150.0),
                     Candidate(OTHER, "other", 3, 200.0)]
