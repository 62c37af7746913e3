"""A crash loop is reported, not spun: children that cannot boot stop the fleet after
``--max-boot-failures`` attempts, with the last child's error and a non-zero exit."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from pyrula.workflows import SQLiteStore, SyncWorkflowClient, ValkeyStore
from tests.conftest import wait_until
from tests.fleet.fleetprocs import (
    APP_MODULE,
    FLEET,
    QUICK,
    STORE_FILE,
    Fleet,
    Fleets,
    child_env,
    group_alive,
    pids,
    write_app,
)
from tests.servers import free_port, start_server


def _says_store_unreachable(fleet: Fleet) -> bool:
    try:
        code, body = fleet.get("/readyz")
    except OSError:  # not listening yet
        return False
    return code == 503 and json.loads(body)["status"] == "store_unreachable"

EXIT_BOOT_FAILURE = 3  # pyrula.wire.EXIT_BOOT_FAILURE


def test_an_app_that_raises_at_import_is_refused_before_any_child_is_forked(
    fleets: Fleets, tmp_path: Path
) -> None:
    # The fork server loads the app once, before the first fork: a broken app is one
    # refusal, exit 2, not --max-boot-failures children each failing the same way.
    write_app(tmp_path, 'raise RuntimeError("broken app: boom-4242")\n', module="brokenapp")
    fleet = fleets.start("-n", "1", "--max-boot-failures", "3", app="brokenapp")
    assert fleet.wait(30) == 2
    log = fleet.log()
    assert "error: --app brokenapp raised at import: brokenapp.py:1: RuntimeError: broken " \
           "app: boom-4242" in log
    assert "child_spawned" not in log
    assert "fleet_crash_loop" not in log


def test_a_fleet_started_before_its_store_waits_for_it_then_serves(
    fleets: Fleets, tmp_path: Path
) -> None:
    # compose or systemd start the fleet and Valkey together: the store may answer later.
    port = free_port()
    url = f"redis://127.0.0.1:{port}"
    fleet = fleets.start("-n", "1", "--namespace", f"boot-wait-{os.getpid()}", *QUICK,
                         store=url, port=free_port(avoid=[port]))
    fleet.wait_for_log("store_unreachable:", timeout=30)
    wait_until(lambda: _says_store_unreachable(fleet), timeout=30,
               what="/readyz to say the store is unreachable")
    with start_server(tmp_path, port=port):
        fleet.wait_ready(1, timeout=60)
        client = SyncWorkflowClient(ValkeyStore(url=url,
                                                namespace=f"boot-wait-{os.getpid()}"))
        handle = client.submit("fa_load", {"tag": "after-the-store"})
        assert client.result(handle.run_id, timeout=60) is not None
        fleet.send(signal.SIGTERM)
        assert fleet.wait(60) == 0
    log = fleet.log()
    assert log.count("store_unreachable:") == 1, log[:3000]  # one line for the outage
    assert "store_reachable:" in log
    assert "Traceback" not in log
    assert "child_boot_failed" not in log


def test_a_bounded_store_wait_fails_in_one_line(fleets: Fleets) -> None:
    dead = free_port()
    proc = subprocess.run(
        [*FLEET, "start", "--app", APP_MODULE, "-n", "1", "--health-port", "0",
         "--store", f"redis://127.0.0.1:{dead}", "--store-wait", "0.5"],
        cwd=fleets.directory, env=child_env(), capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith(
        f"error: store redis://127.0.0.1:{dead} unreachable for 0.5 s: ")
    assert "Traceback" not in proc.stderr
    assert "child_spawned" not in proc.stderr


def test_a_store_the_supervisor_cannot_open_is_a_configuration_error(fleets: Fleets) -> None:
    fleet = fleets.start("-n", "1", store="sqlite:///missing-dir/store.db")
    assert fleet.wait(30) == 2
    log = fleet.log()
    assert "error: --store: SQLite store directory does not exist" in log
    assert "Traceback" not in log
    assert "child_spawned" not in log


def test_children_that_became_ready_are_not_a_crash_loop(fleets: Fleets) -> None:
    # The same number of deaths after becoming ready: replaced every time, never stopped.
    import os
    import signal

    fleet = fleets.start("-n", "1", "--max-boot-failures", "2")
    for restarts in range(1, 4):
        status = fleet.wait_status(
            lambda s, n=restarts - 1: s["restarts"] == n and s["status"] == "ok",
            what=f"{restarts - 1} restarts, ready")
        os.kill(status["children"][0]["pid"], signal.SIGKILL)
    fleet.wait_status(lambda s: s["restarts"] == 3 and s["status"] == "ok", what="3 restarts")
    assert "fleet_crash_loop" not in fleet.log()
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


#: A main script as a console script is (``pyrula-fleet``): it notes each process that runs
#: it, then starts the fleet.
MAIN_SCRIPT = '''
import os, sys
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ran-main.log"), "a") as f:
    f.write(f"{os.getpid()}\\n")
from pyrula.cli.fleet import main
if __name__ == "__main__":
    sys.exit(main())
'''


def test_children_of_a_fleet_started_from_a_script_do_not_run_it_again(fleets: Fleets) -> None:
    # multiprocessing runs the parent's main script again in each child unless told not to:
    # for pyrula-fleet, the CLI's imports on every child's way to its first run.
    script = fleets.directory / "fleetmain.py"
    script.write_text(MAIN_SCRIPT)
    fleet = fleets.start("-n", "2", command=[sys.executable, str(script)])
    status = fleet.wait_ready(2, timeout=60)
    pids = (fleets.directory / "ran-main.log").read_text().split()
    assert pids == [str(fleet.pid)], (pids, [c["pid"] for c in status["children"]])
    store = SQLiteStore(str(fleets.directory / STORE_FILE), create=False)
    try:
        client = SyncWorkflowClient(store)
        run = client.submit("fa_load", {"tag": "main"})
        assert client.result(run.run_id, timeout=30) == ["a", "b"]  # the children serve
    finally:
        store.close()
    fleet.send(signal.SIGTERM)
    assert fleet.wait(30) == 0


#: An app that notes each process importing it.
COUNTED_APP = '''
import os
from pathlib import Path

from pyrula.workflows import step, workflow

with open(Path(__file__).resolve().parent / "imported.log", "a") as f:
    f.write(f"{os.getpid()}\\n")


@step
def twice(x: int) -> int:
    return 2 * x


@workflow(name="counted")
async def counted(ctx, params):
    return await twice(params["x"])
'''


def _serves_counted(fleets: Fleets, fleet: Fleet) -> list[str]:
    """Wait for one ready child, run ``counted`` on the fleet; the pids that imported it."""
    fleet.wait_ready(1, timeout=60)
    store = SQLiteStore(str(fleets.directory / STORE_FILE), create=False)
    try:
        client = SyncWorkflowClient(store)
        run = client.submit("counted", {"x": 21})
        assert client.result(run.run_id, timeout=30) == 42
    finally:
        store.close()
    fleet.send(signal.SIGTERM)
    assert fleet.wait(30) == 0
    return (fleets.directory / "imported.log").read_text().split()


def test_the_fork_server_started_from_the_arguments_is_the_one_children_fork_from(
        fleets: Fleets, tmp_path: Path) -> None:
    # The entry point starts the fork server from a quick read of its arguments, before
    # its CLI is imported; the CLI's reading agrees, so that one fork server imports the
    # app, once, and is kept (not started a second time).
    write_app(tmp_path, COUNTED_APP, module="countedapp")
    fleet = fleets.start("-n", "1", "--workflow=countedapp:counted", app=None,
                         env=child_env(PYRULA_APP="countedapp"))
    assert len(_serves_counted(fleets, fleet)) == 1


def test_a_quick_read_the_options_contradict_is_replaced_before_any_fork(
        fleets: Fleets, tmp_path: Path) -> None:
    # ``--project --workflow`` sets the project to "--workflow": the quick read of the
    # arguments takes "--app" for a workflow module instead and starts a fork server that
    # cannot load it. The CLI reads the options properly and replaces that fork server
    # with one that serves the app before it forks anything.
    write_app(tmp_path, COUNTED_APP, module="countedapp")
    fleet = fleets.start("-n", "1", "--project", "--workflow", "--app", "countedapp",
                         app=None)
    assert len(_serves_counted(fleets, fleet)) == 1
    assert "fleet_crash_loop" not in fleet.log()


def test_a_replacement_child_runs_on_the_build_its_fork_server_loaded(
        fleets: Fleets, tmp_path: Path) -> None:
    # The build is a fingerprint of the workflow code. The fork server reads that code's
    # text when it loads the app, so a child forked after the file changed on disk (a
    # replacement, a scale-up) reports the build of the code it runs, not of the file.
    app = write_app(tmp_path, COUNTED_APP, module="countedapp")
    fleet = fleets.start("-n", "1", app="countedapp")
    first = fleet.wait_ready(1, timeout=60)["children"][0]
    app.write_text(COUNTED_APP.replace("return 2 * x", "return x + x"))
    os.kill(first["pid"], signal.SIGKILL)
    fleet.wait_status(lambda s: any(c["state"] == "ready" and c["pid"] != first["pid"]
                                    for c in s["children"]), 60, what="a replacement")
    builds = re.findall(r"worker_started: \S+ serving counted \(build (\w+)\)", fleet.log())
    assert len(builds) == 2 and builds[0] == builds[1], builds


#: An app whose step says how the child's garbage collector stands.
GC_APP = '''
import gc

from pyrula.workflows import step, workflow


@step
def collector() -> dict:
    return {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}


@workflow(name="collector")
async def collector_state(ctx, params):
    return await collector()
'''


def test_children_collect_garbage_and_never_walk_what_the_fork_server_preloaded(
        fleets: Fleets, tmp_path: Path) -> None:
    # The fork server imports the app and the runtime with collection off (faster), then
    # freezes what it made: a child has collection on, and its collections skip those
    # objects (the pages stay shared with the fork server).
    write_app(tmp_path, GC_APP, module="gcapp")
    fleet = fleets.start("-n", "1", app="gcapp")
    fleet.wait_ready(1, timeout=60)
    store = SQLiteStore(str(fleets.directory / STORE_FILE), create=False)
    try:
        client = SyncWorkflowClient(store)
        run = client.submit("collector", {})
        state = client.result(run.run_id, timeout=30)
    finally:
        store.close()
    assert state["enabled"] is True
    assert state["frozen"] > 10_000, state  # the runtime's modules and the app's
    fleet.send(signal.SIGTERM)
    assert fleet.wait(30) == 0


def test_the_fork_server_and_tracker_are_forked_from_the_supervisor_and_leave_when_it_dies(
        fleets: Fleets) -> None:
    # The fork server the entry point starts is a fork of the supervisor, taken before it
    # imports anything more, rather than an interpreter started anew (whose own start lay
    # on the way to the first child): it shows the supervisor's command line. So does
    # multiprocessing's resource tracker, the supervisor's only other process. Killed
    # outright, the supervisor leaves no process of the fleet behind: the fork server
    # still sees it gone (it holds no end of its "alive" pipe but the one it reads).
    fleet = fleets.start("-n", "2", *QUICK)
    children = pids(fleet.wait_ready(2))
    servers = {psutil.Process(pid).ppid() for pid in children.values()}
    assert len(servers) == 1
    server = psutil.Process(servers.pop())
    supervisor = psutil.Process(fleet.pid)
    assert server.ppid() == supervisor.pid
    helpers = supervisor.children()
    assert server in helpers and len(helpers) == 2  # and the resource tracker
    assert all(p.cmdline() == supervisor.cmdline() for p in helpers)
    os.kill(fleet.pid, signal.SIGKILL)
    wait_until(lambda: not group_alive(fleet.pid), 30, what="no process of the fleet left")
