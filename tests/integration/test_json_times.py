"""Every instant in a JSON document a user reads is written one way: ISO-8601 UTC with
milliseconds and ``Z`` (``2026-12-01T22:58:21.123Z``), by ``pyrula.timestamps``. The CLI's
``--json`` outputs, ``RunRouter``'s answers, the dashboard's routes and ``--log-format
json`` lines, each in process (a run executed inline, the CLI through click's runner over
an SQLite file); the journal as stored keeps its float ``ts``."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import httpx
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.routing import Mount

from pyrula.cli.main import cli
from pyrula.logs import JsonFormatter
from pyrula.timestamps import epoch_of, iso_utc, readable_event
from pyrula.workflows import (
    InlineWorkflowRunner,
    MemoryStore,
    SQLiteStore,
    WorkflowContext,
    step,
    workflow,
)
from pyrula.workflows.http import OPENAPI, RunRouter

ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
RUN_TIMES = ("created_at", "updated_at", "started_at", "finished_at")


@step(name="times.sleepy_step")
def sleepy_step() -> int:
    return 1


@workflow(name="times.naps")
async def naps(ctx: WorkflowContext, params: Any) -> int:
    value: int = await sleepy_step()
    return value


def _iso(value: Any) -> bool:
    return isinstance(value, str) and ISO.fullmatch(value) is not None


def _assert_run_times(run: dict[str, Any]) -> None:
    for key in RUN_TIMES:
        assert _iso(run[key]), (key, run[key])
    assert run.get("wake_at") is None


def _assert_event_times(events: list[dict[str, Any]]) -> None:
    assert events
    for event in events:
        assert _iso(event["ts"]), event


async def _finished_run(store: Any) -> str:
    runner = InlineWorkflowRunner(store=store)
    handle = await runner.client.submit("times.naps", {})
    await runner.run(handle.name, handle.run_id)
    return handle.run_id


def test_the_helper_writes_milliseconds_and_z() -> None:
    assert iso_utc(0.0) == "1970-01-01T00:00:00.000Z"
    assert iso_utc(1796165901.1239) == "2026-12-01T22:58:21.123Z"
    assert epoch_of(iso_utc(1796165901.5)) == 1796165901.5
    shown = readable_event({"seq": 3, "type": "run:sleeping", "ts": 60.25, "wake_at": 120.0,
                            "call": 2})
    assert shown == {"seq": 3, "type": "run:sleeping", "ts": "1970-01-01T00:01:00.250Z",
                     "wake_at": "1970-01-01T00:02:00.000Z", "call": 2}


async def test_run_router_answers_iso_times_and_the_journal_keeps_floats() -> None:
    store = MemoryStore()
    run_id = await _finished_run(store)
    app = Starlette(routes=[Mount("/runs", RunRouter(store, dashboard=False))])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as http:
        _assert_run_times((await http.get(f"/runs/{run_id}")).json())
        (listed,) = (await http.get("/runs/")).json()["runs"]
        _assert_run_times(listed)
        _assert_event_times((await http.get(f"/runs/{run_id}/events")).json()["events"])
    assert all(isinstance(e["ts"], float) for e in await store.read_events(run_id))
    schemas = OPENAPI["components"]["schemas"]
    assert schemas["Run"]["properties"]["created_at"]["format"] == "date-time"
    assert schemas["Event"]["properties"]["ts"]["format"] == "date-time"


async def test_the_dashboard_answers_iso_times() -> None:
    store = MemoryStore()
    run_id = await _finished_run(store)
    app = Starlette(routes=[Mount("/runs", RunRouter(store))])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as http:
        (row,) = (await http.get("/runs/dashboard/api/runs")).json()["runs"]
        _assert_run_times(row)
        shown = (await http.get(f"/runs/dashboard/api/runs/{run_id}")).json()
        _assert_run_times(shown)
        attempt, step_entry = shown["timeline"]
        assert _iso(attempt["start"]) and attempt["start"] == attempt["at"]
        assert _iso(step_entry["start"]) and _iso(step_entry["end"])
        assert step_entry["seconds"] is not None


def _cli_json(db: Path, *args: str) -> Any:
    done = CliRunner().invoke(cli, [*args, "--store", f"sqlite:///{db}"],
                              catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def test_the_cli_prints_iso_times_in_every_json_output(tmp_path: Path) -> None:
    import asyncio

    db = tmp_path / "times.db"
    store = SQLiteStore(str(db))
    try:
        run_id = asyncio.run(_finished_run(store))
    finally:
        store.close()
    (listed,) = _cli_json(db, "runs", "list", "--json")
    _assert_run_times(listed)
    _assert_run_times(_cli_json(db, "runs", "show", run_id, "--json"))
    _assert_run_times(_cli_json(db, "get", run_id))
    _assert_event_times(_cli_json(db, "runs", "events", run_id, "--json"))
    _assert_event_times(_cli_json(db, "events", run_id))
    _cli_json(db, "submit", "times.nobody_serves", "{}")
    stuck = _cli_json(db, "runs", "stuck", "--json")
    assert stuck and all(_iso(row["updated_at"]) for row in stuck), stuck
    _cli_json(db, "schedules", "create", "times.naps", "--every", "60", "--json")
    (sched,) = _cli_json(db, "schedules", "list", "--json")
    assert _iso(sched["created_at"]) and _iso(sched["next_run_at"]), sched


def test_a_json_log_line_says_its_time_in_iso() -> None:
    record = logging.makeLogRecord({"name": "pyrula.t", "levelname": "INFO", "levelno": 20,
                                    "msg": "hello: there", "created": 1796165901.1239})
    line = json.loads(JsonFormatter().format(record))
    assert line["ts"] == "2026-12-01T22:58:21.123Z"
