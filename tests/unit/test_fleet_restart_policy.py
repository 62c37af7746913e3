"""The fleet's restart policy (``restart.RestartPolicy``), exit by exit: how long a slot
waits before its child is spawned again, and when a crash loop stops the fleet."""

from __future__ import annotations

import pytest

from pyrula.supervisor.restart import GiveUp, Respawn, RestartPolicy

#: (slot, was_ready, lived) of an exit, or ("ready", slot) for a child becoming ready.
Exit = tuple[int, bool, float]


def delays(policy: RestartPolicy, exits: list[Exit]) -> list[float | str]:
    """The respawn delay after each exit ("give up" once the policy stops the fleet)."""
    out: list[float | str] = []
    for slot, was_ready, lived in exits:
        decision = policy.exited(slot, was_ready, lived, None)
        out.append(decision.delay if isinstance(decision, Respawn) else "give up")
    return out


def young(slot: int = 0, lived: float = 1.0) -> Exit:
    """A child that became ready and died before it was stable (10 s)."""
    return (slot, True, lived)


def boot(slot: int = 0) -> Exit:
    """A child that exited before it became ready."""
    return (slot, False, 0.5)


@pytest.mark.parametrize(
    ("exits", "expected"),
    [
        # A ready child that dies young: at once the first time, then 0.1 s doubling.
        ([young()], [0.0]),
        ([young()] * 4, [0.0, 0.1, 0.2, 0.4]),
        # ... up to the 5 s cap, however often.
        ([young()] * 10, [0.0, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]),
        # A child that lived 10 s (stable_after) is replaced at once, and its slot's backoff
        # starts again; one second short of it counts as young.
        ([young()] * 3 + [young(lived=10.0), young()], [0.0, 0.1, 0.2, 0.0, 0.0]),
        ([young()] * 3 + [young(lived=9.9)], [0.0, 0.1, 0.2, 0.4]),
        # Each slot has its own backoff.
        ([young(0), young(0), young(1), young(0), young(1)], [0.0, 0.1, 0.0, 0.2, 0.1]),
        # Boot failures back off from the first (0.1 s doubling) and stop the fleet at the
        # third in a row (max_boot_failures), whichever slots they were in.
        ([boot()], [0.1]),
        ([boot(), boot()], [0.1, 0.2]),
        ([boot(0), boot(1), boot(2)], [0.1, 0.2, "give up"]),
        # A ready child's death does not interrupt nor add to a run of boot failures.
        ([boot(), young(1), boot(), boot()], [0.1, 0.0, 0.2, "give up"]),
    ],
)
def test_respawn_delays(exits: list[Exit], expected: list[float | str]) -> None:
    got = delays(RestartPolicy(max_boot_failures=3), exits)
    assert got == pytest.approx(expected)


def test_the_boot_failure_count_starts_again_once_a_child_is_ready() -> None:
    policy = RestartPolicy(max_boot_failures=3)
    assert delays(policy, [boot(), boot()]) == pytest.approx([0.1, 0.2])
    policy.ready(1)
    assert delays(policy, [boot(), boot(), boot()]) == pytest.approx([0.1, 0.2, "give up"])


def test_the_boot_backoff_is_capped() -> None:
    policy = RestartPolicy(max_boot_failures=100, cap=0.5)
    assert delays(policy, [boot()] * 5) == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])


def test_the_backoff_follows_the_policy() -> None:
    policy = RestartPolicy(max_boot_failures=3, stable_after=2.0, first=1.0, cap=3.0)
    exits = [young(lived=1.0)] * 4 + [young(lived=2.0), young(lived=1.0)]
    assert delays(policy, exits) == pytest.approx([0.0, 1.0, 2.0, 3.0, 0.0, 0.0])
    assert delays(policy, [boot(), boot()]) == pytest.approx([1.0, 2.0])


def test_a_single_boot_failure_may_stop_the_fleet() -> None:
    assert delays(RestartPolicy(max_boot_failures=1), [boot()]) == ["give up"]


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        ("ImportError: no module named 'app'",
         "3 children in a row exited before becoming ready; the last one said: "
         "ImportError: no module named 'app'"),
        (None, "3 children in a row exited before becoming ready"),
        ("", "3 children in a row exited before becoming ready"),
    ],
)
def test_giving_up_says_why_and_what_the_last_child_said(error: str | None,
                                                         reason: str) -> None:
    policy = RestartPolicy(max_boot_failures=3)
    policy.exited(0, False, 0.5, "an earlier error")
    policy.exited(0, False, 0.5, "an earlier error")
    assert policy.exited(0, False, 0.5, error) == GiveUp(reason)
