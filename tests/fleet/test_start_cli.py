"""``pyrula-fleet start`` as an operator runs it: what it prints and how it exits when the app
cannot boot, when the store cannot be shared, and when -n is far above the host's cores."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.fleet.fleetprocs import Fleets, child_env, write_app

EXIT_BOOT_FAILURE = 3  # pyrula.wire.EXIT_BOOT_FAILURE


def test_an_app_that_cannot_load_is_refused_once_before_any_child_is_forked(
    fleets: Fleets, tmp_path: Path
) -> None:
    # The fork server loads the app before the first fork: a broken app is one refusal
    # with the app's own line, not five children crash-looping.
    write_app(tmp_path, 'raise RuntimeError("boom-5151")\n', module="broken")
    fleet = fleets.start("-n", "2", "--max-boot-failures", "4", app="broken")
    assert fleet.wait(60) == 2
    log = fleet.log()
    assert "error: --app broken raised at import: broken.py:1: RuntimeError: boom-5151" in log
    assert log.count('raise RuntimeError("boom-5151")') == 1, log  # the app's own line
    assert 'broken.py", line 1' in log
    assert "Traceback" not in log
    assert "child_spawned" not in log
    assert "fleet_crash_loop" not in log


def test_a_missing_import_in_the_app_is_shown_once(fleets: Fleets, tmp_path: Path) -> None:
    write_app(tmp_path, "import no_such_module_4711\n", module="needsdep")
    fleet = fleets.start("-n", "1", "--max-boot-failures", "2", app="needsdep")
    assert fleet.wait(60) == 2
    log = fleet.log()
    assert "Traceback" not in log
    # The first line and the exception's: the app's missing dependency, where it is imported.
    assert log.count("ModuleNotFoundError: No module named 'no_such_module_4711'") == 2, log
    assert "error: --app needsdep raised at import: needsdep.py:1: ModuleNotFoundError" in log
    assert 'needsdep.py", line 1' in log
    assert "child_spawned" not in log


def test_a_fleet_that_boots_says_when_every_child_is_ready(fleets: Fleets) -> None:
    import signal

    fleet = fleets.start("-n", "2")
    fleet.wait_ready(2)
    log = fleet.wait_for_log("fleet_ready: 2 of 2 children ready in")
    assert log.index("fleet_started: 2 children spawned") < log.index("fleet_ready")
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def _start(tmp_path: Path, *args: str, cpus: int | None = None,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``pyrula-fleet start *args``; with ``cpus``, as on a host with that many cores."""
    pin = f"import os; os.cpu_count = lambda: {cpus}; " if cpus is not None else ""
    return subprocess.run(
        [sys.executable, "-c", pin + "from pyrula.cli.fleet import main; main()", "start",
         *args],
        cwd=tmp_path, env=env or child_env(), capture_output=True, text=True, timeout=120,
    )


def test_a_memory_store_is_refused_in_one_line(tmp_path: Path) -> None:
    for proc in (
        _start(tmp_path, "--app", "fleetapp", "--store", "memory://"),
        _start(tmp_path, "--app", "fleetapp", env=child_env(PYRULA_STORE_URL="memory://")),
    ):
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            "error: the store URL memory:// is private to one process: each "
            "child would get its own store and nothing else could reach its runs; use "
            "sqlite:///path/to/file.db (one host) or a Valkey URL such as redis://host:6379"
        ]
        assert proc.stdout == ""


def test_more_children_than_four_per_core_is_warned_about_but_started(
    tmp_path: Path,
) -> None:
    write_app(tmp_path, 'raise RuntimeError("stop here")\n', module="stophere")
    common = ("--app", "stophere", "--store", "sqlite:///store.db", "--health-port", "0",
              "--max-boot-failures", "1")
    proc = _start(tmp_path, "-n", "5", *common, cpus=1)
    assert proc.returncode == 2, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "fleet_oversized" in line]
    assert len(warnings) == 1, proc.stderr
    assert "fleet_oversized: 5 children on 1 CPU cores (more than 4 per core)" in warnings[0]
    assert "starting anyway" in warnings[0]
    # It goes on to start: the app is loaded (and refused, here) after the warning.
    assert proc.stderr.index("fleet_oversized") < proc.stderr.index("error: --app stophere")

    proc = _start(tmp_path, "-n", "4", *common, cpus=1)
    assert proc.returncode == 2, proc.stderr
    assert "fleet_oversized" not in proc.stderr




#: Loaded by every interpreter of the fleet (it is on PYTHONPATH): ``os.fork`` fails with
#: EAGAIN, as under RLIMIT_NPROC, after ``FORKS_ALLOWED`` forks by one process. The
#: supervisor forks once (its fork server); the fork server forks each child, so this is
#: the host refusing the fork server its next child. Root, which these tests run as, is
#: exempt from RLIMIT_NPROC itself, so the limit cannot be set for real.
FAILING_FORK = '''
import os

_allowed = os.environ.get("FORKS_ALLOWED")
if _allowed is not None:
    _real_fork, _forks = os.fork, {}

    def _fork():
        me = os.getpid()  # a fork's child starts its own count
        _forks[me] = _forks.get(me, 0) + 1
        if _forks[me] > int(_allowed):
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return _real_fork()

    os.fork = _fork
'''


def test_a_fork_the_host_refuses_kills_the_children_and_stops_in_one_line(
    tmp_path: Path,
) -> None:
    import os

    import psutil

    write_app(tmp_path)
    (tmp_path / "sitecustomize.py").write_text(FAILING_FORK)
    env = child_env(FORKS_ALLOWED="2")
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    proc = _start(tmp_path, "-n", "4", "--app", "fleetapp", "--store", "sqlite:///store.db",
                  "--health-port", "0", env=env)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("error: cannot start child 3 of the fleet: "), proc.stderr
    assert "killed the 2 children started so far" in last
    spawned = [int(line.rsplit(" ", 1)[1]) for line in proc.stderr.splitlines()
               if "child_spawned: slot" in line]
    assert len(spawned) == 2, proc.stderr
    # No orphan keeps the store open: every child it forked is gone.
    for pid in spawned:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
