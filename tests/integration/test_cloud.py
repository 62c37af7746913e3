"""Reporting to a control plane, end to end: a real ``pyrula cloud serve`` on a free port,
real ``pyrula worker`` processes on SQLite, the inline runner in the test's process."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.workflows import InlineWorkflowRunner, SQLiteStore, SyncWorkflowClient
from tests.conftest import wait_until
from tests.integration.cloudprocs import Collector
from tests.integration.workerprocs import STORE_FILE, Workers, child_env

pytestmark = pytest.mark.slow


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    c = Collector(tmp_path)
    try:
        yield c.start()
    finally:
        c.reap()


def cloud_env(collector: Collector, key: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    return child_env(**{"PYRULA_CLOUD_API_KEY": key, "PYRULA_CLOUD_URL": collector.url,
                        "PYRULA_CLOUD_OUTBOX_PATH": str(tmp_path / "outbox"), **extra})


def submit_open(client: SyncWorkflowClient, workers: Workers, n: int, tag: str) -> list[str]:
    """Submit ``n`` runs of pp_two_steps whose gate is open."""
    workers.open_gate(tag)
    return [client.submit("pp_two_steps", {"tag": tag}).run_id for _ in range(n)]


def reported(collector: Collector, key: str, status: str = "completed") -> set[str]:
    code, body = collector.get(f"/api/runs?status={status}&limit=100000", key)
    assert code == 200
    return {r["run_id"] for r in body["runs"]}


def test_keys_guard_the_api(collector: Collector) -> None:
    key = collector.create_key("staging")
    assert key.startswith("pyr_staging_")
    assert collector.get("/api/runs", None)[0] == 401
    assert collector.get("/api/fleets", "pyr_staging_" + "0" * 32)[0] == 401
    assert collector.get("/api/runs", key) == (200, {"runs": []})
    assert collector.get("/api/fleets", key) == (200, {"fleets": []})


def test_a_worker_reports_its_runs_with_its_keys_environment(
    collector: Collector, workers: Workers, client: SyncWorkflowClient, tmp_path: Path
) -> None:
    key = collector.create_key("prod")
    worker = workers.start(env=cloud_env(collector, key, tmp_path))
    runs = submit_open(client, workers, 5, "go")
    wait_until(lambda: reported(collector, key) >= set(runs), timeout=30,
               what="the collector to hear of every completed run")
    _, body = collector.get("/api/runs?workflow=pp_two_steps", key)
    mine = [r for r in body["runs"] if r["run_id"] in runs]
    assert sorted(r["run_id"] for r in mine) == sorted(runs)  # each run once
    assert {(r["workflow"], r["status"], r["environment"]) for r in mine} == {
        ("pp_two_steps", "completed", "prod")}
    _, fleets = collector.get("/api/fleets", key)
    ids = [w["worker_id"] for f in fleets["fleets"] for w in f["workers"]]
    assert len(ids) == 1
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0
    assert "shutdown: then the Cloud connector sends its events" in worker.log()


def test_the_collector_queues_a_submit_the_worker_takes(
    collector: Collector, workers: Workers, client: SyncWorkflowClient, tmp_path: Path
) -> None:
    key = collector.create_key("prod")
    workers.open_gate("cloud")
    workers.start(env=cloud_env(collector, key, tmp_path))
    code, queued = collector.post("/api/submits", key, {"workflow": "pp_two_steps",
                                                        "params": {"tag": "cloud"}})
    assert code == 201 and queued["environment"] == "prod"
    wait_until(lambda: reported(collector, key), timeout=30,
               what="the submitted run to complete and be reported")
    (run_id,) = reported(collector, key)
    assert client.get(run_id).status == "completed"


def test_every_terminal_event_arrives_once_across_a_collector_sigkill(
    collector: Collector, workers: Workers, client: SyncWorkflowClient, tmp_path: Path
) -> None:
    key = collector.create_key("prod")
    env = cloud_env(collector, key, tmp_path)
    for _ in range(2):
        workers.start("--max-concurrent-runs", "20", env=env)
    runs = submit_open(client, workers, 60, "load")
    wait_until(lambda: len(reported(collector, key)) >= 10, timeout=30,
               what="some runs reported before the kill")
    collector.kill()
    runs += submit_open(client, workers, 60, "load")
    wait_until(lambda: all(client.get(r).status == "completed" for r in runs), timeout=60,
               what="every run to complete while the collector is down")
    collector.start()
    wait_until(lambda: reported(collector, key) >= set(runs), timeout=60,
               what="every run reported after the restart")
    counts = Counter(run_id for run_id, _ in collector.terminal_events())
    assert set(counts) == set(runs)
    assert set(counts.values()) == {1}


def test_the_spool_delivers_what_a_drain_could_not_on_the_next_start(
    collector: Collector, workers: Workers, client: SyncWorkflowClient, tmp_path: Path
) -> None:
    key = collector.create_key("prod")
    env = cloud_env(collector, key, tmp_path, PYRULA_CLOUD_DRAIN_DEADLINE_S="0.5")
    collector.kill()
    first = workers.start(env=env, name="first")
    runs = submit_open(client, workers, 3, "spool")
    wait_until(lambda: all(client.get(r).status == "completed" for r in runs), timeout=30,
               what="the runs to complete with the collector down")
    first.send(signal.SIGTERM)
    assert first.wait() == 0
    assert "critical events spooled" in first.log()
    assert list((tmp_path / "outbox").glob("*.jsonl"))
    collector.start()
    workers.start(env=env, name="second")
    wait_until(lambda: reported(collector, key) >= set(runs), timeout=30,
               what="the spooled terminal events to arrive from the next start")
    wait_until(lambda: not list((tmp_path / "outbox").glob("*.jsonl")), timeout=30,
               what="the spool to be emptied once delivered")


def test_the_inline_runner_connects_on_start_and_reports(
    collector: Collector, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    key = collector.create_key("dev")
    for name, value in cloud_env(collector, key, tmp_path).items():
        if name.startswith("PYRULA_CLOUD"):
            monkeypatch.setenv(name, value)
    from tests.unit.test_client import my_workflow  # registers a one-step workflow

    async def main() -> str:
        store = SQLiteStore(tmp_path / STORE_FILE)
        runner = InlineWorkflowRunner(store=store, workflows=[my_workflow])
        await runner.start()
        await asyncio.to_thread(wait_until, lambda: _fleets(collector, key), 15)
        run = await runner.client.submit(my_workflow, {"x": 1})
        await runner.run(run.name, run.run_id)
        await runner.aclose()
        store.close()
        return run.run_id

    run_id = asyncio.run(main())
    assert run_id in reported(collector, key)
    (fleet,) = collector.get("/api/fleets", key)[1]["fleets"]
    assert fleet["workers"][0]["kind"] == "inline"


def _fleets(collector: Collector, key: str) -> list[object]:
    return list(collector.get("/api/fleets", key)[1]["fleets"])


def test_terminal_events_a_sigkilled_worker_never_sent_come_from_the_store(
    collector: Collector, workers: Workers, client: SyncWorkflowClient, tmp_path: Path
) -> None:
    """No spool, the collector down, the worker killed with SIGKILL: its connector's
    queue is gone, and the next connector of the environment sends the terminal events
    from the store's ended runs, each once."""
    key = collector.create_key("prod")
    env = cloud_env(collector, key, tmp_path, PYRULA_CLOUD_OUTBOX_PATH="off",
                    PYRULA_CLOUD_RECONCILE_S="0.5")
    collector.kill()
    first = workers.start(env=env, name="first")
    wait_until(lambda: "cloud_connected" in first.log(), timeout=30,
               what="the first worker's connector to start")
    runs = submit_open(client, workers, 6, "killed")
    wait_until(lambda: all(client.get(r).status == "completed" for r in runs), timeout=30,
               what="the runs to complete with the collector down")
    first.send(signal.SIGKILL)
    first.wait()
    assert not list((tmp_path / "outbox").glob("*.jsonl"))
    collector.start()
    second = workers.start(env=env, name="second")
    wait_until(lambda: reported(collector, key) >= set(runs), timeout=60,
               what="the killed worker's runs to be reported by the next worker")
    counts = Counter(run_id for run_id, _ in collector.terminal_events())
    assert {r: counts[r] for r in runs} == dict.fromkeys(runs, 1)
    assert "cloud_reconciled" in second.log()
