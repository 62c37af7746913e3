"""``pyrula schedules`` as a user runs it: real subprocesses over a SQLite store file."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunStatus, SQLiteStore, SyncWorkflowClient
from tests.integration.workerprocs import STORE_FILE, STORE_URL, child_env


def pyrula(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m pyrula.cli ARGS --store <the test's file>``, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "pyrula.cli", *args, "--store", STORE_URL],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=60,
        check=False,
    )


def ok_json(tmp_path: Path, *args: str) -> Any:
    done = pyrula(tmp_path, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def refused(done: subprocess.CompletedProcess[str], code: int, *named: str) -> None:
    """Exit ``code``, one line on stderr naming each of ``named``, no traceback."""
    assert done.returncode == code, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for word in named:
        assert word in lines[0], lines[0]


@pytest.fixture(autouse=True)
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    """The store, created as a worker or a fleet creates it (the commands refuse to)."""
    opened = SQLiteStore(tmp_path / STORE_FILE)
    SyncWorkflowClient(opened).list_runs(limit=1)
    try:
        yield opened
    finally:
        opened.close()


NIGHTLY = ("schedules", "create", "nightly_report", "--cron", "0 2 * * *",
           "--params", '{"window": "24h"}', "--timezone", "Europe/Berlin")


def test_create_twice_makes_one_schedule_and_list_shows_it(
    tmp_path: Path, store: SQLiteStore
) -> None:
    first = ok_json(tmp_path, *NIGHTLY)
    # The same schedule again (params spelled differently: compared as JSON): replaced.
    again = ok_json(tmp_path, *NIGHTLY[:5], "--params", '{ "window":"24h" }',
                    *NIGHTLY[7:], "--overlap", "allow")
    assert first["replaced"] is False and again["replaced"] is True
    assert again["schedule_id"] == first["schedule_id"]
    assert [s.schedule_id for s in store.schedule_list()] == [first["schedule_id"]]
    assert store.schedule_get(first["schedule_id"]).overlap == "allow"  # type: ignore[union-attr]

    listed = ok_json(tmp_path, "schedules", "list")
    assert [s["schedule_id"] for s in listed] == [first["schedule_id"]]
    row = listed[0]
    assert row["workflow"] == "nightly_report" and row["cron"] == "0 2 * * *"
    assert row["every"] is None and row["params"] == {"window": "24h"}
    assert row["timezone"] == "Europe/Berlin" and row["paused"] is False
    assert row["next_run_at"].endswith("Z") and row["last_run_id"] is None

    one = ok_json(tmp_path, "schedules", "list", first["schedule_id"])
    assert one["schedule_id"] == first["schedule_id"]

    table = pyrula(tmp_path, "schedules", "list")
    assert table.returncode == 0, table.stderr
    heading, line = table.stdout.splitlines()
    for column in ("ID", "WORKFLOW", "CRON/EVERY", "TIMEZONE", "NEXT RUN", "PAUSED",
                   "LAST RUN"):
        assert column in heading
    assert first["schedule_id"] in line and "0 2 * * *" in line and "Europe/Berlin" in line


def test_different_params_or_interval_make_another_schedule(tmp_path: Path) -> None:
    cron = ok_json(tmp_path, *NIGHTLY)
    other = ok_json(tmp_path, *NIGHTLY[:5], "--params", '{"window": "1h"}', *NIGHTLY[7:])
    every = ok_json(tmp_path, "schedules", "create", "nightly_report", "--every", "300")
    assert len({cron["schedule_id"], other["schedule_id"], every["schedule_id"]}) == 3
    assert every["every"] == 300 and every["cron"] is None and every["timezone"] == "UTC"
    assert len(ok_json(tmp_path, "schedules", "list")) == 3


def test_pause_resume_run_now_delete(tmp_path: Path, store: SQLiteStore) -> None:
    sid = ok_json(tmp_path, "schedules", "create", "sync_accounts", "--every", "600",
                  "--catchup-window", "120")["schedule_id"]

    assert ok_json(tmp_path, "schedules", "pause", sid) == {"schedule_id": sid, "paused": True}
    assert store.schedule_get(sid).paused  # type: ignore[union-attr]
    assert ok_json(tmp_path, "schedules", "list", sid)["next_run_at"] is None
    resumed = ok_json(tmp_path, "schedules", "resume", sid)
    assert resumed["paused"] is False and resumed["next_run_at"]
    assert not store.schedule_get(sid).paused  # type: ignore[union-attr]

    fired = ok_json(tmp_path, "schedules", "run-now", sid)
    assert fired["schedule_id"] == sid and fired["workflow"] == "sync_accounts"
    info = SyncWorkflowClient(store).get(fired["run_id"])
    assert info.name == "sync_accounts" and info.status == RunStatus.QUEUED
    assert ok_json(tmp_path, "schedules", "list", sid)["last_run_id"] == fired["run_id"]
    shown = pyrula(tmp_path, "schedules", "run-now", sid)
    assert shown.returncode == 0 and shown.stdout.startswith("submitted run ")

    assert ok_json(tmp_path, "schedules", "delete", sid) == {"schedule_id": sid,
                                                              "deleted": True}
    assert store.schedule_list() == []
    assert SyncWorkflowClient(store).get(fired["run_id"]).run_id == fired["run_id"]


@pytest.mark.parametrize("command", ["list", "delete", "pause", "resume", "run-now"])
def test_an_unknown_schedule_id_is_one_line_and_exit_1(tmp_path: Path, command: str) -> None:
    refused(pyrula(tmp_path, "schedules", command, "no-such-schedule"), 1,
            "'no-such-schedule'")


CREATE = ("schedules", "create", "report")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        pytest.param(("--cron", "61 * * * *"), ("--cron",), id="bad-cron"),
        pytest.param(("--cron", "0 0 30 2 *"), ("--cron",), id="cron-never-fires"),
        pytest.param(("--cron", "* * * * *", "--every", "60"), ("--cron", "--every"),
                     id="both"),
        pytest.param((), ("--cron", "--every"), id="neither"),
        pytest.param(("--every", "ten"), ("--every",), id="every-not-a-number"),
        pytest.param(("--every", "30"), ("--every", "60"), id="every-too-short"),
        pytest.param(("--every", "90.5"), ("--every",), id="every-not-whole"),
        pytest.param(("--every", "60", "--params", "{oops"), ("--params",), id="bad-params"),
        pytest.param(("--every", "60", "--params", "NaN"), ("--params",), id="nan-params"),
        pytest.param(("--cron", "@daily", "--timezone", "Mars/Olympus"), ("--timezone",),
                     id="unknown-timezone"),
        pytest.param(("--every", "60", "--catchup-window", "soon"), ("--catchup-window",),
                     id="bad-catchup-window"),
        pytest.param(("--every", "60", "--catchup-window", "10"), ("--catchup-window", "60"),
                     id="catchup-window-too-short"),
    ],
)
def test_a_bad_create_is_one_line_naming_the_flag_and_exit_2(
    tmp_path: Path, store: SQLiteStore, args: tuple[str, ...], named: tuple[str, ...]
) -> None:
    refused(pyrula(tmp_path, *CREATE, *args), 2, *named)
    assert store.schedule_list() == []


def test_an_unknown_overlap_policy_is_a_usage_error(tmp_path: Path) -> None:
    done = pyrula(tmp_path, *CREATE, "--every", "60", "--overlap", "queue")
    assert done.returncode == 2 and "--overlap" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_empty_store_lists_no_schedules(tmp_path: Path) -> None:
    assert ok_json(tmp_path, "schedules", "list") == []
    done = pyrula(tmp_path, "schedules", "list")
    assert done.returncode == 0 and done.stdout.strip() == "no schedules"
