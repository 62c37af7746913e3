"""The one error contract of ``pyrula`` and ``pyrula-fleet`` (docs/operations.md, "Errors and
exit codes"), over every command: a usage or configuration mistake exits 2 with exactly one
line on stderr, ``error: ...`` naming the flag or variable, and no traceback; an app that
raises at import shows its own frames, file:line first, and none of pyrula's.

The table names every command of both click groups: a command added without a row fails
``test_every_command_has_a_row``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from pyrula.cli.fleet_commands import cli as fleet_cli
from pyrula.cli.main import cli as pyrula_cli
from pyrula.workflows import SQLiteStore, SyncWorkflowClient
from tests.conftest import wait_until
from tests.integration.workerprocs import WorkerProcess, child_env

APP = textwrap.dedent(
    """
    from pyrula.workflows import step, workflow


    @step
    async def flaky_fetch(x):
        return x


    @workflow(name="ce_hello")
    async def hello(ctx, params):
        return "hi"
    """
)
#: An app whose code fails at import, two modules deep (line 6 of deep/inner.py).
DEEP_INIT = "from . import inner\n"
DEEP_INNER = "import os\n\n\nfirst = 1\nsecond = 2\nthird = undefined_name_4242 + 1\n"

RUN = "0" * 32
MEMORY = ("--store", "memory://")

#: (program, command path, arguments after it, extra environment, what the line names).
ROWS: list[tuple[str, str, list[str], dict[str, str], str]] = [
    ("pyrula", "", ["nosuch"], {}, "No such command 'nosuch'"),
    ("pyrula", "cancel", [RUN, *MEMORY], {}, "--store memory://"),
    ("pyrula", "cloud", ["nosuch"], {}, "No such command 'nosuch'"),
    ("pyrula", "cloud keys", ["nosuch"], {}, "No such command 'nosuch'"),
    ("pyrula", "cloud keys create", ["bad env"], {},
     "ENVIRONMENT must be lowercase letters, digits and '-'"),
    ("pyrula", "cloud serve", ["--store", "ftp://x"], {},
     "--store must be sqlite:///PATH or a postgresql:// DSN, got 'ftp://x'"),
    ("pyrula", "db", ["nosuch"], {}, "No such command 'nosuch'"),
    ("pyrula", "db check", [], {}, "--postgres-dsn"),
    ("pyrula", "db migrate", ["--postgres-dsn", "mysql://x"], {}, "postgresql://"),
    ("pyrula", "dev", ["--workflow", "ceapp"], {},
     "--workflow ceapp: expected MODULE:FUNCTION naming a @workflow"),
    ("pyrula", "emit", ["t", "{bad"], {}, "the payload is not JSON"),
    ("pyrula", "emit", ["", "1"], {}, "a topic must be a non-empty str"),
    ("pyrula", "emit", ["t", "1", *MEMORY], {}, "--store memory://"),
    ("pyrula", "events", [RUN, *MEMORY], {}, "--store memory://"),
    ("pyrula", "get", [RUN, "--store", "nosuch://x"], {}, "--store: unknown store URL scheme"),
    ("pyrula", "result", [RUN, "--timeout", "soon"], {}, "'--timeout'"),
    ("pyrula", "runs", ["--status", "bogus"], {}, "--status 'bogus' is not a run status"),
    ("pyrula", "runs cancel", [RUN], {"PYRULA_STORE_URL": "memory://"},
     "PYRULA_STORE_URL=memory://"),
    ("pyrula", "runs events", [], {}, "Missing argument 'RUN_ID'"),
    ("pyrula", "runs fork", [RUN], {}, "Missing option '--from-step'"),
    ("pyrula", "runs list", ["--limit", "0"], {}, "'--limit'"),
    ("pyrula", "runs list", [*MEMORY], {}, "--store memory://"),
    ("pyrula", "runs result", [RUN, "--timeout", "soon"], {}, "'--timeout'"),
    ("pyrula", "runs query", [RUN, "total", "{bad"], {}, "ARGS_JSON is not JSON"),
    ("pyrula", "runs resume", [RUN, "{bad"], {}, "VALUE_JSON is not JSON"),
    ("pyrula", "runs retry", [RUN, "--bogus"], {}, "No such option '--bogus'"),
    ("pyrula", "runs show", [RUN, "--store", "nosuch://x"], {},
     "--store: unknown store URL scheme"),
    ("pyrula", "runs signal", [RUN, "go", "not json"], {}, "PAYLOAD_JSON is not JSON"),
    ("pyrula", "runs stuck", ["--limit", "0"], {}, "'--limit'"),
    ("pyrula", "runs update", [RUN, "add", "{bad"], {}, "PAYLOAD_JSON is not JSON"),
    ("pyrula", "runs submit", ["ce_hello", "{bad"], {}, "PARAMS_JSON is not JSON"),
    ("pyrula", "projections", ["nosuch"], {}, "No such command 'nosuch'"),
    ("pyrula", "projections list", [*MEMORY], {}, "--store memory://"),
    ("pyrula", "projections show", ["p\n"], {}, "control characters"),
    ("pyrula", "projections rebuild", [], {}, "Missing argument 'NAME'"),
    ("pyrula", "schedules", ["nosuch"], {}, "No such command 'nosuch'"),
    ("pyrula", "schedules create", ["ce_hello", "--cron", "61 * * * *"], {}, "--cron"),
    ("pyrula", "schedules delete", [], {}, "Missing argument 'SCHEDULE_ID'"),
    ("pyrula", "schedules list", [*MEMORY], {}, "--store memory://"),
    ("pyrula", "schedules pause", ["s", "--namespace", "ns"], {},
     "--namespace applies to Valkey stores only"),
    ("pyrula", "schedules resume", ["s", *MEMORY], {}, "--store memory://"),
    ("pyrula", "schedules run-now", [], {}, "Missing argument 'SCHEDULE_ID'"),
    ("pyrula", "signal", [RUN, "go", "not json"], {}, "PAYLOAD_JSON is not JSON"),
    ("pyrula", "submit", ["ce_hello", *MEMORY], {}, "--store memory://"),
    ("pyrula", "worker", ["--app", "ceapp", "--health-port", "70000"], {},
     "--health-port must be a TCP port 0..65535"),
    ("pyrula", "worker", ["--workflow", "ceapp"], {},
     "--workflow ceapp: expected MODULE:FUNCTION naming a @workflow"),
    ("pyrula", "worker", ["--workflow", "ceapp:flaky_fetch"], {},
     "--workflow ceapp:flaky_fetch is a @step, not a @workflow"),
    ("pyrula", "worker", ["--app", "no_such_app_77"], {}, "--app no_such_app_77: no module"),
    ("pyrula", "worker", [], {}, "name what to serve"),
    ("pyrula-fleet", "", ["nosuch"], {}, "No such command 'nosuch'"),
    ("pyrula-fleet", "bench", ["--params", "{}"], {}, "--params and --expect go with"),
    ("pyrula-fleet", "start", ["--app", "ceapp", "-n", "0"], {}, "-n must be >= 1"),
    ("pyrula-fleet", "start", ["--app", "ceapp"], {"WEB_CONCURRENCY": "0"},
     "WEB_CONCURRENCY must be >= 1"),
    ("pyrula-fleet", "start", ["--app", "ceapp", "--health-port", "70000"], {},
     "--health-port must be a TCP port 0..65535"),
    ("pyrula-fleet", "start", ["--app", "ceapp"], {"PORT": "http"}, "PORT must be an integer"),
    ("pyrula-fleet", "start", ["--app", "ceapp"], {"PYRULA_CHILDREN": "0"},
     "PYRULA_CHILDREN must be >= 1"),
    ("pyrula-fleet", "start", ["--app", "ceapp"], {"PYRULA_HEALTH_PORT": "99999"},
     "PYRULA_HEALTH_PORT must be a TCP port"),
    ("pyrula-fleet", "start", ["--app", "ceapp", "--store-wait", "soon"], {},
     "--store-wait must be a number"),
    ("pyrula-fleet", "start", ["--workflow", "ceapp"], {},
     "--workflow ceapp: expected MODULE:FUNCTION naming a @workflow"),
    ("pyrula-fleet", "start", ["--workflow", "ceapp:flaky_fetch", "--health-port", "0"], {},
     "--workflow ceapp:flaky_fetch is a @step, not a @workflow"),
    ("pyrula-fleet", "start", ["--app", "no_such_app_77", "--health-port", "0"], {},
     "--app no_such_app_77: no module"),
    ("pyrula-fleet", "start", ["--app", "ceapp", "--store", "nosuch://x"], {},
     "--store: unknown store URL scheme"),
    ("pyrula-fleet", "start", ["--app", "ceapp"], {"PYRULA_STORE_URL": "nosuch://x"},
     "PYRULA_STORE_URL: unknown store URL scheme"),
    ("pyrula-fleet", "start", ["--app", "ceapp", "--store", "sqlite:////no/such/dir/p.db"], {},
     "--store: SQLite store directory does not exist: /no/such/dir"),
    ("pyrula-fleet", "start", ["--app", "ceapp", "-n", "100000"], {},
     "-n 100000: this host can"),
    ("pyrula-fleet", "start", ["--app", "ceapp", "--shutdown-grace", "soon"], {},
     "--shutdown-grace"),
    ("pyrula-fleet", "status", ["--url", "ftp://x"], {}, "--url 'ftp://x'"),
    ("pyrula-fleet", "upgrade", ["--url", "nope"], {}, "--url 'nope'"),
]

PROGRAMS = {"pyrula": ("pyrula.cli.main", pyrula_cli), "pyrula-fleet": ("pyrula.cli.fleet_commands",
                                                                       fleet_cli)}


def _commands(group: click.Group, prefix: str = "") -> Iterator[str]:
    for name, command in group.commands.items():
        path = f"{prefix} {name}".strip()
        yield path
        if isinstance(command, click.Group):
            yield from _commands(command, path)


def test_every_command_has_a_row() -> None:
    commands = {(program, path) for program, (_, group) in PROGRAMS.items()
                for path in _commands(group)}
    rows = {(program, path) for program, path, *_ in ROWS if path}
    assert commands - rows == set(), "commands without a row in ROWS"
    assert rows - commands == set(), "rows for commands that do not exist"


def _run(directory: Path, program: str, args: list[str],
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    module = PROGRAMS[program][0]
    return subprocess.run(
        [sys.executable, "-c", f"from {module} import main; main()", *args],
        cwd=directory, env=child_env(**(env or {})), capture_output=True, text=True,
        timeout=120, stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory as a user has it: the app, its store (made by a worker), and a broken
    app beside it."""
    (tmp_path / "ceapp.py").write_text(APP)
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "__init__.py").write_text(DEEP_INIT)
    (tmp_path / "deep" / "inner.py").write_text(DEEP_INNER)
    store = SQLiteStore(str(tmp_path / "pyrula.db"))
    try:
        SyncWorkflowClient(store).list_runs(limit=1)
    finally:
        store.close()
    return tmp_path


@pytest.mark.parametrize(("program", "path", "args", "env", "names"), ROWS,
                         ids=[f"{r[0]} {r[1]} {' '.join(r[2])}".strip() for r in ROWS])
def test_a_usage_mistake_is_one_error_line_and_exit_2(
    project: Path, program: str, path: str, args: list[str], env: dict[str, str], names: str
) -> None:
    proc = _run(project, program, [*path.split(), *args], env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert names in lines[0], lines[0]
    assert "child_spawned" not in proc.stderr  # a fleet refuses before it forks


#: (program, command path, arguments after it, extra environment, the one line): what was
#: asked about is missing or failed, exit 1.
MISSING: list[tuple[str, str, list[str], dict[str, str], str]] = [
    ("pyrula", "get", [RUN], {}, f"error: no run with id '{RUN}'"),
    ("pyrula", "runs show", [RUN], {}, f"error: no run with id '{RUN}'"),
    ("pyrula", "result", [RUN], {}, f"error: no run with id '{RUN}'"),
    ("pyrula", "schedules delete", ["nosuch"], {},
     "error: no schedule with id 'nosuch' (see `pyrula schedules list`)"),
    ("pyrula", "runs list", ["--store", "sqlite:///elsewhere.db"], {},
     "error: no store at {project}/elsewhere.db: run where your fleet runs, or set "
     "PYRULA_STORE_URL"),
    ("pyrula", "runs list", [], {"PYRULA_STORE_URL": "sqlite:///other.db"},
     "error: no store at {project}/other.db: run where your fleet runs, or set "
     "PYRULA_STORE_URL"),
    ("pyrula-fleet", "status", ["--url", "http://127.0.0.1:9"], {},
     "error: cannot reach the fleet at http://127.0.0.1:9: connection refused (is it "
     "running? pass --url)"),
    ("pyrula", "worker", ["--app", "ceapp", "--store", "redis://127.0.0.1:9",
                          "--store-wait", "0.5", "--health-port", "0"], {},
     "error: store redis://127.0.0.1:9 unreachable for 0.5 s: "),
]


@pytest.mark.parametrize(("program", "path", "args", "env", "line"), MISSING,
                         ids=[f"{r[0]} {r[1]} {' '.join(r[2])}".strip() for r in MISSING])
def test_what_is_missing_or_failed_is_one_error_line_and_exit_1(
    project: Path, program: str, path: str, args: list[str], env: dict[str, str], line: str
) -> None:
    proc = _run(project, program, [*path.split(), *args], env)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    errors = [got for got in proc.stderr.splitlines() if got.startswith("error")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(line.format(project=project)), errors[0]
    assert not (project / "elsewhere.db").exists() and not (project / "other.db").exists()


# --- an app that raises at import ------------------------------------------------------

FIRST = ("error: --app deep raised at import: deep/inner.py:6: NameError: name "
         "'undefined_name_4242' is not defined")


def _only_the_apps_frames(output: str, project: Path) -> None:
    lines = output.splitlines()
    assert lines[0] == FIRST, output
    assert f'File "{project / "deep" / "__init__.py"}", line 1, in <module>' in output
    assert f'File "{project / "deep" / "inner.py"}", line 6, in <module>' in output
    assert "third = undefined_name_4242 + 1" in output
    assert lines[-1] == "NameError: name 'undefined_name_4242' is not defined", output
    assert "Traceback" not in output
    assert "importlib" not in output
    assert "/pyrula/" not in output  # none of pyrula's frames (cli, child.py, preload)


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_worker_shows_the_apps_frames_file_line_first(project: Path, level: str) -> None:
    proc = _run(project, "pyrula", ["worker", "--app", "deep", "--log-level", level])
    assert proc.returncode == 2, proc.stderr
    _only_the_apps_frames(proc.stderr, project)


def test_fleet_loads_a_broken_app_once_and_forks_nothing(project: Path) -> None:
    started = time.monotonic()
    proc = _run(project, "pyrula-fleet", ["start", "--app", "deep", "-n", "5",
                                           "--health-port", "0"])
    assert proc.returncode == 2, proc.stderr
    # The banner and log lines before the refusal are the fleet's own; the refusal is last.
    at = proc.stderr.index("error: ")
    _only_the_apps_frames(proc.stderr[at:], project)
    assert "child_spawned" not in proc.stderr
    assert "child_boot_failed" not in proc.stderr
    assert proc.stderr.count("NameError") == 2  # the first line and the exception's
    assert time.monotonic() - started < 60


def test_dev_shows_the_apps_frames_then_waits_for_a_fix(project: Path) -> None:
    log = project / "dev.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyrula.cli", "dev", "--app", "deep"], cwd=project,
            env=child_env(), stdout=subprocess.DEVNULL, stderr=out,
        )
    try:
        wait_until(lambda: "waiting for a change" in log.read_text(), timeout=30,
                   what="dev to wait for a fix")
        text = log.read_text()
        _only_the_apps_frames(text[:text.index("\nwaiting for a change")], project)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


# --- which store ----------------------------------------------------------------------


@pytest.mark.parametrize("command", ["worker", "dev"])
def test_a_worker_banner_names_its_sqlite_store_absolutely(project: Path, command: str) -> None:
    worker = WorkerProcess(project, command, [command, "--app", "ceapp", "--no-cloud"],
                           child_env())
    try:
        log = worker.wait_for_log("worker_started", timeout=30)
        assert f" on sqlite:///{project / 'pyrula.db'} serving ce_hello" in log, log
    finally:
        worker.reap()
