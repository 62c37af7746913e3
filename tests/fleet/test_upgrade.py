"""An upgrade on one host (SIGUSR2 / ``pyrula-fleet upgrade``), with real processes: runs
in flight move to the new code at their next step where it can replay them, stay on the
old code where it cannot, no run fails with NonDeterminismError, and the old generation
exits on its own."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunStatus, SyncWorkflowClient
from tests.conftest import wait_until
from tests.fleet.fleetprocs import FLEET, QUICK, STORE_URL, Fleets, child_env, ready, write_app

pytestmark = pytest.mark.slow

MODULE = "upapp"

APP = textwrap.dedent(
    '''
    """The upgrade tests' app; the test rewrites it between versions."""

    import os
    import time
    from pathlib import Path

    from pyrula.workflows import step, workflow

    HERE = Path(__file__).resolve().parent
    VERSION = "{version}"


    def _mark(what):
        with open(HERE / "effects.log", "a") as f:
            f.write(f"{{what}} {{os.getpid()}}\\n")


    @step(name="{first}")
    def first(tag: str) -> str:
        _mark(f"first {{tag}}")
        while not (HERE / f"gate-{{tag}}").exists():
            time.sleep(0.01)
        return VERSION


    @step(name="second")
    def second(tag: str) -> str:
        _mark(f"second {{tag}}")
        return "{version}"  # in the step's source: each version is another build


    @workflow(name="up_flow")
    async def flow(ctx, params):
        return [await first(params["tag"]), await second(params["tag"])]


    @step(name="quick")
    def quick(i: int) -> int:
        time.sleep(0.02)
        return i


    @workflow(name="up_load")
    async def load(ctx, params):
        return [await quick(params["i"]), await quick(params["i"] + 1)]
    '''
)


def _write(directory: Path, version: str, first: str = "first") -> None:
    write_app(directory, APP.format(version=version, first=first), MODULE)


def _upgrading(status: dict[str, Any]) -> bool:
    gens = status.get("generations") or []
    return len(gens) == 2 and gens[1]["state"] == "serving"


def _run_upgrade(fleets: Fleets, client: SyncWorkflowClient, *, first: str
                 ) -> tuple[list[Any], list[Any], str]:
    """Three runs held in their first step on v1, an upgrade to v2 (step ``first`` named
    ``first``), then three runs submitted after it; returns (old runs, new runs, log)."""
    directory = fleets.directory
    _write(directory, "v1")
    fleet = fleets.start("-n", "2", "--lock-ttl", "5", *QUICK, app=MODULE)
    fleet.wait_ready(2)
    old = [client.submit("up_flow", {"tag": f"old{i}"}) for i in range(3)]
    wait_until(lambda: sum(1 for e in fleets.effects() if e[0] == "first") == 3, 20,
               what="the old runs in their first step")
    # A stream of short runs throughout: some in flight whenever the generations change.
    load = [client.submit("up_load", {"i": i}) for i in range(40)]

    _write(directory, "v2", first)
    upgraded = subprocess.run([*FLEET, "upgrade", "--url", fleet.url], env=child_env(),
                              capture_output=True, text=True, timeout=30)
    assert upgraded.returncode == 0, upgraded.stderr
    status = fleet.wait_status(_upgrading, 30, what="generation 2 serving beside 1")
    assert [g["id"] for g in status["generations"]] == [1, 2]
    assert status["generations"][0]["state"] == "retiring"
    assert status["generations"][0]["build"] != status["generations"][1]["build"]
    assert {c["generation"] for c in ready(status)} == {2}

    for i in range(3):
        (directory / f"gate-old{i}").touch()
        (directory / f"gate-new{i}").touch()
    new = [client.submit("up_flow", {"tag": f"new{i}"}) for i in range(3)]
    load += [client.submit("up_load", {"i": i}) for i in range(40, 80)]
    for run in old + new:
        client.result(run.run_id, timeout=60)
    for i, run in enumerate(load):  # the stream completed, none failed for the upgrade
        assert client.result(run.run_id, timeout=60) == [i, i + 1]
    log = fleet.wait_for_log("fleet_upgraded", 60)
    final = fleet.wait_status(lambda s: "generations" not in s, 30, what="one generation")
    assert {c["generation"] for c in final["children"]} == {2}
    fleet.send(signal.SIGTERM)
    assert fleet.wait(60) == 0
    return old, new, log


def test_an_incompatible_upgrade_leaves_each_run_on_the_code_that_replays_it(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    # v2 renames the first step: a run that recorded it cannot replay on v2.
    old, new, log = _run_upgrade(fleets, client, first="first_renamed")
    for run in old:
        info = client.get(run.run_id)
        assert info.status is RunStatus.COMPLETED, info
        assert info.result == ["v1", "v1"]  # finished on the old generation
        reasons = [e.get("reason") for e in client.events(run.run_id)
                   if e["type"] == "run:requeued"]
        assert "upgrade" in reasons and "build_mismatch" in reasons
    for run in new:
        assert client.result(run.run_id) == ["v2", "v2"]
    assert "NonDeterminismError" not in log
    assert "run_build_mismatch" in log


def test_a_compatible_upgrade_moves_runs_in_flight_to_the_new_code_at_their_next_step(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    old, new, log = _run_upgrade(fleets, client, first="first")
    for run in old:
        assert client.result(run.run_id) == ["v1", "v2"]  # step 1 on v1, step 2 on v2
        journal = client.events(run.run_id)
        firsts = [e for e in journal if e["type"] == "step:completed" and e["step"] == "first"]
        assert len(firsts) == 1  # the step was not cut in half nor run again
        builds = [e["build"] for e in journal if e["type"] == "run:started"]
        assert len(builds) == 2 and builds[0] != builds[1]
        assert [e["reason"] for e in journal if e["type"] == "run:requeued"] == ["upgrade"]
    for run in new:
        assert client.result(run.run_id) == ["v2", "v2"]
    assert "run_build_mismatch" not in log


def test_past_the_drain_deadline_a_run_no_code_can_replay_is_parked_and_listed_as_stuck(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    directory = fleets.directory
    _write(directory, "v1")
    fleet = fleets.start("-n", "1", "--drain-deadline", "1", "--shutdown-grace", "0.5",
                         "--cancel-timeout", "0.5", app=MODULE)
    fleet.wait_ready(1)
    run = client.submit("up_flow", {"tag": "late"})  # its gate never opens
    wait_until(lambda: any(e[:2] == ["first", "late"] for e in fleets.effects()), 20,
               what="the run in its first step")
    # ...and the first step is recorded as started: v2 then cannot replay it
    _write(directory, "v2", "first_renamed")
    fleet.send(signal.SIGUSR2)
    fleet.wait_for_log("fleet_upgraded", 60)

    wait_until(lambda: client.get(run.run_id).status is RunStatus.WAITING, 30,
               what="the run parked for want of its build")
    info = client.get(run.run_id)
    assert info.waiting_for == ("pyrula.build",)
    stuck = subprocess.run([sys.executable, "-m", "pyrula.cli", "runs", "stuck", "--json",
                            "--store", STORE_URL], cwd=directory, env=child_env(),
                           capture_output=True, text=True, timeout=60)
    assert stuck.returncode == 0, stuck.stderr
    [row] = [r for r in json.loads(stuck.stdout) if r["run_id"] == run.run_id]
    assert row["status"] == "waiting" and "cannot replay" in row["why"], row
    assert "NonDeterminismError" not in fleet.log()
    fleet.send(signal.SIGTERM)
    assert fleet.wait(60) == 0


def test_sigterm_during_an_upgrade_drains_both_generations(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    directory = fleets.directory
    _write(directory, "v1")
    fleet = fleets.start("-n", "1", "--shutdown-grace", "0.5", "--cancel-timeout", "0.5",
                         app=MODULE)
    fleet.wait_ready(1)
    run = client.submit("up_flow", {"tag": "held"})  # keeps its old child retiring
    wait_until(lambda: any(e[:2] == ["first", "held"] for e in fleets.effects()), 20,
               what="the run in its first step")
    _write(directory, "v2", "first_renamed")
    fleet.send(signal.SIGUSR2)
    fleet.wait_status(_upgrading, 30, what="generation 2 serving beside 1")
    fleet.send(signal.SIGTERM)
    assert fleet.wait(30) == 0
    log = fleet.log()
    assert "past the drain deadline" not in log, log[-4000:]  # the old child drained too
    assert log.count("after draining") == 2, log[-4000:]
    assert client.get(run.run_id).status is RunStatus.QUEUED  # handed back, not lost


SUSPENDED_APP = textwrap.dedent(
    '''
    """The suspended-runs upgrade test's app; the test rewrites it between versions."""

    from pyrula.workflows import step, workflow

    VERSION = "{version}"


    @step(name="{pre}")
    def pre(tag: str) -> str:
        return VERSION


    @step(name="post")
    def post(tag: str) -> str:
        return "{version}"  # in the step's source: each version is another build


    @workflow(name="up_wait")
    async def wait_flow(ctx, params):
        first = await pre(params["tag"])
        got = await ctx.wait_for_signal("go")
        return [first, got, await post(params["tag"])]


    @workflow(name="up_sleep")
    async def sleep_flow(ctx, params):
        first = await pre(params["tag"])
        await ctx.sleep(params["seconds"])
        return [first, await post(params["tag"])]
    '''
)


def _old_generation(status: dict[str, Any]) -> dict[str, Any] | None:
    gens = status.get("generations") or []
    return gens[0] if len(gens) == 2 and gens[1]["state"] == "serving" else None


def test_runs_suspended_across_an_incompatible_upgrade_finish_on_the_old_code(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    """20 runs wait for a signal and one sleeps when the code changes so that their
    journals no longer replay: the old generation stays (one child) while they are open,
    each finishes on v1 when it wakes, runs submitted after the upgrade run on v2, and the
    old generation exits on its own once the last v1 run has ended."""
    directory = fleets.directory
    write_app(directory, SUSPENDED_APP.format(version="v1", pre="pre"), MODULE)
    fleet = fleets.start("-n", "2", "--timer-poll-interval-s", "0.2", *QUICK, app=MODULE)
    fleet.wait_ready(2)
    waiting = [client.submit("up_wait", {"tag": f"old{i}"}) for i in range(20)]
    sleeping = client.submit("up_sleep", {"tag": "nap", "seconds": 8})
    wait_until(lambda: all(client.get(r.run_id).status is RunStatus.WAITING for r in waiting)
               and client.get(sleeping.run_id).status is RunStatus.SLEEPING, 30,
               what="the v1 runs suspended")

    # v2 renames the first step: a journal that recorded it does not replay on v2.
    write_app(directory, SUSPENDED_APP.format(version="v2", pre="pre_v2"), MODULE)
    fleet.send(signal.SIGUSR2)
    # The idle retired children but one exit; the one kept stays for the 21 open runs.
    status = fleet.wait_status(
        lambda s: (_old_generation(s) or {}).get("open_runs") == 21
        and (_old_generation(s) or {}).get("children") == 1,
        30, what="the old generation down to one child, kept for 21 open runs")
    assert {c["generation"] for c in ready(status)} == {2}
    shown = subprocess.run([*FLEET, "status", "--url", fleet.url], env=child_env(),
                           capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert "generation 1 retiring: 1 child," in shown.stdout, shown.stdout
    assert "open runs only its code can replay: 21" in shown.stdout, shown.stdout

    fresh = [client.submit("up_wait", {"tag": f"new{i}"}) for i in range(10)]
    wait_until(lambda: all(client.get(r.run_id).status is RunStatus.WAITING for r in fresh),
               30, what="the v2 runs waiting")
    for i, run in enumerate(waiting + fresh):
        client.signal(run.run_id, "go", i)
    for i, run in enumerate(waiting):
        assert client.result(run.run_id, timeout=60) == ["v1", i, "v1"]
    for i, run in enumerate(fresh, start=len(waiting)):
        assert client.result(run.run_id, timeout=60) == ["v2", i, "v2"]
    assert client.result(sleeping.run_id, timeout=60) == ["v1", "v1"]

    log = fleet.wait_for_log("fleet_upgraded", 60)
    assert "child_kept" in log
    final = fleet.wait_status(lambda s: "generations" not in s, 30, what="one generation")
    assert {c["generation"] for c in final["children"]} == {2}
    assert "NonDeterminismError" not in log
    for run in waiting + [sleeping]:  # none parked for want of its build on the way
        assert not any(e.get("signal") == "pyrula.build" for e in client.events(run.run_id))
    fleet.send(signal.SIGTERM)
    assert fleet.wait(60) == 0
