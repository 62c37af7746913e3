"""A fleet's children share its stderr: each line a child logs says which child wrote it,
``[slot N pid P]`` in text and ``slot``/``pid`` fields in JSON, so that the lines of a
drain (each child's shutdown sequence) can be told apart."""

from __future__ import annotations

import json
import re
import signal

from tests.fleet.fleetprocs import QUICK, Fleets, pids


def test_each_childs_drain_lines_name_its_slot_and_pid_in_text(fleets: Fleets) -> None:
    fleet = fleets.start("-n", "2", *QUICK)
    children = pids(fleet.wait_ready(2))
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0
    for slot, pid in children.items():
        tagged = [line for line in fleet.log().splitlines()
                  if f"[slot {slot} pid {pid}] " in line and "shutdown: 2/5" in line]
        assert len(tagged) == 1, fleet.log()[-4000:]
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO +"
                        r"\[slot \d+ pid \d+\] pyrula\.", tagged[0])
    # The supervisor's own lines are not a child's: no tag.
    drain = [line for line in fleet.log().splitlines() if "pyrula.fleet:" in line]
    assert drain and not any("[slot " in line for line in drain)


def test_each_childs_json_lines_carry_slot_and_pid(fleets: Fleets) -> None:
    fleet = fleets.start("-n", "2", "--log-format", "json", *QUICK)
    children = pids(fleet.wait_ready(2))
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0
    lines = [json.loads(line) for line in fleet.log().splitlines() if line.startswith("{")]
    drained = {(e["slot"], e["pid"]) for e in lines
               if e.get("event") == "shutdown" and e["message"].startswith("shutdown: 2/5")}
    assert drained == set(children.items()), lines[-20:]
