"""Child workflows under faults: a fleet over Valkey runs parents that each fan out to
their children with ``ctx.gather_children`` while the fleet's children are killed with
SIGKILL and the Valkey server is killed and restarted (append-only file, fsync on every
write). Each child runs one sync step that records itself in the side-effect ledger.

The verdict: every parent completes with every child's result in order; each (parent,
index) is exactly one child run, and no step ran in a run that is not one of those (a
second child started for the same index, then lost, would show there). A step may run
twice across a kill (steps are at least once); the count is printed. The order of the
faults is drawn from a seed (printed, so a failure can be replayed).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from pyrula.invariants import check_once, holdings, read_ledger
from pyrula.workflows import RunInfo, RunStatus, StoreUnavailable, SyncWorkflowClient, ValkeyStore
from tests.chaos.harness import kill_a_ready_child, restart_valkey
from tests.conftest import wait_until
from tests.fleet.fleetprocs import Fleet, Fleets, ready, write_app
from tests.servers import Server, start_server

pytestmark = pytest.mark.slow

APP = "chaoschildren"
PARENT, CHILD = "chaos_kids.parent", "chaos_kids.child"
APP_TEXT = f'''
"""Parents fanning out to children, for the child workflows chaos test (written by it)."""

import time

from pyrula.invariants import Ledger
from pyrula.workflows import step, workflow

_ledgers = {{}}


@step(name="chaos_kids.work")
def work(i, ledger):
    started = time.time()
    time.sleep(0.1)  # a kill lands while children are in their step
    book = _ledgers.get(ledger) or _ledgers.setdefault(ledger, Ledger(ledger))
    book.record(i * i, started=started)
    return i * i


@workflow(name="{CHILD}")
async def child(ctx, params):
    return await work(params["i"], params["ledger"])


@workflow(name="{PARENT}")
async def parent(ctx, params):
    specs = [("{CHILD}", {{"i": i, "ledger": params["ledger"]}}) for i in range(params["n"])]
    return await ctx.gather_children(specs, max_concurrency=20)
'''
PARENTS, CHILDREN = 10, 100
KILLS = 3


def _submit_parents(client: SyncWorkflowClient, ledger: Path) -> dict[str, str]:
    """Submit every parent, sending again (same key) any a fault refused."""
    submitted: dict[str, str] = {}
    while len(submitted) < PARENTS:
        key = f"parent{len(submitted)}"
        try:
            submitted[key] = client.submit(
                PARENT, {"n": CHILDREN, "ledger": str(ledger)}, idempotency_key=key
            ).run_id
        except (StoreUnavailable, OSError):
            time.sleep(0.1)
    return submitted


def _steps_done(ledger: Path) -> int:
    return sum(path.read_bytes().count(b"\n") for path in ledger.glob("ledger-*.jsonl"))


def _inject(fleet: Fleet, valkey: Server, ledger: Path, rng: random.Random) -> list[str]:
    """The faults in a seeded order, each once the children's steps reach its share."""
    faults = ["kill"] * KILLS
    faults.insert(rng.randrange(len(faults) + 1), "restart")
    shares = sorted(rng.uniform(0.1, 0.8) for _ in faults)
    fired: list[str] = []
    deadline = time.monotonic() + 120
    while faults and time.monotonic() < deadline:
        if _steps_done(ledger) < shares[0] * PARENTS * CHILDREN:
            time.sleep(0.05)
            continue
        if faults[0] == "restart":
            restart_valkey(valkey)
        elif not _kill(fleet, rng):
            time.sleep(0.1)
            continue
        fired.append(f"{faults.pop(0)}@{_steps_done(ledger)}")
        shares.pop(0)
    return fired


def _kill(fleet: Fleet, rng: random.Random) -> bool:
    """SIGKILL a ready child, then wait for its replacement (the next kill is of a child
    serving again, not of one the fleet has not yet seen die)."""
    status = fleet.status()
    before = {child["pid"] for child in status["children"]} if status else set()
    try:
        if not kill_a_ready_child(fleet, rng):
            return False
    except ProcessLookupError:  # the status was read before that child ended
        return False
    fleet.wait_status(lambda s: len(ready(s)) == 2 and len({c["pid"] for c in ready(s)}
                                                           - before) == 1,
                      60, what="the killed child replaced")
    return True


def _children_of(client: SyncWorkflowClient, parents: set[str]) -> list[RunInfo]:
    return [info for info in client.list_runs(name=CHILD)
            if info.parent_id in parents]


def _index_of(info: RunInfo) -> str:
    """``parent:index`` from the key the parent gave the child (``...:call:N.index``)."""
    return f"{info.parent_id}:{str(info.idempotency_key).rsplit('.', 1)[1]}"


def test_every_child_runs_once_per_index_through_kills_and_a_restart(
        fleets: Fleets, tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.randrange(2**32))  # to replay one
    print(f"seed={seed}")
    rng = random.Random(seed)
    began = time.monotonic()
    valkey = start_server(tmp_path / "valkey", appendonly="yes", appendfsync="always")
    store = ValkeyStore(valkey.url, namespace="kids", socket_timeout=2.0)
    ledger = tmp_path / "ledger"
    try:
        client = SyncWorkflowClient(store)
        write_app(tmp_path, APP_TEXT, module=APP)
        fleet = fleets.start("-n", "2", "--namespace", "kids", "--lock-ttl", "5",
                             "--orphan-scan-interval", "1", "--shutdown-grace", "5",
                             "--cancel-timeout", "1", "--child-recheck", "2",
                             "--max-concurrent-runs", "16", app=APP, store=valkey.url)
        fleet.wait_ready(2, timeout=60)
        parents = _submit_parents(client, ledger)
        fired = _inject(fleet, valkey, ledger, rng)
        assert len(fired) == KILLS + 1, f"seed={seed}: only {fired} fired"
        steps_at = [int(fault.split("@")[1]) for fault in fired]
        assert max(steps_at) < PARENTS * CHILDREN, f"seed={seed}: {fired} after the load"
        wanted = set(parents.values())

        def ended() -> dict[str, RunInfo] | None:
            try:
                infos = {run: client.get(run) for run in wanted}
            except (StoreUnavailable, OSError):
                return None
            return infos if all(i.status.terminal for i in infos.values()) else None

        infos = wait_until(ended, 120, what="every parent ended")
        for run, info in infos.items():
            assert info.status is RunStatus.COMPLETED, f"seed={seed}: {run} {info.error}"
            assert info.result == [i * i for i in range(CHILDREN)], f"seed={seed}: {run}"
        kids = _children_of(client, wanted)
        acknowledged = {f"{p}:{i}" for p in wanted for i in range(CHILDREN)}
        verdict = check_once("child_runs", acknowledged,
                             holdings((_index_of(info), info.run_id) for info in kids))
        print(verdict.line())
        assert verdict.ok, f"seed={seed}: {verdict.line()} {verdict.problems}"
        assert Counter(info.parent_id for info in kids) == dict.fromkeys(wanted, CHILDREN)
        assert all(info.status is RunStatus.COMPLETED for info in kids)
        ran = Counter(execution.run_id for execution in read_ledger(ledger))
        assert set(ran) == {info.run_id for info in kids}, f"seed={seed}: a step ran " \
            "in a run that is no (parent, index)'s child"
        print(f"children={len(kids)} steps={sum(ran.values())} "
              f"steps_run_twice={sum(1 for n in ran.values() if n > 1)} faults={fired} "
              f"seconds={time.monotonic() - began:.1f}")
        status = fleet.wait_ready(2, timeout=60)
        assert status["restarts"] == KILLS  # every kill landed, and only the kills
        fleet.send(signal.SIGTERM)
        assert fleet.wait(60) == 0
    finally:
        store.close()
        valkey.kill()
