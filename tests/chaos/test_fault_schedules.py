"""Randomised fault schedules: from a seed, a store (SQLite, Valkey, a Valkey cluster), a
load and a sequence of faults at drawn moments (children killed, stopped for a drawn
while, drained; a standalone worker killed and started again; the whole fleet killed and
started again; the Valkey server killed and started again; the SQLite file locked by
another process; a cluster failover), applied to a real fleet under that load. Once every
run has ended the invariant checker judges: no run lost or completed twice, no recorded
step run again, every re-run inside the window and attributed to its fault, every result
right.

``make test`` runs the seeds of ``FIXED_SEEDS`` (one per store); ``make fuzz`` runs
``FUZZ_RUNS`` new ones, or exactly ``SEED``. A failing seed prints its schedule and the
command that runs it again (``make fuzz SEED=<seed>``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pyrula.workflows import SQLiteStore, SyncWorkflowClient, ValkeyStore
from pyrula.workflows.stores.base import Store
from tests.chaos.harness import APP, ChaosLoad
from tests.chaos.nemesis import ScheduledNemesis
from tests.chaos.schedule import (
    CHILD_TIMEOUT,
    CLUSTER,
    FLEET_FAULTS,
    LOCK_TTL,
    SQLITE,
    STORE_FAULTS,
    STORES,
    VALKEY,
    WORKER_FAULTS,
    Schedule,
    draw,
)
from tests.fleet.fleetprocs import QUICK, STORE_FILE, Fleet, Fleets, child_env
from tests.integration.workerprocs import WorkerProcess
from tests.servers import Cluster, Server, free_port, start_cluster, start_server

#: The seeds ``make test`` runs: one schedule on each store, each of a few seconds of
#: faults, every kind of fault among them.
FIXED_SEEDS = (2003, 2703, 2600)
NAMESPACE = "fuzz"


def seeds() -> list[int]:
    """``PYRULA_FUZZ_SEED`` alone when set; else ``PYRULA_FUZZ_RUNS`` seeds from
    ``PYRULA_FUZZ_FROM`` on (``make fuzz`` draws that once, so every xdist worker collects
    the same seeds); else ``FIXED_SEEDS``."""
    one = os.environ.get("PYRULA_FUZZ_SEED", "").strip()
    if one:
        return [int(one)]
    runs = int(os.environ.get("PYRULA_FUZZ_RUNS", "").strip() or 0)
    if runs:
        first = int(os.environ.get("PYRULA_FUZZ_FROM", "").strip() or 1)
        return [first + i for i in range(runs)]
    return list(FIXED_SEEDS)


def _params() -> list[object]:
    marks = {CLUSTER: [pytest.mark.cluster, pytest.mark.valkey], VALKEY: [pytest.mark.valkey],
             SQLITE: []}
    return [pytest.param(seed, id=f"seed={seed}", marks=marks[draw(seed).store])
            for seed in seeds()]


def test_the_fixed_seeds_cover_every_store_and_each_seed_draws_one_schedule() -> None:
    assert sorted(draw(seed).store for seed in FIXED_SEEDS) == sorted(STORES)
    every_kind = set(FLEET_FAULTS).union(WORKER_FAULTS, *STORE_FAULTS.values())
    assert {f.kind for seed in FIXED_SEEDS for f in draw(seed).faults} == every_kind
    for seed in (*FIXED_SEEDS, 12345):
        assert draw(seed) == draw(seed) and draw(seed).text() == draw(seed).text()
    assert len({draw(seed).text() for seed in range(50)}) == 50
    schedule = draw(1)
    assert schedule.text().startswith("fault schedule seed=1: ")
    assert "replay: make fuzz SEED=1" in schedule.text()
    for drawn in map(draw, range(200)):  # each store is dealt its own faults only
        kinds = set(FLEET_FAULTS) | set(STORE_FAULTS[drawn.store])
        kinds |= set(WORKER_FAULTS) if drawn.workers else set()
        assert {f.kind for f in drawn.faults} <= kinds, drawn.text()


def test_a_seed_draws_the_schedule_it_drew_before() -> None:
    """A seed reported as failing must replay the schedule it failed with: a change to
    ``draw`` that moves this one moves every seed a report names."""
    assert draw(2600).text() == "\n".join([
        "fault schedule seed=2600: cluster store, 3 children, 110 runs of 4 async steps "
        "holding 0.14 s, 3 faults (replay: make fuzz SEED=2600)",
        "  t+ 1.17 s  50 runs, then CLUSTER FAILOVER replica 2",
        "  t+ 2.10 s  60 runs, then SIGTERM slot 1",
        "  t+ 3.41 s  20 runs, then kill -9 slot 1"])


@contextmanager
def replayable(schedule: Schedule) -> Iterator[None]:
    """A failure inside says which seed failed and how to run it again."""
    try:
        yield
    except BaseException as exc:
        exc.add_note(f"seed {schedule.seed} failed; run it again with: {schedule.replay()}\n"
                     f"{schedule.text()}")
        raise


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", _params())
def test_a_fault_schedule_keeps_every_invariant(fleets: Fleets, tmp_path: Path,
                                                 seed: int) -> None:
    schedule = draw(seed)
    print(schedule.text(), flush=True)
    with (replayable(schedule), _store(schedule, tmp_path) as (store, url, server, cluster),
          _Workers(tmp_path, _options(schedule), url) as workers):
        load = ChaosLoad(SyncWorkflowClient(store), tmp_path, steps=schedule.steps,
                         hold=schedule.hold, kind=schedule.kind, seed=seed)
        nemesis = ScheduledNemesis(
            schedule, load, lambda: fleets.start("-n", str(schedule.children), "--child-timeout",
                                                 str(CHILD_TIMEOUT), *_options(schedule),
                                                 app=APP, store=url),
            server=server, cluster=cluster, sqlite_path=str(tmp_path / STORE_FILE),
            start_worker=workers.start)
        try:
            nemesis.fleet.wait_ready(schedule.children, timeout=60)
            load.submit(schedule.runs)
            nemesis.begin()
            load.wait_all(timeout=150, during=nemesis)
        finally:
            nemesis.close()
            print("landed:", *nemesis.landed, sep="\n  ")
        assert nemesis.struck == len(schedule.faults), nemesis.landed
        assert len(load.expected) == schedule.total_runs
        everyone: list[Fleet | WorkerProcess] = [*nemesis.fleets, *workers.started]
        report = load.verdict(store, [process.log() for process in everyone])
        load.assert_holds(report)
        # What runs at the end drains cleanly.
        nemesis.fleet.wait_ready(schedule.children, timeout=60)
        running: list[Fleet | WorkerProcess] = [nemesis.fleet, *workers.started[-1:]]
        for process in running:
            process.send(signal.SIGTERM)
        for process in running:
            assert process.wait(60) == 0, process.log()[-6000:]


def _options(schedule: Schedule) -> list[str]:
    """The options of the schedule's fleets and workers alike."""
    # On Valkey, a worker that joins (or a fleet started again) takes its share of the
    # shards within a second, and a killed fleet's shard leases lapse within three.
    valkey = [] if schedule.store == SQLITE else [
        "--namespace", NAMESPACE, "--shard-lease-interval", "1", "--shard-lease-ttl", "3"]
    # Repeated faults can land on one run many times: this is about loss and re-runs, not
    # the poison limit. 20 slots a process keep its suspects' drain short.
    return ["--lock-ttl", str(LOCK_TTL), "--orphan-scan-interval", "0.5",
            "--poison-max-retries", "50", "--max-concurrent-runs", "20", *valkey, *QUICK]


class _Workers:
    """Standalone ``pyrula worker`` processes over the schedule's store, each with a health
    port; every one is reaped at the end."""

    def __init__(self, directory: Path, options: list[str], url: str) -> None:
        self.directory = directory
        self.args = ["worker", "--app", APP, "--store", url, *options]
        self.started: list[WorkerProcess] = []

    def start(self) -> tuple[WorkerProcess, int]:
        port = free_port()
        worker = WorkerProcess(self.directory, f"worker-{len(self.started)}",
                               [*self.args, "--health-port", str(port)], child_env())
        self.started.append(worker)
        return worker, port

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        for worker in self.started:
            worker.reap()


@contextmanager
def _store(schedule: Schedule, tmp_path: Path
           ) -> Iterator[tuple[Store, str, Server | None, Cluster | None]]:
    """The schedule's store: (the test's store, the fleet's URL, the Valkey server, the
    cluster); servers of the test's own, free to kill."""
    if schedule.store == SQLITE:
        store = SQLiteStore(tmp_path / STORE_FILE)
        try:
            yield store, f"sqlite:///{STORE_FILE}", None, None
        finally:
            store.close()
        return
    server = cluster = None
    if schedule.store == VALKEY:
        # Every write is on disk before it is acknowledged: a restart loses nothing.
        server = start_server(tmp_path / "valkey", appendonly="yes", appendfsync="always")
        url = server.url
    else:
        cluster = start_cluster(tmp_path / "cluster", primaries=3, replicas_per_primary=1)
        url = cluster.url
    valkey = ValkeyStore(url, namespace=NAMESPACE, socket_timeout=2.0)
    try:
        yield valkey, url, server, cluster
    finally:
        valkey.close()
        if server is not None:
            server.kill()
        if cluster is not None:
            cluster.kill()
