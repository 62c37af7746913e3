"""Elastic sizing for real (``--min``/``--max``): an idle fleet stays at --min, a load step
grows it, and once the load is done it drains back to --min, every run completed once.

The load is ``fa_load`` (two steps of 50 ms each, in the child's thread pool) with few
slots per child (``--max-concurrent-runs 4``), so that a few hundred runs make them wait.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunStatus, SyncWorkflowClient, ValkeyStore
from tests.fleet.fleetprocs import FLEET, QUICK, Fleet, Fleets, StatusRecorder, child_env

ELASTIC = ("--min", "1", "--max", "3", "--scale-up-after", "0.5", "--scale-down-after", "2",
           "--max-concurrent-runs", "4", *QUICK)
RUNS = 300
#: The suite shares this host's CPU with other tests: a busy host must not hold the growth
#: these tests wait for (the headroom checks have their own table tests).
SHARED_HOST = child_env(PYRULA_SCALE_MIN_CPU_FREE="0")


def _sizes(recorder: StatusRecorder) -> set[tuple[int, int]]:
    """(desired, children) pairs seen."""
    return {(s["desired"], len(s["children"])) for s in recorder.samples}


def _scaled(fleet: Fleet, direction: str) -> list[str]:
    return re.findall(rf"fleet_scaled: {direction} \d+ -> \d+ children: [^\n]*", fleet.log())


def _check_once(client: SyncWorkflowClient, runs: list[Any]) -> None:
    """Every run completed, each of its steps completed once in its journal."""
    for run in runs:
        info = client.get(run.run_id)
        assert info is not None and info.status is RunStatus.COMPLETED, info
        completed = Counter(e["step"] for e in client.events(run.run_id)
                            if e["type"] == "step:completed")
        assert completed == {"step_a": 1, "step_b": 1}, (run.run_id, completed)


@pytest.mark.slow
def test_an_idle_elastic_fleet_stays_at_min(fleets: Fleets,
                                            client: SyncWorkflowClient) -> None:
    fleet = fleets.start(*ELASTIC, env=SHARED_HOST)
    status = fleet.wait_ready(1)
    assert (status["min"], status["max"], status["desired"]) == (1, 3, 1)
    with StatusRecorder(fleet) as recorder:
        # One run at a time: nothing ever waits, so nothing is added.
        for i in range(20):
            run = client.submit("fa_load", {"tag": f"light{i}"})
            assert client.result(run.run_id, timeout=20) == ["a", "b"]
    assert _sizes(recorder) == {(1, 1)}
    assert "fleet_scaled" not in fleet.log()
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


@pytest.mark.slow
def test_a_load_step_grows_the_fleet_and_it_shrinks_back_to_min(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    fleet = fleets.start(*ELASTIC, env=SHARED_HOST)
    fleet.wait_ready(1)
    with StatusRecorder(fleet) as recorder:
        runs = [client.submit("fa_load", {"tag": f"r{i}"}) for i in range(RUNS)]
        grown = fleet.wait_status(lambda s: s["desired"] >= 2 and len(
            [c for c in s["children"] if c["state"] == "ready"]) >= 2, timeout=30,
            what="a second ready child")
        assert grown["max"] == 3
        for run in runs:
            assert client.result(run.run_id, timeout=60) == ["a", "b"]
        back = fleet.wait_status(lambda s: s["desired"] == 1 and len(s["children"]) == 1,
                                 timeout=30, what="back to --min")
    assert back["status"] == "ok"
    ups, downs = _scaled(fleet, "up"), _scaled(fleet, "down")
    assert ups and downs, fleet.log()
    assert "oldest queued run waited" in ups[0] or "max_concurrent_runs" in ups[0], ups[0]
    assert "every child idle" in downs[-1], downs[-1]
    assert all(s["desired"] <= 3 and len(s["children"]) <= 3 for s in recorder.samples)
    # Each scaled-down child drained on purpose and exited 0 (not killed, not replaced).
    fleet.wait_for_log_count("(exit code 0) after draining\n", len(downs))
    assert len(re.findall(r"child_exited: slot \d+ pid \d+ \(exit code 0\) after draining\n",
                          fleet.log())) == len(downs)
    assert back["restarts"] == 0
    _check_once(client, runs)
    # Nothing ran twice: no step was cut short and run again elsewhere.
    executions = Counter(tuple(words[:2]) for words in fleets.effects())
    assert set(executions.values()) == {1}
    assert len(executions) == 2 * RUNS
    metrics = fleet.get("/metrics")[1]
    assert f'pyrula_fleet_scaled_total{{direction="up"}} {float(len(ups))}' in metrics
    assert f'pyrula_fleet_scaled_total{{direction="down"}} {float(len(downs))}' in metrics
    shown = subprocess.run([*FLEET, "status", "--url", fleet.url], env=child_env(),
                           capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert "desired=1 min=1 max=3" in shown.stdout.splitlines()[0]
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


@pytest.mark.slow
def test_sigttin_is_refused_with_elastic_sizing(fleets: Fleets) -> None:
    fleet = fleets.start(*ELASTIC, env=SHARED_HOST)
    fleet.wait_ready(1)
    fleet.send(signal.SIGTTIN)
    fleet.wait_for_log("received SIGTTIN: ignored, --min/--max size this fleet")
    assert fleet.status() is not None
    assert fleet.wait_ready(1)["desired"] == 1
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


@pytest.mark.slow
def test_a_scaled_down_child_releases_its_shards(
    fleets: Fleets, valkey_url: str, valkey_namespace: str
) -> None:
    """On Valkey: grown to two children, the shards are split; back at one, it holds all."""
    fleet = fleets.start("--min", "1", "--max", "2", "--scale-up-after", "0.5",
                         "--scale-down-after", "2", "--max-concurrent-runs", "4",
                         "--workflow", "fleetapp:load", "--namespace", valkey_namespace,
                         "--shard-lease-interval", "0.5", *QUICK, app=None, store=valkey_url,
                         env=SHARED_HOST)
    fleet.wait_ready(1)
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace)
    try:
        client = SyncWorkflowClient(store)
        runs = [client.submit("fa_load", {"tag": f"v{i}"}) for i in range(RUNS)]
        fleet.wait_status(lambda s: len([c for c in s["children"] if c["state"] == "ready"
                                         and c["shards"].get("fa_load")]) == 2,
                          timeout=30, what="two children holding shards")
        for run in runs:
            assert client.result(run.run_id, timeout=60) == ["a", "b"]
        total = 64
        back = fleet.wait_status(
            lambda s: len(s["children"]) == 1 and s["shards"].get("fa_load") == total,
            timeout=30, what="one child holding every shard")
        assert back["children"][0]["shards"] == {"fa_load": total}
        assert _scaled(fleet, "down")
        _check_once(client, runs)
    finally:
        store.close()
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--min", "2"), "--min and --max go together"),
        (("--max", "3"), "--min and --max go together"),
        (("--min", "3", "--max", "2"), "--max (2) must be >= --min (3)"),
        (("--min", "0", "--max", "2"), "--min must be >= 1"),
        (("-n", "5", "--min", "1", "--max", "3"), "must be within --min 1 .. --max 3"),
        (("--scale-up-after", "1"), "--scale-up-after needs --min and --max"),
        (("--min", "1", "--max", "2", "--scale-down-after", "-1"),
         "--scale-down-after must be > 0"),
    ],
)
def test_bad_sizing_flags_exit_2_with_one_line(tmp_path: Path, args: tuple[str, ...],
                                               message: str) -> None:
    done = subprocess.run([*FLEET, "start", "--app", "fleetapp", *args], cwd=tmp_path,
                          env=child_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_the_sizing_variables_are_read(tmp_path: Path) -> None:
    env = child_env(PYRULA_MIN_CHILDREN="4", PYRULA_MAX_CHILDREN="2")
    done = subprocess.run([*FLEET, "start", "--app", "fleetapp"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--max (2) must be >= --min (4)" in done.stderr, done.stderr
