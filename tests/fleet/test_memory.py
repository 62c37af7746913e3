"""Memory limits on real fleets: children that leak are replaced above the soft limit
(``--max-memory-per-child``) before they reach the hard one, capacity kept; a child above
``--memory-hard-limit`` is killed at once, and its run is requeued with the evidence that
the fleet killed it for its RSS; in a container, the limits default from its cgroup."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pyrula.workflows import RunStatus, SyncWorkflowClient
from tests.fleet.fleetprocs import QUICK, Fleets, StatusRecorder, child_env, write_app

pytestmark = pytest.mark.slow

MIB = 1024 * 1024

MEMORY_APP = '''
"""Workflows that hold memory in their child (written by tests/fleet/test_memory.py)."""

import os
import time
from pathlib import Path

from pyrula.workflows import step, workflow

HERE = Path(__file__).resolve().parent
#: Grows by 1 MB with every run the child serves, and is never freed.
LEAKED = []


@step
def leak(tag: str) -> int:
    LEAKED.append(b"\\x01" * (1 << 20))  # written, so resident
    return os.getpid()


@workflow(name="mem_leak")
async def leaking(ctx, params):
    return await leak(params["tag"])


@step
def balloon(tag: str, mb: int) -> int:
    """The first process to run it takes ``mb`` MB and keeps it; any later one returns."""
    try:
        (HERE / f"balloon-{tag}").open("x").close()
    except FileExistsError:
        return os.getpid()
    held = b"\\x01" * (mb << 20)
    while held:
        time.sleep(0.01)
    return 0


@workflow(name="mem_balloon")
async def ballooning(ctx, params):
    return await balloon(params["tag"], params["mb"])
'''


@pytest.mark.parametrize(("soft_mb", "hard_mb"), [
    (80, 300),
    # The figures a deployment would use: about 170 leaking runs per child before each
    # recycle; in `make soak`.
    pytest.param(200, 400, marks=pytest.mark.soak),
])
def test_leaking_children_are_replaced_above_the_soft_limit_before_the_hard_one(
    fleets: Fleets, client: SyncWorkflowClient, tmp_path: Path, soft_mb: int, hard_mb: int
) -> None:
    write_app(tmp_path, MEMORY_APP, module="memapp")
    soft, hard = soft_mb * MIB, hard_mb * MIB
    fleet = fleets.start("-n", "2", "--max-memory-per-child", f"{soft_mb}MB",
                         "--memory-hard-limit", f"{hard_mb}MB", *QUICK, app="memapp")
    fleet.wait_ready(2)
    served_by: set[int] = set()
    restarts = 0
    with StatusRecorder(fleet) as recorder:
        batch = 0
        # Each run leaks 1 MB in its child: 160 runs take both children past the soft limit.
        while batch < 16 or restarts < 2:
            runs = [client.submit("mem_leak", {"tag": f"b{batch}-{i}"}) for i in range(10)]
            for run in runs:
                served_by.add(client.result(run.run_id, timeout=30))
            batch += 1
            status = fleet.status()
            assert status is not None
            restarts = status["restarts"]
            assert batch < 6 * soft_mb // 10, f"not recycled after {batch * 10} runs: {status}"
    rss = [c["rss_bytes"] for s in recorder.samples for c in s["children"]]
    print(f"soft limit: {batch * 10} runs on {len(served_by)} children, "
          f"{recorder.samples[-1]['restarts']} restarts, largest RSS seen "
          f"{max(rss) / MIB:.0f} MB, fewest ready children {recorder.min_ready()}")
    assert recorder.min_ready() >= 1  # capacity never dropped to zero
    assert max(rss) < hard
    assert max(rss) > soft  # the leak did reach the soft limit
    assert len(served_by) > 2  # runs were served by replacements too
    log = fleet.log()
    assert log.count("child_recycle: slot") >= 2 and "queued (RSS" in log
    assert "child_memory_killed" not in log and "died" not in log
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def test_a_child_over_the_hard_limit_is_killed_and_its_run_finishes_on_a_fresh_one(
    fleets: Fleets, client: SyncWorkflowClient, tmp_path: Path
) -> None:
    write_app(tmp_path, MEMORY_APP, module="memapp")
    fleet = fleets.start("-n", "1", "--memory-hard-limit", "150MB", *QUICK, app="memapp")
    [first] = [c["pid"] for c in fleet.wait_ready(1)["children"]]
    run = client.submit("mem_balloon", {"tag": "t", "mb": 250})
    finished_on = client.result(run.run_id, timeout=30)
    assert finished_on not in (first, 0)
    assert client.get(run.run_id).status is RunStatus.COMPLETED

    [requeued] = [e for e in client.events(run.run_id) if e["type"] == "run:requeued"]
    detail = requeued["detail"]
    assert detail["pid"] == first and detail["exit_signal"] == "SIGKILL"
    assert detail["rss_bytes"] > 150 * MIB
    assert detail["killed_for"] == (f"RSS {round(detail['rss_bytes'] / MIB)} MB over "
                                    "--memory-hard-limit 150 MB")
    log = fleet.log()
    assert f"child_memory_killed: slot 0 pid {first} RSS " in log
    assert "over --memory-hard-limit 150 MB; killing it" in log
    assert "child_recycle" not in log  # no soft limit: killed, not drained
    fleet.wait_ready(1)
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def _start_in_container(tmp_path: Path, limit: str,
                        *args: str) -> subprocess.CompletedProcess[str]:
    """``pyrula-fleet start`` as in a cgroup v2 container whose ``memory.max`` is ``limit``,
    with an app that cannot boot (the fleet stops after its first child)."""
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir(exist_ok=True)
    (cgroup / "memory.max").write_text(limit + "\n")
    write_app(tmp_path, 'raise RuntimeError("stop here")\n', module="stophere")
    pin = (f"import pathlib, pyrula.supervisor.memory as m; "
           f"m.CGROUP_ROOT = pathlib.Path({str(cgroup)!r}); ")
    return subprocess.run(
        [sys.executable, "-c", pin + "from pyrula.cli.fleet import main; main()", "start",
         "--app", "stophere", "--store", "sqlite:///store.db", "--health-port", "0",
         "--max-boot-failures", "1", *args],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120,
    )


def test_in_a_container_the_limits_default_from_its_cgroup(tmp_path: Path) -> None:
    proc = _start_in_container(tmp_path, str(3 * 1024 * MIB), "-n", "2")
    lines = [line for line in proc.stderr.splitlines() if "fleet_memory_limits" in line]
    assert len(lines) == 1, proc.stderr
    assert ("fleet_memory_limits: container limit 3072 MB, 2 children: recycle above 819 MB "
            "(from the container's limit), kill above 921 MB (from the container's limit)"
            ) in lines[0]

    proc = _start_in_container(tmp_path, "max", "-n", "2")
    assert "fleet_memory_limits" not in proc.stderr  # no limit: nothing derived, as before

    proc = _start_in_container(tmp_path, str(3 * 1024 * MIB), "-n", "2",
                               "--max-memory-per-child", "500MB")
    assert ("recycle above 500 MB, kill above 921 MB (from the container's limit)"
            in proc.stderr), proc.stderr


def test_a_hard_limit_not_above_the_soft_one_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args, env in (
        (["--max-memory-per-child", "200MB", "--memory-hard-limit", "200MB"], {}),
        (["--max-memory-per-child", "200MB"], {"PYRULA_MEMORY_HARD_LIMIT": "100MB"}),
    ):
        proc = subprocess.run(
            [sys.executable, "-c", "from pyrula.cli.fleet import main; main()", "start",
             "--app", "fleetapp", "--store", "sqlite:///store.db", *args],
            cwd=tmp_path, env=child_env(**env), capture_output=True, text=True, timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert line.startswith("error: --memory-hard-limit (")
        assert "must be above --max-memory-per-child (209715200 bytes)" in line


HANG_APP = '''
"""memapp, whose children stay starting while the file ``hang-boot`` exists."""

import asyncio
from pathlib import Path

import memapp  # noqa: F401  (the workflows)
from pyrula.workflows.worker.worker import WorkflowWorker

HERE = Path(__file__).resolve().parent
_prepare = WorkflowWorker._prepare_store


async def _prepare_unless_told_to_hang(self):
    while (HERE / "hang-boot").exists():
        await asyncio.sleep(0.01)  # heartbeats go on: starting, never ready
    await _prepare(self)


WorkflowWorker._prepare_store = _prepare_unless_told_to_hang
'''


def test_a_replacement_that_never_becomes_ready_holds_back_no_other_recycle(
    fleets: Fleets, client: SyncWorkflowClient, tmp_path: Path
) -> None:
    write_app(tmp_path, MEMORY_APP, module="memapp")
    write_app(tmp_path, HANG_APP, module="hangapp")
    fleet = fleets.start("-n", "2", "--max-memory-per-child", "70MB", "--child-timeout", "3",
                         *QUICK, app="hangapp")
    old = {c["slot"]: c["pid"] for c in fleet.wait_ready(2)["children"]}
    (tmp_path / "hang-boot").touch()
    with StatusRecorder(fleet) as recorder:
        # Both children leak past the soft limit; neither replacement can become ready.
        batch = 0
        while fleet.log().count("child_recycle: slot") < 2:
            runs = [client.submit("mem_leak", {"tag": f"b{batch}-{i}"}) for i in range(10)]
            assert {client.result(r.run_id, timeout=30) for r in runs} <= set(old.values())
            batch += 1
            assert batch < 80, fleet.log()[-4000:]
        fleet.wait_for_log("child_replacement_failed: slot 0")
        fleet.wait_for_log("child_replacement_failed: slot 1")
        # Each slot had its turn, and the children they were to replace serve on.
        runs = [client.submit("mem_leak", {"tag": f"after-{i}"}) for i in range(10)]
        assert {client.result(r.run_id, timeout=30) for r in runs} <= set(old.values())
        status = fleet.status()
        assert status is not None and {c["slot"]: c["pid"] for c in status["children"]} == old
        (tmp_path / "hang-boot").unlink()
        replaced = fleet.wait_status(
            lambda s: s["restarts"] >= 2 and len([c for c in s["children"]
                                                  if c["state"] == "ready"]) == 2,
            what="both children replaced once replacements can boot")
    print(f"replacement not ready: {batch * 10} runs, fewest ready children "
          f"{recorder.min_ready()}")
    assert recorder.min_ready() == 2  # capacity kept throughout
    assert not set(old.values()) & {c["pid"] for c in replaced["children"]}
    log = fleet.log()
    assert "fleet_crash_loop" not in log  # killed on purpose, not counted as boot failures
    assert "not ready" in log and "child_memory_killed" not in log
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0
