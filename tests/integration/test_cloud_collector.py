"""The collector itself: its PostgreSQL backend with a real worker reporting, and its
dashboard in a real browser."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.workflows import SyncWorkflowClient
from tests.conftest import wait_until
from tests.integration.cloudprocs import Collector
from tests.integration.dashboard_browser import browser_page, skip_without_browser
from tests.integration.test_cloud import cloud_env, reported, submit_open
from tests.integration.workerprocs import Workers

pytestmark = pytest.mark.slow


@pytest.fixture
def pg_collector(tmp_path: Path, fresh_postgres_dsn: str) -> Iterator[Collector]:
    c = Collector(tmp_path, store=fresh_postgres_dsn)
    try:
        yield c.start()
    finally:
        c.reap()


def test_on_postgres_runs_are_kept_once_and_outlive_a_collector_sigkill(
    pg_collector: Collector, workers: Workers, client: SyncWorkflowClient, tmp_path: Path
) -> None:
    key = pg_collector.create_key("prod")
    workers.start(env=cloud_env(pg_collector, key, tmp_path))
    runs = submit_open(client, workers, 5, "pg")
    wait_until(lambda: reported(pg_collector, key) >= set(runs), timeout=30,
               what="the Postgres-backed collector to hear of every run")

    pg_collector.kill()
    pg_collector.start()

    _, body = pg_collector.get("/api/runs?workflow=pp_two_steps&status=completed", key)
    mine = sorted(r["run_id"] for r in body["runs"] if r["run_id"] in runs)
    assert mine == sorted(runs)  # each once, and still there after the restart
    assert {r["environment"] for r in body["runs"]} == {"prod"}
    event = {"id": f"{runs[0]}:999", "run_id": runs[0], "workflow": "pp_two_steps",
             "seq": 999, "type": "step:completed", "ts": 1.0}
    for expected in (1, 0):  # a resend of the same id is applied once
        code, answer = pg_collector.post("/api/ingest", key,
                                         {"source": {}, "events": [event]})
        assert code == 200 and answer["applied"] == expected
    _, fleets = pg_collector.get("/api/fleets", key)
    assert len([w for f in fleets["fleets"] for w in f["workers"]]) == 1


def test_the_dashboard_asks_for_a_key_then_shows_fleets_and_runs_in_a_browser(
    tmp_path: Path, workers: Workers, client: SyncWorkflowClient
) -> None:
    skip_without_browser()
    collector = Collector(tmp_path).start()
    try:
        key = collector.create_key("staging")
        workers.start(env=cloud_env(collector, key, tmp_path))
        runs = submit_open(client, workers, 3, "browser")
        wait_until(lambda: reported(collector, key) >= set(runs), timeout=30,
                   what="the runs to be reported")
        with browser_page() as watched:
            page = watched.page
            page.goto(collector.url + "/")
            assert page.locator("input[name=key]").count() == 1
            page.fill("input[name=key]", "pyr_staging_" + "0" * 32)
            page.click("text=open")
            page.wait_for_selector("text=That key is not known here.")

            page.fill("input[name=key]", key)
            page.click("text=open")
            page.wait_for_selector("h2:has-text('Fleets')")
            text = page.inner_text("body")
            for run_id in runs:
                assert run_id in text
            assert "staging" in text and "No fleet has reported yet." not in text

            page.goto(collector.url + "/")  # the key is kept in a cookie
            page.fill("input[name=status]", "failed")
            page.click("text=filter")
            page.wait_for_selector("text=No run matches.")
            assert not any(run_id in page.inner_text("body") for run_id in runs)
            refused = "status of 401"  # the wrong key's page: answered 401 on purpose
            assert [e for e in watched.errors if refused not in e] == []
            watched.shot(tmp_path / "collector.png")
    finally:
        collector.reap()
