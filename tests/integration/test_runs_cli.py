"""``pyrula runs`` (and its flat aliases) as a user runs it: real ``python -m pyrula.cli``
processes over an SQLite file, with one real worker process (per test module and xdist
process) where a run must finish. Every user mistake is one line on stderr, exit 1 or 2,
never a traceback."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunStatus, SQLiteStore, SyncWorkflowClient
from tests.conftest import wait_until
from tests.integration.workerprocs import WorkerProcess, child_env

APP = textwrap.dedent(
    '''
    """The workflows of the ``pyrula runs`` tests."""

    from pyrula.workflows import step, workflow


    @step
    def double(x: int) -> int:
        return 2 * x


    @step
    def explode(x: int) -> int:
        raise RuntimeError(f"boom {x}")


    @workflow(name="rc_ok")
    async def ok(ctx, params):
        return {"doubled": await double(await double(params["x"]))}


    @workflow(name="rc_fail")
    async def fail(ctx, params):
        return await explode(params["x"])


    @workflow(name="rc_wait")
    async def wait(ctx, params):
        return {"got": await ctx.wait_for_signal("approved")}


    @workflow(name="rc_ask")
    async def ask(ctx, params):
        return {"answer": await ctx.interrupt({"question": "ok?"})}


    @workflow(name="rc_bulk")
    async def bulk(ctx, params):
        got = await double(params["x"])
        if params.get("wait"):
            await ctx.wait_for_signal("go")
        if params.get("fail"):
            raise ValueError(f"bulk {got}")
        return got


    @workflow(name="rc_patched")
    async def patched(ctx, params):
        return {"new": ctx.patched("fix-tax"), "doubled": await double(params["x"])}


    @workflow(name="rc_cart")
    async def cart(ctx, params):
        items = []

        def add(item):
            if not item:
                raise ValueError("an item has a name")
            items.append(item)
            return len(items)

        ctx.set_query_handler("items", lambda: items)
        ctx.set_query_handler("has", lambda item: item in items)
        ctx.set_update_handler("add", add)
        await ctx.wait_for_signal("checkout")
        return items
    '''
)


class Cli:
    """Runs ``pyrula`` commands in one directory over its SQLite file."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.url = f"sqlite:///{directory / 'store.db'}"

    def __call__(self, *args: str, store: bool = True) -> subprocess.CompletedProcess[str]:
        extra = ["--store", self.url] if store else []
        return subprocess.run([sys.executable, "-m", "pyrula.cli", *args, *extra],
                              cwd=self.directory, env=child_env(), capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)

    def ok(self, *args: str) -> str:
        proc = self(*args)
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        return proc.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args))

    def submit(self, name: str, params: Any) -> str:
        run_id: str = self.json("runs", "submit", name, json.dumps(params))["run_id"]
        return run_id

    def status(self, run_id: str) -> str:
        """Read in this process: a poll must not start a process each time."""
        store = SQLiteStore(str(self.directory / "store.db"))
        try:
            return SyncWorkflowClient(store).get(run_id).status.value
        finally:
            store.close()


def _refused(proc: subprocess.CompletedProcess[str], code: int, says: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert says in lines[0], lines[0]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    """A directory with the app and one worker serving it."""
    directory = tmp_path_factory.mktemp("runs-cli")
    (directory / "rcapp.py").write_text(APP)
    cli = Cli(directory)
    worker = WorkerProcess(directory, "worker", [
        "worker", "--app", "rcapp", "--store", cli.url, "--no-cloud",
        "--claim-poll-interval", "0.1",
    ], child_env())
    try:
        worker.wait_for_log("worker_started", timeout=30)
        yield cli
    finally:
        worker.reap()


def create_store(path: Path) -> None:
    """An empty store at ``path``, as a worker or a fleet creates it."""
    store = SQLiteStore(str(path))
    try:
        SyncWorkflowClient(store).list_runs(limit=1)
    finally:
        store.close()


@pytest.fixture
def empty(tmp_path: Path) -> Cli:
    create_store(tmp_path / "store.db")
    return Cli(tmp_path)


# --- user mistakes -------------------------------------------------------------------

MISTAKES = [
    (["runs", "list", "--status", "bogus"], 2, "use one of: queued, running"),
    (["runs", "--status", "bogus"], 2, "use one of: queued, running"),
    (["runs", "signal", "0" * 32, "approved", "yes please"], 2, "PAYLOAD_JSON is not JSON"),
    (["signal", "0" * 32, "approved", "yes please"], 2, "PAYLOAD_JSON is not JSON"),
    (["runs", "resume", "0" * 32, "{bad"], 2, "VALUE_JSON is not JSON"),
    (["runs", "submit", "rc_ok", "{bad"], 2, "PARAMS_JSON is not JSON"),
    (["runs", "update", "0" * 32, "add", "{bad"], 2, "PAYLOAD_JSON is not JSON"),
    (["runs", "query", "0" * 32, "items", "{bad"], 2, "ARGS_JSON is not JSON"),
    (["runs", "query", "0" * 32, "items"], 1, "no run with id"),
    (["runs", "update", "0" * 32, "add", "1"], 1, "no run with id"),
    (["runs", "show", "0" * 32], 1, "no run with id"),
    (["runs", "result", "0" * 32], 1, "no run with id"),
    (["runs", "cancel", "0" * 32], 1, "no run with id"),
    (["runs", "retry", "0" * 32], 1, "no run with id"),
    (["runs", "events", "0" * 32], 1, "no run with id"),
    (["get", "0" * 32], 1, "no run with id"),
    (["runs", "list", "--limit", "0"], 2, "Invalid value for '--limit'"),
    (["runs", "nosuch"], 2, "No such command 'nosuch'"),
    (["runs", "result", "0" * 32, "--timeout", "soon"], 2, "runs result --help')"),
    (["emit", "", "{}"], 2, "a topic must be a non-empty str"),
    (["emit", "orders", "{bad"], 2, "the payload is not JSON"),
    (["emit", "orders"], 2, "Missing argument 'JSON'"),
    (["emit", "orders", "1", "--key", ""], 2, "key must be a non-empty str"),
]


@pytest.mark.parametrize(("args", "code", "says"), MISTAKES)
def test_a_mistake_is_one_line_and_its_exit_code(
    empty: Cli, args: list[str], code: int, says: str
) -> None:
    _refused(empty(*args), code, says)


@pytest.mark.parametrize("command", [["runs", "submit"], ["submit"]])
def test_submit_to_a_private_memory_store_is_refused(empty: Cli, command: list[str]) -> None:
    proc = empty(*command, "rc_ok", "{}", "--store", "memory://", store=False)
    _refused(proc, 2, "--store memory://: a memory store is private to one process")


# --- the wrong directory ---------------------------------------------------------------

#: Every command that reads, or acts on, what a fleet keeps in its store (none creates one).
ON_A_STORE = [
    ["runs"], ["runs", "list"], ["runs", "show", "0" * 32], ["runs", "events", "0" * 32],
    ["runs", "result", "0" * 32], ["runs", "cancel", "0" * 32], ["runs", "retry", "0" * 32],
    ["runs", "signal", "0" * 32, "go"], ["runs", "resume", "0" * 32], ["runs", "stuck"],
    ["runs", "submit", "rc_ok"], ["submit", "rc_ok"], ["get", "0" * 32],
    ["result", "0" * 32], ["events", "0" * 32], ["signal", "0" * 32, "go"],
    ["cancel", "0" * 32], ["emit", "orders", "{}"], ["schedules", "list"],
    ["schedules", "delete", "s"],
    ["schedules", "pause", "s"], ["schedules", "resume", "s"], ["schedules", "run-now", "s"],
    ["schedules", "create", "rc_ok", "--every", "60"], ["db", "check", "--postgres-dsn", "postgresql://127.0.0.1:1/x"],
]


@pytest.mark.parametrize("args", ON_A_STORE, ids=" ".join)
def test_a_command_where_there_is_no_store_is_refused_and_creates_none(
    tmp_path: Path, args: list[str]
) -> None:
    # The default store (sqlite:///pyrula.db) from a directory that has none: opening it
    # would create an empty one and answer from it, or leave a run where no worker looks.
    proc = Cli(tmp_path)(*args, store=False)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stderr.splitlines() == [
        f"error: no store at {tmp_path / 'pyrula.db'}: run where your fleet runs, or set "
        "PYRULA_STORE_URL"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["runs", "list"], ["runs", "show", "0" * 32],
                                  ["schedules", "list"], ["result", "0" * 32]], ids=" ".join)
def test_a_memory_store_is_refused_by_every_command_on_a_store(
    tmp_path: Path, args: list[str]
) -> None:
    proc = Cli(tmp_path)(*args, "--store", "memory://", store=False)
    _refused(proc, 2, "--store memory://: a memory store is private to one process, empty "
             "in this one")


def test_a_timeout_on_a_run_still_going_is_one_line(empty: Cli) -> None:
    run_id = empty.submit("rc_ok", {"x": 1})
    for command in (["runs", "result"], ["result"]):
        _refused(empty(*command, run_id, "--timeout", "0.5"), 1,
                 f"run {run_id} has not ended after 0.5 s; try a longer --timeout")


def test_a_submit_no_live_worker_serves_warns_and_succeeds(empty: Cli) -> None:
    for command in (["runs", "submit"], ["submit"]):
        proc = empty(*command, "rc_nobody", '{"x": 1}', "--owner", "acme")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["name"] == "rc_nobody"
        assert proc.stderr.strip() == ("warning: no live worker serves 'rc_nobody' yet; "
                                       "the run waits until one does")


def test_emit_prints_the_event_id_once_per_key(empty: Cli) -> None:
    first = empty.ok("emit", "orders", '{"n": 1}', "--key", "k-1").strip()
    assert re.fullmatch(r"[0-9a-f]{32}", first)
    assert empty.ok("emit", "orders", '{"n": 2}', "--key", "k-1").strip() == first
    other = empty.ok("emit", "orders", "[1, 2]", "--owner", "acme").strip()
    assert other != first


# --- listing -------------------------------------------------------------------------

def test_list_shows_a_table_and_json_and_the_bare_form_still_lists(empty: Cli) -> None:
    first = empty.submit("rc_ok", {"x": 1})
    second = json.loads(empty("runs", "submit", "rc_fail", '{"x": 2}', "--owner",
                              "acme").stdout)["run_id"]
    table = empty.ok("runs", "list").splitlines()
    assert table[0].split()[:3] == ["RUN", "ID", "WORKFLOW"]
    row = table[1].split()  # newest first
    assert row[:5] == [second, "rc_fail", "queued", "0", "acme"]
    assert row[5].endswith("Z") and row[5].startswith(time.strftime("%Y-", time.gmtime()))
    listed = empty.json("runs", "list", "--json", "--workflow", "rc_ok")
    assert [r["run_id"] for r in listed] == [first]
    assert empty.json("runs", "list", "--json", "--owner", "acme")[0]["run_id"] == second
    assert empty.json("runs", "list", "--json", "--status", "completed") == []
    assert len(empty.json("runs", "list", "--json", "--limit", "1")) == 1
    bare = empty.ok("runs", "--limit", "5").splitlines()
    assert bare[0].split()[:4] == [second, "rc_fail", "queued", "attempt=0"]
    assert bare[1].split()[:2] == [first, "rc_ok"]
    assert empty.ok("runs", "--name", "rc_ok").split()[0] == first


# --- runs that a worker finishes ------------------------------------------------------

def test_submit_result_show_and_events(served: Cli) -> None:
    proc = served("runs", "submit", "rc_ok", '{"x": 3}')
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr  # a worker serves it
    run_id = json.loads(proc.stdout)["run_id"]
    assert json.loads(served.ok("runs", "result", run_id, "--timeout", "20")) == {"doubled": 12}
    assert json.loads(served.ok("result", run_id, "--timeout", "20")) == {"doubled": 12}
    shown = served.ok("runs", "show", run_id)
    assert "status:      completed" in shown and '{"doubled": 12}' in shown
    assert "attempt 1 on " in shown
    assert shown.count("step double") == 2 and "completed, 1 try" in shown
    data = served.json("runs", "show", run_id, "--json")
    assert data["status"] == "completed" and data["retries"] is None
    steps = [e for e in data["timeline"] if e["kind"] == "step"]
    assert [(s["name"], s["outcome"], s["attempts"]) for s in steps] == [
        ("double", "completed", 1), ("double", "completed", 1)]
    got = served.json("get", run_id)
    assert got["result"] == {"doubled": 12}
    # timestamps read as times, not epoch floats
    for key in ("created_at", "started_at", "finished_at"):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", got[key]), got
    assert got["created_at"] <= got["started_at"] <= got["finished_at"]
    assert got["wake_at"] is None
    journal = served.json("runs", "events", run_id)
    assert journal == served.json("events", run_id)
    assert journal[-1]["type"] == "run:completed"


def test_query_and_update_a_waiting_run(served: Cli) -> None:
    run_id = served.submit("rc_cart", {})
    wait_until(lambda: served.status(run_id) == "waiting", timeout=20)
    assert served.json("runs", "update", run_id, "add", '"pen"', "--timeout", "20") == 1
    assert served.json("runs", "query", run_id, "items", "--app", "rcapp") == ["pen"]
    assert served.json("runs", "query", run_id, "has", '["pen"]', "--app", "rcapp") is True
    _refused(served("runs", "update", run_id, "add", '""', "--timeout", "20"), 1,
             "ValueError: an item has a name")
    _refused(served("runs", "query", run_id, "nope", "--app", "rcapp"), 1,
             "no query handler named 'nope'")
    _refused(served("runs", "query", run_id, "items"), 1, "--app")
    served.ok("runs", "signal", run_id, "checkout")
    assert served.json("runs", "result", run_id, "--timeout", "20") == ["pen"]
    _refused(served("runs", "update", run_id, "add", '"ink"'), 1, "has already ended")


def test_show_names_the_patches_a_run_took(served: Cli) -> None:
    run_id = json.loads(served.ok("runs", "submit", "rc_patched", '{"x": 1}'))["run_id"]
    assert json.loads(served.ok("runs", "result", run_id, "--timeout", "20"))["new"] is True
    shown = served.ok("runs", "show", run_id)
    assert re.search(r"Z  patch fix-tax applied \(call 1\)\n.*step double \(call 2\)", shown)
    data = served.json("runs", "show", run_id, "--json")
    assert [e for e in data["timeline"] if e["kind"] == "patch"] == [
        {"kind": "patch", "patch": "fix-tax", "call": 1, "at": data["timeline"][1]["at"]}]
    assert [e["type"] for e in served.json("runs", "events", run_id)][2] == "patch:applied"


def test_fork_reuses_the_steps_before_the_one_named(served: Cli) -> None:
    run_id = json.loads(served.ok("runs", "submit", "rc_ok", '{"x": 3}'))["run_id"]
    assert json.loads(served.ok("runs", "result", run_id, "--timeout", "20")) == {"doubled": 12}

    forked = served.json("runs", "fork", run_id, "--from-step", "2", "--params", '{"x": 5}',
                         "--json")
    assert (forked["forks"], forked["from_step"], forked["workflow"]) == (run_id, 2, "rc_ok")
    # the first double (3 -> 6) is reused, the second runs on the new params' run: 6 -> 12
    assert json.loads(served.ok("runs", "result", forked["run_id"], "--timeout", "20")) == \
        {"doubled": 12}
    again = served.ok("runs", "fork", run_id, "--from-step", "double", "--params", '{"x": 5}')
    assert re.fullmatch(rf"run \S+ forks run {run_id} from step double\n", again)
    new_id = again.split()[1]
    assert json.loads(served.ok("runs", "result", new_id, "--timeout", "20")) == {"doubled": 20}
    shown = served.ok("runs", "show", forked["run_id"])
    assert f"forked from run {run_id} at step double (call 2), reusing 1 step call(s)" in shown


def test_fork_names_what_it_cannot_fork(served: Cli) -> None:
    run_id = json.loads(served.ok("runs", "submit", "rc_ok", '{"x": 1}'))["run_id"]
    served.ok("runs", "result", run_id, "--timeout", "20")
    _refused(served("runs", "fork", run_id, "--from-step", "triple"), 1,
             f"error: run {run_id} never called a step named 'triple' (its steps: double)")
    _refused(served("runs", "fork", run_id, "--from-step", "3"), 1,
             "made 2 step call(s); from_step 3 is not a position among them (1..2)")
    _refused(served("runs", "fork", "nope", "--from-step", "1"), 1, "no run with id 'nope'")
    _refused(served("runs", "fork", run_id, "--from-step", "1", "--params", "{x"), 2,
             "error: --params is not JSON")


def _now_iso() -> str:
    """An instant just before the runs a test submits (``--since``: only those)."""
    return datetime.fromtimestamp(time.time() - 0.001, UTC).isoformat().replace("+00:00", "Z")


def test_bulk_retry_selects_by_workflow_status_since_and_error_type(served: Cli) -> None:
    since = _now_iso()
    failing = [served.submit("rc_bulk", {"x": x, "fail": True}) for x in (1, 2)]
    done = served.submit("rc_bulk", {"x": 3})
    for run_id in failing:
        _refused(served("runs", "result", run_id, "--timeout", "20"), 1, "ValueError")
    served.ok("runs", "result", done, "--timeout", "20")
    select = ["--workflow", "rc_bulk", "--since", since]

    listed = served.ok("runs", "retry", *select, "--status", "failed", "--error-type",
                       "ValueError", "--dry-run")
    assert sorted(re.findall(r"would retry run (\S+) \(failed, created ", listed)) == \
        sorted(failing)
    assert listed.endswith("2 run(s) selected; dry run: nothing done\n")
    for narrower in (["--error-type", "KeyError"], ["--since", "2999-01-01T00:00:00Z"]):
        assert served.json("runs", "retry", *select, "--status", "failed", *narrower,
                           "--dry-run", "--json")["selected"] == 0
    assert len(served.json("runs", "list", "--workflow", "rc_bulk", "--json")) >= 3

    retried = served.json("runs", "retry", *select, "--status", "failed", "--json")
    assert (retried["selected"], retried["refused"]) == (2, 0)
    assert sorted(row["run_id"] for row in retried["runs"]) == sorted(failing)
    for row in retried["runs"]:
        assert served.json("get", row["new_run_id"])["idempotency_key"] == \
            f"retry:{row['run_id']}"
    refused = served("runs", "retry", *select, "--status", "completed")
    assert refused.returncode == 1, refused
    assert f"run {done}: refused: run {done} is completed, not failed" in refused.stdout
    assert refused.stderr == "error: retried: 0 of 1 selected run(s), 1 refused\n"


def test_bulk_cancel_and_fork(served: Cli) -> None:
    since = _now_iso()
    waiting = [served.submit("rc_bulk", {"x": x, "wait": True}) for x in (1, 2)]
    done = served.submit("rc_bulk", {"x": 4})
    served.ok("runs", "result", done, "--timeout", "20")
    wait_until(lambda: all(served.json("get", r)["status"] == "waiting" for r in waiting), 20,
               what="both runs waiting")
    select = ["--workflow", "rc_bulk", "--since", since]

    cancelled = served.ok("runs", "cancel", *select, "--status", "waiting")
    assert sorted(re.findall(r"run (\S+): cancelled\n", cancelled)) == sorted(waiting)
    assert cancelled.endswith("cancelled: 2 of 2 selected run(s), 0 refused\n")
    forked = served.json("runs", "fork", *select, "--status", "completed", "--from-step", "1",
                         "--params", '{"x": 10}', "--json")
    assert [row["run_id"] for row in forked["runs"]] == [done]
    fork_id = forked["runs"][0]["new_run_id"]
    assert json.loads(served.ok("runs", "result", fork_id, "--timeout", "20")) == 20


@pytest.mark.parametrize(("args", "says"), [
    (["runs", "retry"], "give a RUN_ID, or --workflow and --status to select runs"),
    (["runs", "cancel", "--workflow", "rc_bulk"], "give a RUN_ID, or --workflow and --status"),
    (["runs", "retry", "r-1", "--status", "failed"], "give RUN_ID or --status, not both"),
    (["runs", "cancel", "r-1", "--dry-run"], "give RUN_ID or --dry-run, not both"),
    (["runs", "retry", "--workflow", "w", "--status", "failed", "--since", "yesterday"],
     "--since 'yesterday' is neither an ISO-8601 instant nor a duration like 90s"),
    (["runs", "fork", "--workflow", "w", "--status", "nope", "--from-step", "1"],
     "--status 'nope' is not a run status"),
])
def test_a_bulk_selection_mistake_is_one_line_exit_2(empty: Cli, args: list[str],
                                                     says: str) -> None:
    _refused(empty(*args), 2, says)


def test_a_failed_run_is_retried_once_from_its_params(served: Cli) -> None:
    run_id = json.loads(served.ok("submit", "rc_fail", '{"x": 7}', "--owner", "acme"))["run_id"]
    proc = served("runs", "result", run_id, "--timeout", "20")
    _refused(proc, 1, f"run {run_id} failed: ")
    assert "boom 7" in proc.stderr
    assert "error:" in served.ok("runs", "show", run_id)
    said = served.ok("runs", "retry", run_id).split()
    assert said[2:] == ["retries", "run", run_id]
    again = served.json("runs", "retry", run_id, "--json")
    assert again == {"run_id": said[1], "workflow": "rc_fail", "retries": run_id}
    retry = served.json("runs", "show", said[1], "--json")
    assert retry["retries"] == run_id and retry["owner"] == "acme"
    assert retry["params"] == {"x": 7}
    assert f"retries:     {run_id}" in served.ok("runs", "show", said[1])
    ok_id = served.submit("rc_ok", {"x": 1})
    served.ok("runs", "result", ok_id, "--timeout", "20")
    _refused(served("runs", "retry", ok_id), 1, "is completed, not failed")


def test_signal_resume_and_cancel(served: Cli) -> None:
    waiting = served.submit("rc_wait", {})
    wait_until(lambda: served.status(waiting) == "waiting", 20, what="a waiting run")
    assert "waiting for signal 'approved'" in served.ok("runs", "show", waiting)
    _refused(served("runs", "result", waiting, "--timeout", "0.2"), 1, "has not ended")
    assert served.ok("runs", "signal", waiting, "approved", '"yes"').strip() == (
        f"signal 'approved' sent to run {waiting}")
    assert json.loads(served.ok("runs", "result", waiting, "--timeout", "20")) == {"got": "yes"}

    asking = served.submit("rc_ask", {})
    wait_until(lambda: served.status(asking) == "waiting", 20, what="an interrupted run")
    assert 'asks:        {"question": "ok?"}' in served.ok("runs", "show", asking)
    assert served.ok("runs", "resume", asking, '{"sure": true}').strip() == (
        f"run {asking} resumed")
    answer = json.loads(served.ok("runs", "result", asking, "--timeout", "20"))
    assert answer == {"answer": {"sure": True}}

    for command, ended in ((["runs", "cancel"], "had already ended"), (["cancel"], None)):
        run_id = served.submit("rc_wait", {})
        out = served.ok(*command, run_id)
        if ended is None:
            assert json.loads(out) == {"cancelled": True}
        else:
            assert out.strip() == f"run {run_id} cancelled"
            assert served.ok(*command, run_id).strip() == f"run {run_id} {ended}; nothing to cancel"
        _refused(served("runs", "result", run_id, "--timeout", "5"), 1, "was cancelled")
    assert served.json("runs", "cancel", waiting, "--json") == {"run_id": waiting,
                                                                "cancelled": False}


# --- stuck runs ----------------------------------------------------------------------

def test_stuck_lists_unserved_stranded_and_quarantined_runs(empty: Cli) -> None:
    assert empty.ok("runs", "stuck").strip() == "no stuck runs"
    queued = empty.submit("rc_nobody", {})
    gone = empty.submit("rc_gone", {})
    crashed = empty.submit("rc_crashy", {})
    store = SQLiteStore(str(empty.directory / "store.db"))
    try:
        client = SyncWorkflowClient(store)
        for name, code in (("rc_gone", "stranded"), ("rc_crashy", "max_retries")):
            error = {"code": code, "error_type": "X", "message": "m", "detail": None}
            asyncio.run(store.fail_stranded(name, older_than=time.time() + 1,
                                            now=time.time(), limit=10, error=error))
        assert client.get(gone).status is RunStatus.FAILED
    finally:
        store.close()
    rows = {row["run_id"]: row for row in empty.json("runs", "stuck", "--json")}
    assert set(rows) == {queued, gone, crashed}
    assert rows[queued]["why"] == "queued: no live worker serves 'rc_nobody'"
    assert rows[gone]["why"].startswith("failed: no live worker")
    assert rows[crashed]["why"].startswith("quarantined")
    table = empty.ok("runs", "stuck")
    assert all(run_id in table for run_id in rows)
    # A quarantined run can be retried.
    assert empty.ok("runs", "retry", crashed).split()[2:] == ["retries", "run", crashed]


# --- names and params a newcomer gets wrong ---------------------------------------------


def test_a_mistyped_workflow_name_is_named_with_the_closest_served_one(served: Cli) -> None:
    for command in (["submit"], ["runs", "submit"]):
        proc = served(*command, "rc_okk", '{"x": 1}')
        assert proc.returncode == 0, proc.stderr  # accepted: a worker may serve it later
        [line] = proc.stderr.strip().splitlines()
        assert line.startswith("warning: no worker of this store has ever served workflow "
                               "'rc_okk'; did you mean 'rc_ok'"), line
        assert line.endswith("the run waits until a worker serves it"), line
    proc = served("schedules", "create", "rc_okk", "--cron", "0 2 * * *")
    assert proc.returncode == 0, proc.stderr
    assert "did you mean 'rc_ok'" in proc.stderr, proc.stderr
    proc = served("schedules", "create", "rc_ok", "--cron", "0 3 * * *")
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr


def test_a_submit_without_params_gives_the_workflow_an_empty_object(served: Cli) -> None:
    run_id = served.json("submit", "rc_wait")["run_id"]
    store = SQLiteStore(str(served.directory / "store.db"))
    try:
        assert SyncWorkflowClient(store).get(run_id).params == {}
    finally:
        store.close()


def test_show_prints_a_failed_runs_traceback_as_text(served: Cli) -> None:
    run_id = served.submit("rc_fail", {"x": 4})
    wait_until(lambda: served.status(run_id) == "failed", 30, what="the run failed")
    out = served.ok("runs", "show", run_id)
    assert "traceback:" in out, out
    lines = out[out.index("traceback:"):].splitlines()
    assert any("rcapp.py" in line and "in explode" in line for line in lines), out
    assert any(line.strip() == 'raise RuntimeError(f"boom {x}")' for line in lines), out
    assert lines[-1].strip() == "RuntimeError: boom 4", out
