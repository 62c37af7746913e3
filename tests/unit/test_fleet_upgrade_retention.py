"""Which retired children an upgrade lets go: the pure part of ``supervisor.upgrade``.

A retired child that holds nothing exits, but the last one stays while the old build has
open runs the new code cannot replay (or before an audit has counted them); past the
drain deadline every retired child goes. Children here are records over real pipes, with
the heartbeats the supervisor would have read; nothing is forked."""

from __future__ import annotations

from multiprocessing import Pipe
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyrula.supervisor.children import Child
from pyrula.supervisor.upgrade import AUDIT_INTERVAL_S, ZERO_AUDITS_NEEDED, Upgrade
from pyrula.wire import Heartbeat, WorkerState, decode

OLD, NEW = "build-old", "build-new"


class Proc:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.sentinel = -1


def child(pid: int, *, build: str, held: dict[str, int] | None = None,
          generation: int = 1) -> tuple[Child, Any]:
    ours, theirs = Pipe()
    c = Child(slot=pid % 10, process=Proc(pid), conn=ours, generation=generation,
              ready_seen=True)
    c.beat = Heartbeat(state=WorkerState.READY, worker_id=f"w{pid}", pid=pid,
                       held=held or {}, build=build)
    return c, theirs


def upgrade_with(*retired: Child, deadline: float | None = None) -> Upgrade:
    upgrade = Upgrade(1, 2, deadline, now=0.0)
    for c in retired:
        upgrade.retire(c, [])
    return upgrade


def drained_by(upgrade: Upgrade, now: float) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    upgrade.tick(now, lambda c, why: out.append((c.pid, why)))
    return out


@pytest.mark.parametrize("audits, drained", [
    ([], 1),  # not audited yet: one stays
    ([3], 1),  # open runs the new code cannot replay: one stays
    ([0], 1),  # one audit found none: a run between two statuses may have escaped it
    ([0, 0], 2),  # two in a row found none: both go
    ([0, 3], 1),
    ([0, 3, 0], 1),  # the count found again restarts the row
    ([3, 0, 0], 2),
])
def test_idle_retired_children_go_but_one_while_the_old_build_is_needed(
        audits: list[int], drained: int) -> None:
    a, _ = child(101, build=OLD)
    b, _ = child(102, build=OLD)
    upgrade = upgrade_with(a, b)
    for i, open_runs in enumerate(audits):
        upgrade.audited(OLD, open_runs, [], now=float(i))
    assert len(drained_by(upgrade, 10.0)) == drained


#: An audit's answer: how many open runs it counted, and whether it was certain (the
#: retired children run the new build's code: no later audit could find one).
audit_answers = st.tuples(st.integers(0, 3), st.booleans()).map(
    lambda a: (a[0], a[1] and a[0] == 0))


@given(st.lists(audit_answers, max_size=8))
def test_the_last_retired_child_goes_after_enough_zero_audits_in_a_row(
        audits: list[tuple[int, bool]]) -> None:
    # The model: the zero counts at the end of the sequence, a certain one enough alone.
    row = 0
    for count, certain in audits:
        row = 0 if count else (ZERO_AUDITS_NEEDED if certain else row + 1)
    a, _ = child(101, build=OLD)
    b, _ = child(102, build=OLD)
    upgrade = upgrade_with(a, b)
    for i, (count, certain) in enumerate(audits):
        upgrade.audited(OLD, count, [], now=float(i), certain=certain)
    assert len(drained_by(upgrade, 100.0)) == (2 if row >= ZERO_AUDITS_NEEDED else 1)


def test_the_child_kept_is_one_holding_runs_and_the_last_goes_once_none_is_open() -> None:
    idle, _ = child(101, build=OLD)
    busy, _ = child(102, build=OLD, held={"r1": 1})
    upgrade = upgrade_with(idle, busy)
    upgrade.audited(OLD, 2, ["r1", "r2"], now=0.0)
    assert [pid for pid, _ in drained_by(upgrade, 1.0)] == [101]  # the busy one stays
    busy.beat.held = {}  # type: ignore[union-attr]
    assert drained_by(upgrade, 2.0) == []  # kept: r2 may still wake
    upgrade.audited(OLD, 0, [], now=3.0)
    assert drained_by(upgrade, 3.0) == []  # one audit may have missed a run in transit
    upgrade.audited(OLD, 0, [], now=5.0)
    assert drained_by(upgrade, 5.0) == [(102, "no open run of its build needs it any more")]


def test_past_the_deadline_every_retired_child_goes_whatever_is_open() -> None:
    a, _ = child(101, build=OLD, held={"r1": 1})
    b, _ = child(102, build=OLD)
    upgrade = upgrade_with(a, b, deadline=10.0)
    upgrade.audited(OLD, 5, [], now=0.0)
    assert sorted(pid for pid, _ in drained_by(upgrade, 11.0)) == [101, 102]


def test_an_audit_is_asked_of_a_ready_new_child_when_due_and_answered_for_the_old_build(
) -> None:
    old, _ = child(101, build=OLD)
    new, new_end = child(201, build=NEW, generation=2)
    upgrade = upgrade_with(old)
    upgrade.audit(0.0, [new])
    assert decode(new_end.recv_bytes()) == {"type": "audit", "build": OLD}
    upgrade.audit(0.5, [new])  # answer pending: not asked again
    assert not new_end.poll()
    upgrade.audited("another-build", 4, [], now=1.0)  # not the old build's: ignored
    assert upgrade.open_runs is None
    upgrade.audited(OLD, 4, ["a"], now=1.0)
    assert (upgrade.open_runs, upgrade.open_ids) == (4, ["a"])
    upgrade.audit(1.0 + AUDIT_INTERVAL_S / 2, [new])
    assert not new_end.poll()  # not due yet
    upgrade.audit(1.0 + AUDIT_INTERVAL_S, [new])
    assert decode(new_end.recv_bytes())["type"] == "audit"


def test_an_upgrade_to_the_same_build_needs_no_old_child() -> None:
    old, _ = child(101, build=OLD)
    same, _ = child(201, build=OLD, generation=2)
    upgrade = upgrade_with(old)
    upgrade.audit(0.0, [same])
    assert upgrade.open_runs == 0
    assert [pid for pid, _ in drained_by(upgrade, 1.0)] == [101]


def test_status_says_how_many_open_runs_keep_the_old_generation() -> None:
    old, _ = child(101, build=OLD)
    upgrade = upgrade_with(old)
    upgrade.audited(OLD, 7, [], now=0.0)
    gens = upgrade.generations([], NEW, OLD, True)
    assert gens[0]["state"] == "retiring" and gens[0]["open_runs"] == 7
