"""The exactly-once check: lost, duplicated and unknown items counted against a model."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from pyrula.invariants import check_once, holdings

ITEMS = st.sampled_from([f"i{n}" for n in range(12)])


@given(acknowledged=st.sets(ITEMS), held=st.lists(st.tuples(ITEMS, st.integers(0, 3))))
def test_counts_match_a_model(acknowledged: set[str], held: list[tuple[str, int]]) -> None:
    counts = Counter(item for item, _ in held)

    verdict = check_once("events", acknowledged, holdings(held))

    assert verdict.lost == sum(1 for i in acknowledged if counts[i] == 0)
    assert verdict.duplicated == sum(1 for i in acknowledged if counts[i] > 1)
    assert verdict.unknown == len(set(counts) - acknowledged)
    assert verdict.ok == (all(counts[i] == 1 for i in acknowledged)
                          and set(counts) <= acknowledged)
    assert verdict.line().startswith(f"events={len(acknowledged)} lost=")


def test_problems_name_the_items() -> None:
    verdict = check_once("runs", ["a", "b", "c"], {"a": ["x"], "b": ["x", "y"], "z": ["x"]})

    assert verdict.line() == "runs=3 lost=1 duplicated=1 unknown=1"
    assert verdict.problems == ["duplicated: b is held 2 times: ['x', 'y']",
                                "lost: c is held by nothing",
                                "unknown: z was never acknowledged"]
