"""The supervisor's pure parts: the watch verdict for a live child and the /status body."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pyrula.config.fleet import FleetOptions
from pyrula.supervisor.children import Child, ChildState
from pyrula.supervisor.status import FleetStatus, SlotView, fleet_status
from pyrula.supervisor.watch import Kill, Recycle, verdict
from pyrula.wire import Heartbeat

OPTIONS = FleetOptions(apps=("app",), child_timeout=30.0, stall_timeout=60.0,
                       max_memory_per_child=1000)
NOW = 1000.0


def child(state: str | None = "ready", *, slot: int = 0, last_beat: float = NOW - 1,
          ready_seen: bool = True, **fields: Any) -> Child:
    beat_fields = {k: fields.pop(k) for k in ("free", "claim_tick_age", "runs_done",
                                              "store_ok", "shards") if k in fields}
    made = Child(slot=slot, process=SimpleNamespace(pid=100 + slot), conn=None,
                 last_beat=last_beat, ready_seen=ready_seen, **fields)
    if state is not None:
        made.beat = Heartbeat(state=state, worker_id=f"w{slot}", pid=100 + slot, **beat_fields)
    return made


@pytest.mark.parametrize(
    ("made", "serving", "expected"),
    [
        (child(), True, None),
        (child(last_beat=NOW - 31), True, Kill(31.0)),
        (child(last_beat=NOW - 31, retiring=True), True, None),
        (child(last_beat=NOW - 31, killed_for="rss"), True, None),
        (child("starting", ready_seen=False, last_beat=NOW - 31), False, Kill(31.0)),
        (child(free=1, claim_tick_age=61.0), True, Recycle("stalled", stalled_for=61.0)),
        (child(free=0, claim_tick_age=61.0), True, None),  # busy, not stalled
        (child(free=1, claim_tick_age=61.0), False, None),  # a replacement starting
        (child(free=1, claim_tick_age=61.0, ready_seen=False), True, None),
        (child(runs_done=10, run_limit=10), True, Recycle("10 runs done")),
        (child(rss_bytes=1001), True, Recycle("RSS 1001 bytes")),
        (child(rss_bytes=1000), True, None),
        (child(None, ready_seen=False), True, None),
    ],
)
def test_watch_verdict(made: Child, serving: bool, expected: Kill | Recycle | None) -> None:
    assert verdict(made, serving, OPTIONS, NOW) == expected


@pytest.mark.parametrize(
    ("made", "state"),
    [
        (child(None, ready_seen=False), ChildState.STARTING),
        (child("starting", ready_seen=False), ChildState.STARTING),
        (child("ready"), ChildState.READY),
        (child("ready", retiring=True), ChildState.DRAINING),
        (child("draining"), ChildState.DRAINING),
        (child("stopped"), ChildState.DRAINING),
    ],
)
def test_child_state(made: Child, state: ChildState) -> None:
    assert made.state is state


def test_fleet_status_ok_once_the_desired_children_are_ready_and_reach_their_store() -> None:
    slots = [SlotView(1, child(slot=1, shards={"a": 2}), 0),
             SlotView(0, child(slot=0, shards={"a": 1, "b": 4}, workflows=["b", "a"]), 0)]
    body = fleet_status(slots, desired=2, draining=False)
    assert body["status"] == "ok" and body["status"] is FleetStatus.OK
    assert [c["slot"] for c in body["children"]] == [0, 1]
    assert body["shards"] == {"a": 3, "b": 4} and body["restarts"] == 0
    assert body["children"][0] == {
        "slot": 0, "pid": 100, "worker_id": "w0", "state": "ready", "shards": {"a": 1, "b": 4},
        "workflows": ["a", "b"], "in_flight": 0, "runs_done": 0, "restarts": 0, "rss_bytes": 0,
    }


@pytest.mark.parametrize(
    ("slots", "draining", "status"),
    [
        ([SlotView(0, child(None, ready_seen=False), 0)], False, FleetStatus.STARTING),
        ([SlotView(0, child(None, ready_seen=False), 1)], False, FleetStatus.DEGRADED),
        ([SlotView(0, child(store_ok=False), 0)], False, FleetStatus.DEGRADED),
        ([SlotView(0, None, 0)], False, FleetStatus.STARTING),
        ([SlotView(0, child(), 0)], True, FleetStatus.DRAINING),
    ],
)
def test_fleet_status(slots: list[SlotView], draining: bool, status: FleetStatus) -> None:
    assert fleet_status(slots, desired=1, draining=draining)["status"] is status


@pytest.mark.parametrize(
    ("slots", "status", "unleased"),
    [
        # An upgrade on Valkey: the new child is ready, the old one (draining) still
        # holds every shard: not ok until the new one has leased them.
        ([SlotView(0, child(slot=0, shards={"a": 0}), 0),
          SlotView(1, child("draining", slot=1, shards={"a": 64}), 0)],
         FleetStatus.STARTING, ["a"]),
        ([SlotView(0, child(slot=0, shards={"a": 64}), 0)], FleetStatus.OK, None),
        # One name leased, another not yet.
        ([SlotView(0, child(slot=0, shards={"a": 64, "b": 0}), 0)], FleetStatus.STARTING,
         ["b"]),
        # More children than shards: one holding none is fine while the others hold them.
        ([SlotView(0, child(slot=0, shards={"a": 0}), 0),
          SlotView(1, child(slot=1, shards={"a": 1}), 0)], FleetStatus.OK, None),
        # Not sharded (SQLite): no shards reported, nothing to lease.
        ([SlotView(0, child(slot=0), 0)], FleetStatus.OK, None),
    ],
    ids=["upgrade", "leased", "one-name-unleased", "more-children-than-shards", "sqlite"],
)
def test_a_fleet_holding_no_shard_of_a_name_it_serves_is_not_ok(
    slots: list[SlotView], status: FleetStatus, unleased: list[str] | None
) -> None:
    body = fleet_status(slots, desired=sum(s.child is not None and s.child.state == "ready"
                                           for s in slots),
                        draining=False)
    assert body["status"] is status
    assert body.get("unleased") == unleased
