"""A run's priority where people see and set it: the CLI's submit flag and ``runs show``,
the dashboard's run record."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from pyrula.cli.main import cli
from pyrula.dashboard.data import run_row
from pyrula.workflows import SQLiteStore, SyncWorkflowClient


def _store(tmp_path: Path) -> str:
    SQLiteStore(tmp_path / "store.db").close()
    return f"sqlite:///{tmp_path / 'store.db'}"


def test_pyrula_submit_takes_priority_and_runs_show_prints_it(tmp_path: Path) -> None:
    url = _store(tmp_path)
    runner = CliRunner()
    done = runner.invoke(cli, ["submit", "wf", "{}", "--priority", "7", "--store", url])
    assert done.exit_code == 0, done.output
    run_id = json.loads(done.stdout)["run_id"]
    shown = runner.invoke(cli, ["runs", "show", run_id, "--store", url])
    assert [line.split() for line in shown.stdout.splitlines()
            if line.strip().startswith("priority")] == [["priority:", "7"]]
    got = runner.invoke(cli, ["get", run_id, "--store", url])
    assert json.loads(got.stdout)["priority"] == 7
    plain = runner.invoke(cli, ["runs", "submit", "wf", "--store", url])
    assert json.loads(plain.stdout)["run_id"]


def test_a_priority_outside_0_to_9_is_a_usage_error_and_submits_nothing(
    tmp_path: Path,
) -> None:
    url = _store(tmp_path)
    done = CliRunner().invoke(cli, ["submit", "wf", "--priority", "10", "--store", url])
    assert done.exit_code == 2 and "--priority" in done.output
    client = SyncWorkflowClient(SQLiteStore(tmp_path / "store.db"))
    assert list(client.list_runs(limit=5)) == []


def test_the_dashboard_run_record_has_the_priority(tmp_path: Path) -> None:
    client = SyncWorkflowClient(SQLiteStore(tmp_path / "store.db"))
    handle = client.submit("wf", {}, priority=4)
    assert run_row(client.get(handle.run_id))["priority"] == 4
