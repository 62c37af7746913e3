"""A crash loop is reported, not spun: children that cannot boot stop the fleet after
``--max-boot-failures`` attempts, with the last child's error and a non-zero exit."""

from __future__ import annotations

from pathlib import Path

from tests.fleet.fleetprocs import Fleets, write_app
from tests.servers import free_port

EXIT_BOOT_FAILURE = 3  # pyrula.wire.EXIT_BOOT_FAILURE


def test_an_app_that_raises_at_import_stops_the_fleet_after_max_boot_failures(
    fleets: Fleets, tmp_path: Path
) -> None:
    write_app(tmp_path, 'raise RuntimeError("broken app: boom-4242")\n', module="brokenapp")
    fleet = fleets.start("-n", "1", "--max-boot-failures", "3", app="brokenapp")
    assert fleet.wait(30) == EXIT_BOOT_FAILURE
    log = fleet.log()
    assert log.count("child_spawned") == 3
    assert log.count("child_boot_failed: RuntimeError: broken app: boom-4242") == 3
    assert "fleet_crash_loop: 3 children in a row exited before becoming ready" in log
    assert "the last one said: RuntimeError: broken app: boom-4242" in log


def test_a_store_the_children_cannot_reach_stops_the_fleet_after_max_boot_failures(
    fleets: Fleets,
) -> None:
    # Nothing listens there: the supervisor's own store client connects lazily, each
    # child fails its startup checks.
    dead = free_port()
    url = f"redis://127.0.0.1:{dead}"
    fleet = fleets.start("-n", "1", "--max-boot-failures", "2", store=url,
                         port=free_port(avoid=[dead]))
    assert fleet.wait(60) == EXIT_BOOT_FAILURE
    log = fleet.log()
    assert log.count("child_spawned") == 2
    assert log.count("child_boot_failed: StoreUnavailable") == 2
    assert "fleet_crash_loop: 2 children in a row exited before becoming ready; the last " \
           "one said: StoreUnavailable" in log


def test_a_store_the_supervisor_cannot_open_is_a_configuration_error(fleets: Fleets) -> None:
    fleet = fleets.start("-n", "1", store="sqlite:///missing-dir/store.db")
    assert fleet.wait(30) == 2
    log = fleet.log()
    assert "configuration error: SQLite store directory does not exist" in log
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
