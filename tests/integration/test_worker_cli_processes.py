"""``pyrula worker`` and ``pyrula dev`` as real processes: signals, probes, environment.

Each run of ``pp_two_steps`` blocks in its sync step ``two`` until the test opens its gate,
so "a run in flight" is a state the test holds for as long as it needs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from functools import partial
from typing import Any

import pytest

from pyrula.timestamps import epoch_of
from pyrula.workflows import (
    ConfigurationError,
    MemoryStore,
    RunHandle,
    RunStatus,
    SyncWorkflowClient,
    WorkflowWorker,
)
from tests.conftest import wait_until
from tests.integration.workerprocs import (
    APP_MODULE,
    WorkerProcess,
    Workers,
    child_env,
    free_port,
    http_get,
)


def _in_flight(workers: Workers, client: SyncWorkflowClient, tag: str, *options: str,
               command: str = "worker") -> tuple[RunHandle, WorkerProcess]:
    """A worker with one run blocked in step ``two``."""
    run = client.submit("pp_two_steps", {"tag": tag})
    worker = workers.start(*options, command=command)
    workers.wait_ran("two", tag, worker.pid)
    return run, worker


# --- signals ---------------------------------------------------------------------------

def test_sigterm_drains_the_run_in_flight_and_exits_0(
    workers: Workers, client: SyncWorkflowClient
) -> None:
    run, worker = _in_flight(workers, client, "drain", "--shutdown-grace", "30")
    worker.send(signal.SIGTERM)
    worker.wait_for_log("waiting up to 30.0 s for 1 in-flight runs")
    assert worker.running(), "the worker must wait for its run, not quit"
    assert client.get(run.run_id).status == RunStatus.RUNNING

    workers.open_gate("drain")
    assert worker.wait() == 0
    assert client.get(run.run_id).status == RunStatus.COMPLETED
    assert "worker_stopped" in worker.log()


def test_sigterm_requeues_a_run_that_outlives_the_grace_with_reason_shutdown(
    workers: Workers, client: SyncWorkflowClient
) -> None:
    run, worker = _in_flight(workers, client, "late", "--shutdown-grace", "0.2",
                             "--cancel-timeout", "0.5")
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0
    journal = client.events(run.run_id)
    assert journal[-1]["type"] == "run:requeued" and journal[-1]["reason"] == "shutdown"
    assert client.get(run.run_id).status == RunStatus.QUEUED
    log = worker.log()
    assert "cancelling 1 runs still in flight" in log
    assert "worker_thread_calls_still_running" in log  # step two is still blocked

    # The requeued run is an ordinary queued run: the next worker finishes it.
    workers.open_gate("late")
    successor = workers.start()
    assert client.result(run.run_id, timeout=15) == {"one": "one",
                                                     "two": f"two-{successor.pid}"}
    assert workers.ran("one", "late") == [worker.pid]
    successor.send(signal.SIGTERM)
    assert successor.wait() == 0


def test_a_second_sigterm_while_draining_exits_143_at_once(
    workers: Workers, client: SyncWorkflowClient
) -> None:
    run, worker = _in_flight(workers, client, "term2", "--shutdown-grace", "60")
    worker.send(signal.SIGTERM)
    worker.wait_for_log("waiting up to 60.0 s")
    worker.send(signal.SIGTERM)
    assert worker.wait(timeout=5) == 143
    assert "quitting now" in worker.log()
    assert client.get(run.run_id).status == RunStatus.RUNNING  # left to orphan recovery


def test_sigint_twice_exits_130(workers: Workers, client: SyncWorkflowClient) -> None:
    _, worker = _in_flight(workers, client, "int2", "--shutdown-grace", "60")
    worker.send(signal.SIGINT)
    worker.wait_for_log("received SIGINT: draining")
    worker.send(signal.SIGINT)
    assert worker.wait(timeout=5) == 130


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_second_signal_quits_at_once_while_a_run_blocks_the_event_loop(
    workers: Workers, client: SyncWorkflowClient, signum: signal.Signals, code: int
) -> None:
    # The run's async step calls time.sleep(20): the worker's loop runs nothing until it
    # returns, and the second signal must not wait for that.
    client.submit("pp_hog", {"tag": f"hog{code}", "seconds": 20})
    worker = workers.start("--shutdown-grace", "60")
    workers.wait_ran("hog", f"hog{code}", worker.pid)
    worker.send(signum)
    worker.wait_for_log(f"received {signum.name}: draining")
    sent = time.monotonic()
    worker.send(signum)
    assert worker.wait(timeout=30) == code
    took = time.monotonic() - sent
    assert took < 8, f"the worker took {took:.1f} s to quit after the second signal"
    assert "quitting now" in worker.log()


# --- health probes ---------------------------------------------------------------------

def test_probes_say_ready_while_serving_and_draining_after_sigterm(
    workers: Workers, client: SyncWorkflowClient
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    run, worker = _in_flight(workers, client, "probe", "--health-port", str(port),
                             "--shutdown-grace", "30")
    status, body = wait_until(lambda: _answer(f"{base}/readyz"), what="a /readyz answer")
    assert (status, body["status"]) == (200, "ready")
    assert body["in_flight"] == 1 and body["worker_id"].split("-")[-2] == str(worker.pid)
    status, body = http_get(f"{base}/livez")
    assert (status, body["status"]) == (200, "ok")

    worker.send(signal.SIGTERM)
    status, body = wait_until(lambda: _draining(f"{base}/readyz"), timeout=5,
                              what="/readyz to turn 503")
    assert (status, body["status"]) == (503, "draining")
    assert client.get(run.run_id).status == RunStatus.RUNNING  # still in flight
    status, body = http_get(f"{base}/livez")
    assert (status, body["status"]) == (200, "ok")  # alive until the process exits

    workers.open_gate("probe")
    assert worker.wait() == 0
    assert client.get(run.run_id).status == RunStatus.COMPLETED


def _answer(url: str) -> tuple[int, dict[str, Any]] | None:
    try:
        return http_get(url)
    except OSError:  # not listening yet
        return None


def _draining(url: str) -> tuple[int, dict[str, Any]] | None:
    answer = http_get(url)
    return answer if answer[0] != 200 else None


# --- options from the environment ------------------------------------------------------

def test_max_concurrent_runs_from_the_environment_caps_the_runs_at_once(
    workers: Workers, client: SyncWorkflowClient
) -> None:
    tags = [f"c{i}" for i in range(5)]
    runs = {tag: client.submit("pp_concurrent", {"tag": tag}).run_id for tag in tags}
    worker = workers.start(env=child_env(PYRULA_MAX_CONCURRENT_RUNS="2"))

    remaining = set(tags)
    while remaining:
        expect = min(2, len(remaining))
        active = wait_until(partial(_active, workers, expect), timeout=30,
                            what=f"{expect} active runs")
        # A claim takes every run it may at once, so a worker that ignored the limit
        # would have the other queued runs running by now.
        running = [r for r in runs.values()
                   if client.get(r).status == RunStatus.RUNNING]
        assert len(running) == expect, f"{len(running)} runs running, limit 2"
        assert len(_active(workers, 0) or []) == expect
        for tag in active:
            workers.open_gate(tag)
        for tag in active:
            assert client.result(runs[tag], timeout=15) <= 2
        remaining -= set(active)

    seen = [int(words[2].removeprefix("seen=")) for words in workers.effects()]
    assert len(seen) == len(tags) and max(seen) <= 2
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def _active(workers: Workers, at_least: int) -> list[str] | None:
    active = sorted(p.name.removeprefix("active-") for p in workers.directory.glob("active-*"))
    return active if len(active) >= at_least else None


def test_a_bad_option_value_in_the_environment_fails_the_start(workers: Workers) -> None:
    worker = workers.start(env=child_env(PYRULA_CLAIM_POLL_INTERVAL="5s"))
    assert worker.wait() == 2  # as for every ConfigurationError at start
    log = worker.log()
    assert "error: PYRULA_CLAIM_POLL_INTERVAL" in log
    assert "PYRULA_CLAIM_POLL_INTERVAL" in log and "claim_poll_interval" in log
    assert "'5s'" in log
    assert "worker_started" not in log


def test_a_cloud_key_that_does_not_parse_fails_the_start_unless_no_cloud(
    workers: Workers,
) -> None:
    env = child_env(PYRULA_CLOUD_API_KEY="x")
    refused = workers.start(env=env, name="refused")
    assert refused.wait() == 2
    log = refused.log()
    assert "error: PYRULA_CLOUD_API_KEY is not a pyrula Cloud key" in log
    assert "Traceback" not in log
    assert "worker_started" not in log

    accepted = workers.start("--no-cloud", env=env, name="accepted")
    accepted.wait_for_log("worker_started")
    accepted.send(signal.SIGTERM)
    assert accepted.wait() == 0


def test_the_cloud_key_refusal_is_a_configuration_error_raised_by_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYRULA_CLOUD_API_KEY", "x")
    worker = WorkflowWorker(store=MemoryStore())
    with pytest.raises(ConfigurationError, match="PYRULA_CLOUD_API_KEY is not a pyrula Cloud"):
        asyncio.run(worker.run())
    assert worker.state == "starting"  # refused before any loop started


# --- pyrula dev ------------------------------------------------------------------------

def _seconds(before: dict[str, Any], after: dict[str, Any]) -> float:
    """Seconds between two JSON log lines (their ``ts``, ISO-8601 UTC)."""
    return epoch_of(after["ts"]) - epoch_of(before["ts"])


def test_dev_drains_with_a_3_s_grace_and_a_2_s_cancel_timeout(
    workers: Workers, client: SyncWorkflowClient
) -> None:
    run, worker = _in_flight(workers, client, "dev", "--log-format", "json", command="dev")
    worker.send(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    events = {e["message"].split(" ")[1]: e for e in worker.json_events()
              if e.get("event") == "shutdown"}
    assert "waiting up to 3.0 s for 1 in-flight runs" in events["2/5"]["message"]
    assert _seconds(events["2/5"], events["3/5"]) >= 2.9  # the grace was served
    assert "waiting up to 2.0 s for 0 store calls and 1 calls still in a thread" in (
        events["4/5"]["message"])
    stuck = [e for e in worker.json_events()
             if e.get("event") == "worker_thread_calls_still_running"]
    assert len(stuck) == 1 and "after 2.0 s" in stuck[0]["message"]
    assert _seconds(events["4/5"], stuck[0]) >= 1.9  # the cancel timeout was served
    assert client.events(run.run_id)[-1]["reason"] == "shutdown"


def test_dev_restarts_when_an_app_source_file_changes(workers: Workers) -> None:
    worker = workers.start("--log-format", "json", command="dev")
    worker.wait_for_log("worker_started")
    app = workers.directory / f"{APP_MODULE}.py"
    app.write_text(app.read_text() + "\n# edited\n")
    stat = app.stat()
    os.utime(app, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))

    worker.wait_for_log("worker_started", count=2)
    assert "code changed: restarting" in worker.log()
    started = [e["worker_id"] for e in worker.json_events() if e.get("event") == "worker_started"]
    assert len(started) == 2 and started[0] != started[1]
    assert worker.running()
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_json_logs_name_the_run_workflow_attempt_and_worker_on_every_line_they_know(
    workers: Workers, client: SyncWorkflowClient
) -> None:
    worker = workers.start("--log-format", "json")
    worker.wait_for_log("worker_started")
    run = client.submit("pp_logs", {"tag": "t1"})
    assert client.result(run.run_id, timeout=20) == "t1"
    worker.wait_for_log("charging t1")
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0

    lines = [line for line in worker.log().splitlines() if line.strip()]
    events = worker.json_events()
    assert len(events) == len(lines), "every line is one JSON object"
    started = next(e for e in events if e["event"] == "worker_started")
    worker_id = started["worker_id"]
    body = next(e for e in events if e["message"] == "starting t1")
    inside = next(e for e in events if e["message"] == "charging t1")
    for line in (body, inside):  # the app's own lines, inside the run
        assert line["logger"] == "procapp"
        assert (line["run_id"], line["workflow"], line["attempt"]) == (run.run_id, "pp_logs", 1)
        assert line["worker_id"] == worker_id
    assert inside["step"] == "chatty" and "step" not in body
    assert all(e.get("worker_id") == worker_id for e in events
               if e["event"] in ("worker_started", "shutdown", "worker_stopped"))


def _to_a_thread_other_than_main(pid: int, signum: signal.Signals) -> None:
    """Send ``signum`` to one of ``pid``'s threads other than its main one (tgkill), as the
    kernel may when it picks the thread itself."""
    import ctypes

    import psutil

    tid = next(t.id for t in psutil.Process(pid).threads() if t.id != pid)
    libc = ctypes.CDLL(None, use_errno=True)
    sys_tgkill = 234  # x86-64
    assert libc.syscall(sys_tgkill, pid, tid, int(signum)) == 0, ctypes.get_errno()


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="tgkill's number is x86-64's")
def test_signals_taken_by_another_thread_still_drain_and_quit_while_the_loop_is_blocked(
    workers: Workers, client: SyncWorkflowClient
) -> None:
    run = client.submit("pp_hog", {"tag": "hogthread", "seconds": 20})
    worker = workers.start("--shutdown-grace", "60")
    workers.wait_ran("hog", "hogthread", worker.pid)
    _to_a_thread_other_than_main(worker.pid, signal.SIGTERM)
    worker.wait_for_log("received SIGTERM: draining", timeout=8)
    _to_a_thread_other_than_main(worker.pid, signal.SIGTERM)
    assert worker.wait(timeout=30) == 143
    # It quit inside the block: had it waited for the 20 s step, the run would have ended.
    assert client.get(run.run_id).status is RunStatus.RUNNING
    assert "quitting now" in worker.log()
