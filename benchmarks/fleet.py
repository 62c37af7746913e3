"""``python -m benchmarks.fleet``: how fast a fleet recovers. Measured, never asserted.

Real ``pyrula-fleet`` processes (the helpers of ``tests/fleet``), /status and the store
polled every few milliseconds:

- respawn: kill -9 a child holding runs -> a new child ready in its slot;
- resume: kill -9 -> every run the killed child held is running (or done) in attempt 2
  on another child (the supervisor requeues them at once: the default lock_ttl of 15 s
  and orphan scan of 60 s are left alone, so nothing here waits for them);
- shard convergence on Valkey (a fresh server of its own): a second fleet joins (timed
  from its children being ready), leaves (from its SIGTERM), and a child is killed (from
  the kill, and from its replacement being ready) -> every child within one of
  shard_count / N again. The target is 2 x shard_lease_interval.

Repeated kills in one slot are respawned with the restart policy's backoff for children
that die young (0.1, 0.2, 0.4 s...): that is part of the respawn figures.

Prints one JSON line per measurement and a summary. Run from the repository root:
``PYTHONPATH=src python -m benchmarks.fleet`` (the fleets always run this tree's ``src``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fleet.fleetprocs import STORE_FILE, Fleet, Fleets, ready
from tests.servers import start_server

from pyrula.workflows import SQLiteStore, SyncWorkflowClient

POLL = 0.005
QUICK = ("--shutdown-grace", "5", "--cancel-timeout", "1")


def _until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(POLL)


def _emit(record: dict[str, Any]) -> dict[str, Any]:
    print(json.dumps(record), flush=True)
    return record


def measure_crash_recovery(directory: Path, samples: int) -> list[dict[str, Any]]:
    """kill -9 a child holding gated runs; time its replacement and its runs' resumption."""
    fleets = Fleets(directory)
    store = SQLiteStore(directory / STORE_FILE)
    client = SyncWorkflowClient(store)
    results = []
    try:
        fleet = fleets.start("-n", "2", *QUICK)
        fleet.wait_ready(2)
        for sample in range(samples):
            tags = [f"s{sample}-{i}" for i in range(6)]
            runs = {tag: client.submit("fa_gated", {"tag": tag}) for tag in tags}
            _until(lambda runs=runs: all(client.get(r.run_id).status == "running"
                                         for r in runs.values()), 30, "runs running")
            busy = fleet.wait_status(
                lambda s, n=len(tags): len(ready(s)) == 2
                and sum(c["in_flight"] for c in s["children"]) == n, what="runs in flight")
            holder = {tag: [e for e in client.events(run.run_id)
                            if e["type"] == "run:started"][-1]["worker"]
                      for tag, run in runs.items()}
            victim = max(busy["children"],
                         key=lambda c: list(holder.values()).count(c["worker_id"]))
            held = [tag for tag, worker in holder.items() if worker == victim["worker_id"]]
            killed = time.monotonic()
            os.kill(victim["pid"], signal.SIGKILL)

            def replaced(slot: int = victim["slot"], pid: int = victim["pid"]) -> bool:
                status = fleet.status()
                return status is not None and any(
                    c["slot"] == slot and c["pid"] != pid and c["state"] == "ready"
                    for c in status["children"])

            def resumed(held: list[str] = held, runs: dict[str, Any] = runs) -> bool:
                infos = [client.get(runs[tag].run_id) for tag in held]
                return all(i.attempt == 2 and i.status in ("running", "completed")
                           for i in infos)

            respawn = resume = None
            deadline = time.monotonic() + 30
            while respawn is None or resume is None:
                if respawn is None and replaced():
                    respawn = time.monotonic() - killed
                if resume is None and resumed():
                    resume = time.monotonic() - killed
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no recovery after 30 s: {fleet.log()[-3000:]}")
                time.sleep(POLL)
            for tag in tags:
                fleets.open_gate(tag)
            for run in runs.values():
                client.result(run.run_id, timeout=30)
            results.append(_emit({"measure": "kill -9", "sample": sample,
                                  "runs_held": len(held),
                                  "respawn_ready_s": round(respawn, 4),
                                  "runs_resumed_s": round(resume, 4)}))
            fleet.wait_ready(2)
        fleet.send(signal.SIGTERM)
        fleet.wait()
    finally:
        fleets.reap()
        store.close()
    return results


def _balanced(statuses: list[dict[str, Any]], children: int, shards: int) -> bool:
    held = [c["shards"].get("fa_load", 0) for s in statuses for c in s["children"]
            if c["state"] == "ready"]
    return (len(held) == children and sum(held) == shards
            and all(abs(n - shards / children) <= 1 for n in held))


def _converge(fleets_: list[Fleet], children: int, shards: int, since: float) -> float:
    def check() -> bool:
        statuses = [f.status() for f in fleets_]
        return all(s is not None for s in statuses) and _balanced(
            [s for s in statuses if s is not None], children, shards)

    _until(check, 60, f"{children} children balanced")
    return time.monotonic() - since


def measure_shards(directory: Path, interval: float, ttl: float,
                   samples: int) -> list[dict[str, Any]]:
    server = start_server(directory / "valkey")
    fleets = Fleets(directory)
    results = []
    options = ("-n", "2", "--workflow", "fleetapp:load", "--namespace", "bench",
               "--shard-lease-interval", str(interval), "--shard-lease-ttl", str(ttl), *QUICK)
    try:
        a = fleets.start(*options, app=None, store=server.url, name="fleet-a")
        a.wait_ready(2)
        _converge([a], 2, 64, time.monotonic())
        for sample in range(samples):
            b = fleets.start(*options, app=None, store=server.url, name=f"fleet-b{sample}")
            b.wait_ready(2)
            join = _converge([a, b], 4, 64, time.monotonic())
            left_at = time.monotonic()
            b.send(signal.SIGTERM)
            b.wait()
            leave = _converge([a], 2, 64, left_at)
            # Alternate slots: a slot whose children die young is respawned with backoff.
            status = a.wait_status(lambda s: len(ready(s)) == 2, what="ready")
            victim = status["children"][sample % 2]
            killed = time.monotonic()
            os.kill(victim["pid"], signal.SIGKILL)
            a.wait_status(lambda s, v=victim: any(
                c["slot"] == v["slot"] and c["pid"] != v["pid"] and c["state"] == "ready"
                for c in s["children"]), what="the replacement")
            replaced = time.monotonic()
            crash = _converge([a], 2, 64, killed)
            results.append(_emit({
                "measure": "shard convergence", "sample": sample, "interval_s": interval,
                "ttl_s": ttl, "target_s": 2 * interval, "join_s": round(join, 4),
                "leave_s": round(leave, 4), "kill9_s": round(crash, 4),
                "kill9_after_replacement_ready_s": round(killed + crash - replaced, 4)}))
        a.send(signal.SIGTERM)
        a.wait()
    finally:
        fleets.reap()
        server.kill()
    return results


def _summary(values: list[float]) -> str:
    return (f"median {statistics.median(values) * 1000:.0f} ms, "
            f"max {max(values) * 1000:.0f} ms (n={len(values)})")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--lease-interval", type=float, default=0.5)
    parser.add_argument("--lease-ttl", type=float, default=30.0,
                        help="long on purpose: convergence must not wait for a lapse")
    parser.add_argument("--no-valkey", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pyrula-bench-fleet-") as tmp:
        for sub in ("crash", "shards"):
            (Path(tmp) / sub).mkdir()
        crash = measure_crash_recovery(Path(tmp) / "crash", args.samples)
        shards: list[dict[str, Any]] = []
        if not args.no_valkey:
            shards = measure_shards(Path(tmp) / "shards", args.lease_interval, args.lease_ttl,
                                    args.samples)
    print("respawn (kill -9 -> replacement ready):",
          _summary([r["respawn_ready_s"] for r in crash]))
    print("resume (kill -9 -> its runs running in attempt 2):",
          _summary([r["runs_resumed_s"] for r in crash]))
    for key in ("join_s", "leave_s", "kill9_s", "kill9_after_replacement_ready_s"):
        if shards:
            print(f"shard convergence, {key[:-2]} (target {2 * args.lease_interval:.1f} s):",
                  _summary([r[key] for r in shards]))


if __name__ == "__main__":
    main()
