"""`pyrula-fleet bench` end to end: real bench processes starting (or attaching to) real
fleets on the embedded SQLite store and on a real Valkey; its verification, also on runs a
saboteur fleet gets wrong; and the pure parts (percentiles, verification, shard balance,
the progress line, option checks) directly.

Nothing here asserts a speed: only that figures are there and add up.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.cli.bench.config import BenchConfig, BenchError, parse_health_url
from pyrula.cli.bench.expect import Expected, difference, expect_check, sum_check
from pyrula.cli.bench.load import RunRecord
from pyrula.cli.bench.measure import Progress, percentiles, shard_balance, verify
from pyrula.workflows import RunInfo, RunStatus, SQLiteStore, SyncWorkflowClient
from tests.fleet.fleetprocs import Fleets, child_env, ready
from tests.servers import free_port

BENCH = [sys.executable, "-c", "from pyrula.cli.fleet import main; main()", "bench"]


Proc = subprocess.CompletedProcess[str]


def bench(tmp_path: Path, *args: str, timeout: float = 90) -> tuple[Proc, dict[str, Any] | None]:
    """Run ``pyrula-fleet bench *args --json out.json`` in ``tmp_path``: the process and
    the figures it wrote (None if it wrote none)."""
    out = tmp_path / "bench.json"
    out.unlink(missing_ok=True)
    proc = subprocess.run(
        [*BENCH, *args, "--json", str(out)], cwd=tmp_path, env=child_env(),
        capture_output=True, text=True, timeout=timeout,
    )
    figures = json.loads(out.read_text()) if out.exists() else None
    return proc, figures


def assert_ok(proc: Proc, figures: dict[str, Any] | None,
              runs: int) -> dict[str, Any]:
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert figures is not None
    assert figures["verification"] == {
        "ok": True, "runs": runs, "completed": runs, "lost": 0, "failed": 0, "wrong": 0,
        "not_submitted": 0, "examples": {},
    }
    assert "Traceback" not in proc.stderr
    return figures


def shares_add_up(figures: dict[str, Any], runs: int) -> None:
    shares = figures["child_shares"]
    assert shares and sum(s["runs"] for s in shares) == runs
    assert sum(s["percent"] for s in shares) == pytest.approx(100, abs=0.1 * len(shares))
    assert all(isinstance(s["pid"], int) and s["worker_id"] for s in shares)


def latency_reported(figures: dict[str, Any]) -> None:
    for key in ("latency_ms", "run_duration_ms"):
        pct = figures[key]
        assert pct is not None, key
        assert 0 <= pct["p50"] <= pct["p95"] <= pct["p99"] <= pct["max"], pct


# --- the bench's own fleet ----------------------------------------------------------------


def test_fleet_bench_reports_figures(tmp_path: Path) -> None:
    proc, figures = bench(tmp_path, "-n", "2", "--runs", "60", "--steps", "2")
    figures = assert_ok(proc, figures, 60)
    assert figures["runs"] == 60 and figures["steps"] == 2 and figures["children"] == 2
    assert figures["runs_per_s"] > 0 and figures["seconds"] > 0
    assert figures["store"] == "sqlite" and figures["mode"] == "queue"
    for key in ("submit_seconds", "steps_per_s", "run_duration_p50_ms", "run_duration_p99_ms",
                "note"):
        assert figures[key] is not None, key
    latency_reported(figures)
    shares_add_up(figures, 60)
    assert figures["shards"] is None and figures["store_commands_per_run"] is None
    assert "verified       all 60 runs completed with x + 2" in proc.stdout
    assert "latency" in proc.stdout and "child shares" in proc.stdout


def test_concurrency_reports_latency_percentiles_and_child_shares(tmp_path: Path) -> None:
    proc, figures = bench(tmp_path, "-n", "2", "--concurrency", "5", "--runs", "40",
                          "--steps", "2")
    figures = assert_ok(proc, figures, 40)
    assert figures["mode"] == "concurrency" and figures["concurrency"] == 5
    latency_reported(figures)
    shares_add_up(figures, 40)
    # The progress line went to stderr (one line a second when it is not a terminal).
    assert "done 40/40" in proc.stderr and "in flight" in proc.stderr


def test_sync_steps_with_a_payload(tmp_path: Path) -> None:
    store_file = tmp_path / "sync.db"
    proc, figures = bench(tmp_path, "-n", "1", "--runs", "20", "--steps", "2",
                          "--step-kind", "sync", "--payload-bytes", "1000",
                          "--concurrency", "4", "--store", f"sqlite:///{store_file}")
    figures = assert_ok(proc, figures, 20)
    assert figures["step_kind"] == "sync" and figures["payload_bytes"] == 1000
    store = SQLiteStore(store_file)
    try:
        client = SyncWorkflowClient(store)
        runs = list(client.list_runs(name="pyrula.bench"))
        assert len(runs) == 20
        assert all(len(r.params["payload"]) == 1000 and r.params["kind"] == "sync" for r in runs)
        steps = {e.get("step") for e in client.events(runs[0].run_id)
                 if e["type"] == "step:completed"}
        assert steps == {"pyrula.bench.add_one_sync"}
    finally:
        store.close()


def test_kill_every_kills_children_and_every_run_still_completes(tmp_path: Path) -> None:
    # 60 runs at 30/s keep the load going for 2 s: the first kill comes after 1 s.
    proc, figures = bench(tmp_path, "-n", "2", "--rate", "30", "--runs", "60", "--steps", "2",
                          "--kill-every", "1")
    figures = assert_ok(proc, figures, 60)
    assert figures["kills"], proc.stderr
    assert all(isinstance(k["pid"], int) for k in figures["kills"])
    assert figures["runs_retried"] >= 0
    shares_add_up(figures, 60)
    assert "SIGKILLs" in proc.stdout and "kills" in proc.stderr


def test_verify_checks_journals_and_ledger_under_kills(tmp_path: Path) -> None:
    # 300 runs at 100/s keep the load going for 3 s: two kills land while steps run.
    ledger = tmp_path / "ledger"
    proc, figures = bench(tmp_path, "-n", "2", "--rate", "100", "--runs", "300", "--steps",
                          "2", "--kill-every", "1", "--verify", "--ledger", str(ledger))
    figures = assert_ok(proc, figures, 300)
    assert figures["kills"]
    invariants = figures["invariants"]
    assert invariants["ok"] and invariants["runs"] == 300
    assert invariants["executions"] >= 600  # every step recorded itself in the ledger
    for count in ("lost", "double_completion", "rerun_after_record", "wrong_result",
                  "unattributed"):
        assert invariants[count] == 0, invariants
    assert set(invariants["faults"]) <= {"orphaned"}  # re-runs only where a kill was
    line = figures["invariants_line"]
    assert line.startswith("runs=300 lost=0 double_completion=0 rerun_after_record=0 "
                           "rerun_in_window=") and "stale_writes_refused=" in line
    assert f"invariants     {line}" in proc.stdout
    assert list(ledger.glob("ledger-*.jsonl"))


def test_valkey_store_commands_shards_and_kills(tmp_path: Path, valkey_url: str,
                                                valkey_namespace: str) -> None:
    proc, figures = bench(tmp_path, "-n", "2", "--store", valkey_url, "--namespace",
                          valkey_namespace, "--rate", "30", "--runs", "60", "--steps", "1",
                          "--kill-every", "1")
    figures = assert_ok(proc, figures, 60)
    assert figures["store"] == "redis" and figures["namespace"] == valkey_namespace
    assert figures["store_commands_per_run"] > 0
    assert "other users of a shared server" in figures["store_commands_note"]
    shards = figures["shards"]
    assert shards is not None and shards["workflow"] == "pyrula.bench"
    assert 0 <= shards["min"] <= shards["max"] <= 64
    assert figures["kills"]
    shares_add_up(figures, 60)
    assert "commands per run" in proc.stdout


# --- usage errors -------------------------------------------------------------------------


def test_upgrades_and_kills_under_load_on_an_elastic_fleet_lose_nothing(tmp_path: Path) -> None:
    # 400 runs at 100/s: the load lasts 4 s, through two upgrades and a kill.
    proc, figures = bench(tmp_path, "-n", "1", "--min", "1", "--max", "2", "--rate", "100",
                          "--runs", "400", "--steps", "2", "--upgrade-every", "1.5",
                          "--kill-every", "2", "--verify")
    figures = assert_ok(proc, figures, 400)
    assert (figures["min"], figures["max"]) == (1, 2)
    assert len(figures["upgrades_at_s"]) >= 2 and figures["kills"]
    invariants = figures["invariants"]
    assert invariants["ok"] and invariants["runs"] == 400, invariants
    for count in ("lost", "double_completion", "rerun_after_record", "wrong_result"):
        assert invariants[count] == 0, invariants
    assert "upgrades       " in proc.stdout and "elastic        --min 1 --max 2" in proc.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--min", "1"], "--min and --max go together"),
    (["-n", "3", "--min", "1", "--max", "2"], "-n (3) must be within --min 1 .. --max 2"),
    (["--upgrade-every", "0"], "--upgrade-every must be > 0"),
    (["--rate", "10", "--concurrency", "3"], "--rate and --concurrency exclude each other"),
    (["--rate", "0"], "--rate must be"),
    (["--runs", "-1"], "--runs must be >= 1"),
    (["--payload-bytes", "-1"], "--payload-bytes must be >= 0"),
    (["--kill-every", "0"], "--kill-every must be > 0"),
    (["--attach", "not-a-url"], "--attach 'not-a-url' is not the http://HOST:PORT"),
    (["--step-kind", "threads"], "'threads' is not one of"),
    (["--store", "memory://"], "a fleet cannot share it"),
    (["--ledger", "/tmp/x"], "--ledger is only used with --verify"),
])
def test_usage_errors_exit_2_with_one_clear_message(tmp_path: Path, args: list[str],
                                                    message: str) -> None:
    proc, figures = bench(tmp_path, *args, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert figures is None


def test_unreachable_store_and_fleet_are_one_line_errors(tmp_path: Path) -> None:
    for args, message in (
        (["--store", f"redis://127.0.0.1:{free_port()}"], "cannot reach the store"),
        (["--attach", f"http://127.0.0.1:{free_port()}"], "--attach: cannot reach"),
    ):
        proc, _ = bench(tmp_path, "--runs", "5", *args, timeout=30)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# --- attaching to a running fleet -----------------------------------------------------------

SABOTEUR = textwrap.dedent(
    '''
    """A fleet app that registers its own "pyrula.bench": wrong for some runs."""

    from pyrula.workflows import workflow


    @workflow(name="pyrula.bench")
    async def bench(ctx, params):
        x, steps = int(params["x"]), int(params["steps"])
        if x % 5 == 1:
            return x + steps + 1           # a wrong result
        if x % 5 == 2:
            raise ValueError("sabotaged")  # a failed run
        if x % 5 == 3:
            await ctx.sleep(3600)          # never ends within the bench: lost
        return x + steps
    '''
)


@pytest.fixture
def fleets(tmp_path: Path) -> Iterator[Fleets]:
    started = Fleets(tmp_path)
    try:
        yield started
    finally:
        started.reap()


def test_attach_loads_a_running_fleet_and_kills_its_children(tmp_path: Path,
                                                             fleets: Fleets) -> None:
    fleet = fleets.start("-n", "2", app="pyrula.examples.bench")
    fleet.wait_ready(2)
    proc, figures = bench(tmp_path, "--attach", fleet.url, "--store", "sqlite:///store.db",
                          "-n", "7", "--rate", "20", "--runs", "40", "--kill-every", "0.5")
    figures = assert_ok(proc, figures, 40)
    assert figures["attached"] == fleet.url and figures["children"] == 2
    assert "-n is ignored with --attach" in proc.stderr
    assert figures["kills"]
    shares_add_up(figures, 40)
    # The bench never stops a fleet it attached to; the fleet replaced the killed children.
    assert fleet.proc.poll() is None
    fleet.wait_status(lambda s: len(ready(s)) == 2, what="2 ready children after the kills")


def test_attach_to_a_fleet_getting_runs_wrong_exits_1_naming_them(tmp_path: Path,
                                                                  fleets: Fleets) -> None:
    (tmp_path / "saboteur.py").write_text(SABOTEUR)
    fleet = fleets.start("-n", "1", app="saboteur")
    fleet.wait_ready(1)
    proc, figures = bench(tmp_path, "--attach", fleet.url, "--store", "sqlite:///store.db",
                          "--runs", "10", "--steps", "1", "--lost-after", "3")
    assert proc.returncode == 1, proc.stderr
    assert figures is not None
    verification = figures["verification"]
    assert verification["ok"] is False
    assert (verification["completed"], verification["wrong"], verification["failed"],
            verification["lost"]) == (4, 2, 2, 2)
    assert "FAILED" in proc.stdout
    for what in ("2 lost (never ended)", "2 failed", "2 with a wrong result"):
        assert what in proc.stdout
    assert all(len(verification["examples"][k]) == 2 for k in ("lost", "failed", "wrong"))


# --- a workflow of the user's (--workflow) --------------------------------------------------

USER_APP = textwrap.dedent(
    '''
    """A user's own app: one workflow of two steps, an async one and a sync one."""

    from pyrula.workflows import step, workflow


    @step
    async def shout(word):
        return word.upper()


    @step
    def count(word):
        return len(word)


    @workflow(name="greet")
    async def greet(ctx, params):
        word = params.get("word", "hi")
        loud = await shout(word)
        letters = await count(word)
        if params.get("fail"):
            raise ValueError("asked to fail")
        return {"greeting": loud, "letters": letters}
    '''
)


@pytest.fixture(scope="module")
def user_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """One fleet of 2 children serving ``greet`` (``--app userapp``): its health URL and
    its store's URL, shared by the tests below."""
    directory = tmp_path_factory.mktemp("user-fleet")
    (directory / "userapp.py").write_text(USER_APP)
    started = Fleets(directory)
    try:
        fleet = started.start("-n", "2", app="userapp")
        fleet.wait_ready(2)
        yield fleet.url, f"sqlite:///{directory / 'store.db'}"
    finally:
        started.reap()


def bench_user(tmp_path: Path, user_fleet: tuple[str, str], *args: str,
               runs: int = 12) -> tuple[Proc, dict[str, Any] | None]:
    url, store = user_fleet
    return bench(tmp_path, "--attach", url, "--store", store, "--runs", str(runs),
                 "--concurrency", "4", "--lost-after", "10", *args)


def test_user_workflow_runs_all_verified_completed(tmp_path: Path,
                                                    user_fleet: tuple[str, str]) -> None:
    proc, figures = bench_user(tmp_path, user_fleet, "--workflow", "greet",
                               "--params", '{"word": "hey"}')
    figures = assert_ok(proc, figures, 12)
    assert figures["workflow"] == "greet" and figures["params"] == {"word": "hey"}
    assert figures["expect_given"] is False and figures["steps"] is None
    assert figures["step_kind"] is None and figures["payload_bytes"] is None  # built-in's only
    assert figures["steps_completed"] == 24  # two steps a run, read from the journals
    assert figures["runs_per_s"] > 0 and figures["steps_per_s"] > 0
    latency_reported(figures)
    shares_add_up(figures, 12)
    assert 'pyrula-fleet bench: 12 runs of greet, params {"word": "hey"}' in proc.stdout
    assert "verified       all 12 runs of greet completed (no --expect" in proc.stdout
    assert "steps/s" in proc.stdout and "latency        submit -> result  p50" in proc.stdout


def test_user_workflow_result_matches_expect(tmp_path: Path,
                                             user_fleet: tuple[str, str]) -> None:
    proc, figures = bench_user(tmp_path, user_fleet, "--workflow", "greet", "--params",
                               '{"word": "hey"}', "--expect", '{"letters": 3, "greeting": "HEY"}')
    figures = assert_ok(proc, figures, 12)
    assert figures["expect_given"] and figures["expect"] == {"letters": 3, "greeting": "HEY"}
    assert ("verified       all 12 runs of greet completed with the expected result "
            '{"letters": 3, "greeting": "HEY"}') in proc.stdout


def test_user_workflow_mismatched_or_failed_runs_exit_1_naming_them(
        tmp_path: Path, user_fleet: tuple[str, str]) -> None:
    proc, figures = bench_user(tmp_path, user_fleet, "--workflow", "greet", "--params",
                               '{"word": "hey"}', "--expect", '{"greeting": "HEY", "letters": 4}',
                               runs=8)
    assert proc.returncode == 1, proc.stderr
    assert figures is not None and figures["verification"]["ok"] is False
    assert (figures["verification"]["completed"], figures["verification"]["wrong"]) == (0, 8)
    examples = figures["verification"]["examples"]["wrong"]
    assert len(examples) == 5 and all(e.endswith("($.letters: got 3, want 4)") for e in examples)
    assert "FAILED         0/8 runs verified; 8 with a wrong result: " in proc.stdout
    assert "($.letters: got 3, want 4)" in proc.stdout and "Traceback" not in proc.stderr
    assert figures["runs_per_s"] == 0 and figures["steps_completed"] == 0  # verified ones only

    proc, figures = bench_user(tmp_path, user_fleet, "--workflow", "greet", "--params",
                               '{"word": "hey", "fail": true}', runs=3)
    assert proc.returncode == 1, proc.stderr
    assert figures is not None and figures["verification"]["failed"] == 3
    assert "FAILED         0/3 runs verified; 3 failed: " in proc.stdout
    assert "(workflow_error ValueError: asked to fail)" in proc.stdout


def test_workflow_the_fleet_does_not_serve_exits_2_naming_the_served_ones(
        tmp_path: Path, user_fleet: tuple[str, str]) -> None:
    proc, figures = bench_user(tmp_path, user_fleet, "--workflow", "grete")
    assert proc.returncode == 2, proc.stderr
    assert figures is None and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: --attach: the fleet at {user_fleet[0]} does not serve "
        "'grete'; it serves greet: pick one of them with --workflow"]
    # The built-in workflow is checked the same way.
    proc, _ = bench_user(tmp_path, user_fleet)
    assert proc.returncode == 2
    assert "does not serve 'pyrula.bench'; it serves greet: start it with --app" in proc.stderr


def test_a_store_other_than_the_attached_fleets_exits_2_and_creates_nothing(
        tmp_path: Path, user_fleet: tuple[str, str]) -> None:
    url, store = user_fleet
    missing = tmp_path / "elsewhere" / "pyrula.db"
    missing.parent.mkdir()
    proc, figures = bench(tmp_path, "--attach", url, "--store", f"sqlite:///{missing}",
                          "--workflow", "greet", "--runs", "3")
    assert proc.returncode == 2 and figures is None, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: no store at {missing}: pass the --store the fleet at {url} runs on "
        "(its /status names it)"]
    assert not missing.exists()  # no empty store left behind for the next command to read

    other = tmp_path / "other.db"
    SQLiteStore(str(other)).close()
    proc, figures = bench(tmp_path, "--attach", url, "--store", f"sqlite:///{other}",
                          "--workflow", "greet", "--runs", "3")
    assert proc.returncode == 2 and figures is None, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: --attach: the fleet at {url} runs on {store}, the bench on "
        f"sqlite:///{other}: pass --store {store}"]


@pytest.mark.parametrize(("args", "message"), [
    (["--attach", "http://127.0.0.1:9", "--workflow", "greet", "--params", "{word: 1}"],
     "error: --params is not JSON: Expecting property name enclosed in double quotes"),
    (["--attach", "http://127.0.0.1:9", "--workflow", "greet", "--expect", "NaN"],
     "error: --expect is not JSON: "),
    (["--workflow", "greet"], "error: --workflow needs --attach URL"),
    (["--params", "{}"], "error: --params and --expect go with --workflow NAME"),
    (["--attach", "http://127.0.0.1:9", "--workflow", "greet", "--steps", "2"],
     "error: --steps shapes the built-in workflow's runs: not with --workflow"),
    (["--attach", "http://127.0.0.1:9", "--workflow", "greet", "--verify"],
     "error: --verify checks the built-in workflow's ledger: not with --workflow"),
    (["--min", "1"], "error: --min and --max go together"),
])
def test_workflow_usage_errors_are_one_line_exit_2(tmp_path: Path, args: list[str],
                                                   message: str) -> None:
    proc, figures = bench(tmp_path, *args, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert figures is None
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(message), proc.stderr


@pytest.mark.parametrize(("got", "want", "differs"), [
    ({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2}]}, None),
    ({"a": 1.0}, {"a": 1}, None),  # JSON does not tell 1 from 1.0
    (None, None, None),
    ({"a": [1, {"b": 3}]}, {"a": [1, {"b": 2}]}, "$.a[1].b: got 3, want 2"),
    ({"a": 1}, {"a": 1, "b": 2}, '$: missing key "b"'),
    ({"a": 1, "c": 2}, {"a": 1}, '$: unexpected key "c"'),
    ([1, 2, 3], [1, 2], "$: 3 items, want 2"),
    (1, True, "$: got 1, want true"),  # Python's 1 == True is not JSON's
    ("x" * 100, None, '$: got "' + "x" * 56 + "..., want null"),
])
def test_difference_names_the_first_place_two_json_values_differ(got: Any, want: Any,
                                                                 differs: str | None) -> None:
    assert difference(got, want) == differs


def test_verify_with_an_expected_value_names_mismatches() -> None:
    records = [_record(0, RunStatus.COMPLETED, {"ok": True}),
               _record(1, RunStatus.COMPLETED, {"ok": False})]
    v = verify(records, expect_check(Expected({"ok": True})))
    assert v.completed == 1 and v.wrong == ["r1 ($.ok: got false, want true)"]
    assert verify(records, expect_check(None)).ok  # without --expect any result will do


# --- the pure parts -------------------------------------------------------------------------


def _record(x: int, status: RunStatus | None, result: Any = None,
            run_id: str | None = "r") -> RunRecord:
    info = None
    if status is not None:
        info = RunInfo(run_id=f"{run_id}{x}", name="pyrula.bench", status=status, attempt=1,
                       params={"x": x}, owner=None, created_at=0.0, updated_at=0.0,
                       result=result,
                       error={"code": "step_failed"} if status is RunStatus.FAILED else None)
    return RunRecord(x=x, run_id=None if run_id is None else f"{run_id}{x}", info=info)


def test_verify_names_wrong_failed_lost_and_unsubmitted_runs() -> None:
    records = [
        _record(0, RunStatus.COMPLETED, 3),
        _record(1, RunStatus.COMPLETED, 5),   # wrong: 1 + 3 is 4
        _record(2, RunStatus.FAILED),
        _record(3, None),                    # submitted, never seen ended: lost
        _record(4, None, run_id=None),       # never submitted
        _record(5, RunStatus.CANCELLED),
    ]
    v = verify(records, sum_check(3))
    assert not v.ok and v.runs == 6 and v.completed == 1
    assert v.wrong == ["r1 (got 5, want 4)"]
    assert v.failed == ["r2 (step_failed)", "r5 (cancelled)"]
    assert v.lost == ["r3"] and v.not_submitted == ["#4"]
    assert v.as_dict()["examples"]["wrong"] == ["r1 (got 5, want 4)"]
    assert verify([_record(0, RunStatus.COMPLETED, 3)], sum_check(3)).ok


def test_percentiles_are_nearest_rank() -> None:
    assert percentiles([]) is None
    values = [float(v) for v in range(1, 101)]
    assert percentiles(values) == {"p50": 50.0, "p95": 95.0, "p99": 99.0, "max": 100.0}
    assert percentiles([7.0]) == {"p50": 7.0, "p95": 7.0, "p99": 7.0, "max": 7.0}


def test_shard_balance_from_status() -> None:
    status = {"children": [
        {"worker_id": "a", "state": "ready", "shards": {"pyrula.bench": 40}},
        {"worker_id": "b", "state": "ready", "shards": {"pyrula.bench": 24}},
        {"worker_id": "c", "state": "starting", "shards": {}},
    ]}
    assert shard_balance(status, "pyrula.bench") == {
        "workflow": "pyrula.bench", "min": 24, "max": 40, "total": 64,
        "per_child": {"a": 40, "b": 24}}
    assert shard_balance({"children": [{"worker_id": "a", "state": "ready", "shards": {}}]},
                         "pyrula.bench") is None


def test_progress_line_rewrites_in_place_only_on_a_terminal() -> None:
    class Counters:
        records = [RunRecord(x=i) for i in range(10)]
        ended, completed, errors, in_flight = 4, 3, 1, 2

    for tty, ending in ((True, "\r"), (False, "\n")):
        stream = io.StringIO()
        progress = Progress(stream, Counters(), tty=tty)  # type: ignore[arg-type]
        progress.write()
        text = stream.getvalue()
        assert ("done 3/10" in text and "errors 1" in text and "in flight     2" in text
                and "runs/s" in text)
        assert text.startswith("\r") if ending == "\r" else text.endswith("\n")


def test_config_checks_and_health_urls() -> None:
    assert BenchConfig().mode == "queue"
    assert BenchConfig(rate=5).mode == "rate" and BenchConfig(concurrency=2).mode == "concurrency"
    for bad in ({"rate": 1.0, "concurrency": 1}, {"runs": 0}, {"children": 0}, {"steps": -1},
                {"rate": float("inf")}, {"lost_after": 0}):
        with pytest.raises(BenchError) as caught:
            BenchConfig(**bad)  # type: ignore[arg-type]
        assert caught.value.code == 2
    assert parse_health_url("http://127.0.0.1:8081/") == "http://127.0.0.1:8081"
    assert BenchConfig(attach="http://localhost:9").attach == "http://localhost:9"
    for bad_url in ("127.0.0.1:8081", "ftp://h:1", "http://h:1/status", "http://h:70000"):
        with pytest.raises(BenchError):
            parse_health_url(bad_url)
