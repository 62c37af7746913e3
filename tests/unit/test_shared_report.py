"""The board a fleet child reports its held runs on (``pyrula.shared_report``): the
supervisor reads the last report written whole, whatever a death in mid-write left; a
child's claim reports go there, not over the pipe; the supervisor folds the newer of the
board and the last heartbeat into what it knows of a dead child."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from pyrula import shared_report
from pyrula.shared_report import SharedReport
from pyrula.supervisor.children import Child
from pyrula.wire import Heartbeat, WorkerState, decode, parse_heartbeat
from pyrula.workflows.worker.child import Reports, StoreCheck

RUN_IDS = st.text(alphabet="0123456789abcdef", min_size=1, max_size=40)
REPORTS = st.fixed_dictionaries({
    "worker_id": st.text(max_size=12),
    "held": st.dictionaries(RUN_IDS, st.integers(1, 2**31), max_size=20),
    "user_code": st.lists(RUN_IDS, max_size=10),
    "suspects": st.lists(RUN_IDS, max_size=3),
})


@settings(max_examples=60)
@given(st.lists(REPORTS, min_size=1, max_size=8), st.data())
def test_the_last_report_written_whole_is_read_whatever_a_torn_write_left(
    reports: list[dict[str, Any]], data: st.DataObject,
) -> None:
    board = SharedReport()
    try:
        for seq, report in enumerate(reports, 1):
            assert board.write(seq, report)
        assert board.read() == (len(reports), reports[-1])
        # The child dies while writing the next one: its slot is left with any mix of
        # the new bytes and the old (its head last written, so possibly not at all).
        torn = data.draw(REPORTS)
        payload = orjson.dumps(torn)
        slot = ((len(reports) + 1) % 2) * shared_report._SLOT
        written = data.draw(st.integers(0, len(payload) - 1), label="bytes written")
        view = board._map
        assert view is not None
        start = slot + shared_report._HEAD.size
        view[start:start + written] = payload[:written]
        if data.draw(st.booleans(), label="head half written"):
            head = shared_report._HEAD.pack(len(reports) + 1, len(payload),
                                            shared_report._checksum(len(reports) + 1, payload))
            cut = data.draw(st.integers(1, len(head) - 1), label="head bytes")
            view[slot:slot + cut] = head[:cut]
        assert board.read() == (len(reports), reports[-1])
    finally:
        board.close()


def test_a_report_too_big_for_the_board_is_refused_and_none_is_read() -> None:
    board = SharedReport()
    try:
        assert board.read() is None
        huge = {"held": {f"{i:040x}": i for i in range(shared_report._ROOM // 40)}}
        assert not board.write(1, huge)
        assert board.read() is None
    finally:
        board.close()


def _child_writes(board: SharedReport, report: dict[str, Any]) -> None:
    board.write(7, report)


def test_the_board_reaches_a_child_started_by_a_fork_server() -> None:
    board = SharedReport()
    try:
        context = multiprocessing.get_context("forkserver")
        report = {"worker_id": "w", "held": {"r1": 3}, "user_code": ["r1"], "suspects": []}
        child = context.Process(target=_child_writes, args=(board, report))
        child.start()
        child.join(30)
        assert child.exitcode == 0
        assert board.read() == (7, report)
    finally:
        board.close()


class _Worker:
    """What ``Reports`` reads of a worker."""

    worker_id, state, in_flight, runs_done, free_slots, build = "w1", "ready", 1, 0, 9, ""

    def __init__(self, held: dict[str, int]) -> None:
        self.held = held

    def held_runs(self) -> dict[str, int]:
        return dict(self.held)

    def user_code_report(self, *, heartbeat: bool) -> tuple[list[str], list[str]]:
        return sorted(self.held), []

    def shards(self) -> dict[str, int]:
        return {}

    def claim_tick_age(self) -> float:
        return 0.0


def _pipe() -> tuple[Connection, Connection]:
    return multiprocessing.Pipe(duplex=True)


@settings(max_examples=30)
@given(st.dictionaries(RUN_IDS, st.integers(1, 2**31), max_size=20), st.integers(0, 3))
def test_a_claim_report_goes_to_the_board_and_wakes_no_one(
    held: dict[str, int], beats: int,
) -> None:
    board, (supervisor, child) = SharedReport(), _pipe()
    try:
        reports = Reports(child, board)
        for sent in range(beats):  # heartbeats, over the pipe, numbered with the reports
            child.send_bytes(reports.heartbeat(_Worker({}), StoreCheck()))
            assert parse_heartbeat(decode(supervisor.recv_bytes())).seq == sent + 1
        reports.held(_Worker(held), StoreCheck())
        assert not supervisor.poll()  # nothing sent: the supervisor sleeps on
        assert board.read() == (beats + 1, {"worker_id": "w1", "held": held,
                                            "user_code": sorted(held), "suspects": []})
    finally:
        board.close()
        supervisor.close()
        child.close()


def test_without_a_board_or_room_on_it_a_claim_report_is_a_heartbeat() -> None:
    board, (supervisor, child) = SharedReport(), _pipe()
    try:
        Reports(child, None).held(_Worker({"r1": 1}), StoreCheck())
        beat = parse_heartbeat(decode(supervisor.recv_bytes()))
        assert beat.held == {"r1": 1} and beat.user_code == ["r1"] and beat.seq == 1
        crowded = _Worker({f"{i:040x}": i for i in range(shared_report._ROOM // 40)})
        with ThreadPoolExecutor(1) as reader:  # more than a pipe holds: read as it goes
            received = reader.submit(supervisor.recv_bytes)
            Reports(child, board).held(crowded, StoreCheck())
            assert parse_heartbeat(decode(received.result(30))).held == crowded.held
        assert board.read() is None
    finally:
        board.close()
        supervisor.close()
        child.close()


def _exited(beat: Heartbeat | None, board: SharedReport) -> Child:
    supervisor, child = _pipe()
    child.close()
    return Child(slot=0, process=type("P", (), {"pid": os.getpid()})(), conn=supervisor,
                 beat=beat, board=board)


@given(st.integers(0, 5), st.integers(1, 5), REPORTS)
def test_a_dead_childs_runs_are_as_its_latest_report_says(
    beat_seq: int, board_seq: int, report: dict[str, Any],
) -> None:
    beat = Heartbeat(state=WorkerState.READY, worker_id="w1", pid=1, held={"old": 1},
                     user_code=["old"], seq=beat_seq)
    board = SharedReport()
    board.write(board_seq, report)
    child = _exited(beat, board)
    child.take_report()
    assert child.board is None
    assert child.beat is not None
    if board_seq > beat_seq:
        assert (child.beat.held, child.beat.user_code, child.beat.suspects, child.beat.seq) \
            == (report["held"], report["user_code"], report["suspects"], board_seq)
        assert child.beat.worker_id == report["worker_id"]
    else:
        assert child.beat == beat
    child.conn.close()


def test_a_child_that_reported_only_on_its_board_is_known_by_it() -> None:
    board = SharedReport()
    board.write(1, {"worker_id": "w9", "held": {"r": 2}, "user_code": ["r"], "suspects": []})
    child = _exited(None, board)
    child.take_report()
    assert child.beat is not None
    assert (child.beat.worker_id, child.beat.held, child.beat.user_code) == ("w9", {"r": 2},
                                                                           ["r"])
    child.conn.close()


def reporting_child(config: dict[str, Any], conn: Connection, *more: Any) -> None:
    """A stand-in for a fleet child's entry (started by ``Spawner.spawn``): it writes a
    report on the board it was given, if any, and says how many extra arguments came."""
    if more:
        more[0].write(1, {"worker_id": "w", "held": {"r": 1}, "user_code": [],
                          "suspects": []})
    conn.send_bytes(str(len(more)).encode())


SPAWNING = textwrap.dedent("""
    import sys
    from pyrula.supervisor import children, trampoline

    if sys.argv[1] == "refused":
        def refused():
            raise OSError(38, "Function not implemented")
        children.SharedReport = refused
    trampoline.CHILD_ENTRY = "tests.unit.test_shared_report:reporting_child"
    child = children.Spawner(preload=[]).spawn(0, {})
    said = child.conn.recv_bytes().decode()
    child.process.join(30)
    child.take_report()
    print(said, child.beat.held if child.beat else None, child.board)
""")


def _spawned(case: str) -> str:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    done = subprocess.run([sys.executable, "-c", SPAWNING, case], capture_output=True,
                          text=True, timeout=60, check=False, env=env, cwd=root)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_spawned_child_gets_its_board_through_the_fork_server() -> None:
    assert _spawned("board") == "1 {'r': 1} None"


def test_without_shared_memory_a_child_is_spawned_without_a_board() -> None:
    assert _spawned("refused") == "0 None None"
