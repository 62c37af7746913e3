"""The embedded SQLite store on a small filesystem that fills up under a loaded fleet, and
then has room again.

While the disk is full every write fails with SQLite's "database or disk is full": a
submit is refused with ``StoreUnavailable`` naming that cause (nothing was acknowledged,
so nothing can be lost); an attempt whose write fails puts its run back (``run:requeued``
reason ``store_unavailable``) once a write lands, rather than failing it for an
infrastructure error; the loops log ``loop_failed`` once and go on with back-off. When
space returns, every acknowledged run completes, the file passes ``PRAGMA
integrity_check``, and no child was restarted.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.workflows import SQLiteStore, StoreUnavailable, SyncWorkflowClient
from tests.chaos.harness import APP, ChaosLoad
from tests.fleet.fleetprocs import QUICK, Fleets
from tests.tools import needs_tool

pytestmark = pytest.mark.slow

FULL_S = 3.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of the test's own (mounting needs root: skipped otherwise)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    needs_tool("a full disk (the SQLite disk-full scenario)",
               None if done.returncode == 0
               else f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def fill(directory: Path) -> Path:
    """Write a file in ``directory`` until its filesystem has no byte left."""
    filler = directory / "filler"
    chunk = b"\0" * (1 << 16)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        try:  # the last few bytes
            while True:
                f.write(b"\0" * 512)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    return filler


def test_a_submit_on_a_full_disk_is_refused_naming_the_cause(small_disk: Path) -> None:
    path = small_disk / "store.db"
    store = SQLiteStore(path)
    try:
        client = SyncWorkflowClient(store)
        first = client.submit("w", {"x": 0}).run_id
        filler = fill(small_disk)
        # Small params fail at the commit; a big one already while SQLite writes it out.
        for size in (10, 1_000_000):
            with pytest.raises(StoreUnavailable, match="the disk is full"):
                client.submit("w", {"x": "a" * size})
        assert client.get(first).status == "queued"  # reads still work
        filler.unlink()
        again = client.submit("w", {"x": "a" * 1_000_000}).run_id
        assert client.get(again).status == "queued"
    finally:
        store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (2,)


def test_sqlite_store_on_a_disk_that_fills_up(fleets: Fleets, tmp_path: Path,
                                              small_disk: Path) -> None:
    path = small_disk / "store.db"
    store = SQLiteStore(path)
    try:
        # The ledger and the logs live on tmp_path: the fault touches the store alone.
        load = ChaosLoad(SyncWorkflowClient(store), tmp_path, steps=3, hold=0.5, seed=31)
        fleet = fleets.start("-n", "2", "--orphan-scan-interval", "1", *QUICK, app=APP,
                             store=f"sqlite:///{path}")
        fleet.wait_ready(2, timeout=60)
        load.submit(300)  # a backlog: the fleet keeps writing while the disk is full
        refused: list[str] = []
        phase = ["load"]
        filled_at = [0.0]
        filler: list[Path] = []

        def nemesis() -> bool:
            if phase[0] == "load":
                status = fleet.status()
                if status is not None and sum(c["in_flight"] for c in status["children"]):
                    filler.append(fill(small_disk))
                    load.fault("disk full", small_disk)
                    phase[0], filled_at[0] = "full", time.monotonic()
                else:
                    load.submit(20)
            elif phase[0] == "full":
                try:  # a submit while the disk is full is refused, and says why
                    load.submit(1)
                except StoreUnavailable as exc:
                    refused.append(str(exc))
                # Space the files already hold is reused for a while: the disk is full
                # for real once writes keep failing, for the workers too.
                bit = len(refused) >= 5 and "disk is full" in fleet.log()
                if bit and time.monotonic() - filled_at[0] >= FULL_S:
                    filler[0].unlink()
                    load.fault("space again", small_disk)
                    phase[0] = "free"
                    load.submit(50)  # and work goes on
            return phase[0] != "free"

        load.wait_all(timeout=120, during=nemesis)
        assert load.count("disk full") == load.count("space again") == 1
        report = load.verdict(store, [fleet.log()])
        load.assert_holds(report)  # every acknowledged run completed, none failed
        assert set(load.requeues()) <= {"store_unavailable"}, load.requeues()
        assert set(report.faults) <= {"store_unavailable"}, report.faults
        assert refused and all("the disk is full" in text for text in refused), refused[:3]
        log = fleet.log()
        assert "the disk is full (database or disk is full)" in log  # the workers met it
        assert log.count("Traceback") == 0, log[-4000:]
        status = fleet.wait_ready(2, timeout=30)
        assert status["restarts"] == 0, status
        fleet.send(signal.SIGTERM)
        assert fleet.wait(60) == 0
    finally:
        store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert os.path.getsize(path) > 0
