"""What ``durability="replicated"`` costs: the same short workloads on a primary with one
replica, with the store's default durability (``async``) and with ``replicated`` (each
write waits for the replica with ``WAIT 1``), side by side.

``PYTHONPATH=src:. python -m benchmarks.durability [--runs N] [--samples N] [--rounds N]``

Scenarios (one primary and its replica on free ports, both on this machine; the modes
alternate round by round, so a machine that gets busier mid-way slows both alike):
- throughput: N runs of the 5-step workflow submitted first, then 2 worker processes
  start; the clock runs until every result is read back;
- submit latency: sequential submits from one client (p50/p99);
- run latency: sequential submit -> result of a 1-step run on a warm, idle worker.

Speed is measured and reported here, never asserted by a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.servers import Server, start_server

from benchmarks.valkey import _read_all, _start_workers, _stop_workers, _submit_all
from pyrula.workflows import ValkeyStore, WorkflowClient

MODES = ("async", "replicated")


def _url(primary: Server, mode: str) -> str:
    return primary.url + ("?durability=replicated" if mode == "replicated" else "")


def _percentiles(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {"p50_ms": round(statistics.median(times), 3),
            "p99_ms": round(times[max(0, int(len(times) * 0.99) - 1)], 3),
            "mean_ms": round(statistics.fmean(times), 3)}


def _calls(primary: Server) -> dict[str, int]:
    with primary.client(decode_responses=True) as admin:
        stats = admin.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
            for name in ("wait", "fcall", "evalsha")}


async def throughput(primary: Server, url: str, runs: int) -> dict[str, Any]:
    ns = f"dur{os.urandom(3).hex()}"
    store = ValkeyStore(url=url, namespace=ns)
    before = _calls(primary)
    ids = await _submit_all(store, "bench_5step", runs)
    started = time.perf_counter()
    procs = _start_workers(url, ns, 2, 50)
    try:
        await _read_all(store, ids)
        elapsed = time.perf_counter() - started
    finally:
        _stop_workers(procs)
    await store.aclose()
    after = _calls(primary)
    return {"runs": runs, "seconds": round(elapsed, 3), "runs_per_s": round(runs / elapsed, 1),
            # How many scripts one WAIT covered: the requests of one send share it.
            "wait_per_run": round((after["wait"] - before["wait"]) / runs, 2),
            "scripts_per_run": round(sum(after[n] - before[n] for n in ("fcall", "evalsha"))
                                     / runs, 2)}


async def submit_latency(url: str, samples: int) -> dict[str, Any]:
    store = ValkeyStore(url=url, namespace=f"sub{os.urandom(3).hex()}")
    client = WorkflowClient(store)
    await client.submit("bench_1step", {"x": 0})  # the name registered, the script loaded
    times = []
    for i in range(samples):
        t0 = time.perf_counter()
        await client.submit("bench_1step", {"x": i})
        times.append((time.perf_counter() - t0) * 1000)
    await store.aclose()
    return _percentiles(times)


async def run_latency(url: str, samples: int) -> dict[str, Any]:
    ns = f"lat{os.urandom(3).hex()}"
    store = ValkeyStore(url=url, namespace=ns)
    client = WorkflowClient(store)
    procs = _start_workers(url, ns, 1, 50)
    try:
        for i in range(20):  # warm: the worker started, loaded the script, claimed
            handle = await client.submit("bench_1step", {"x": i})
            await client.result(handle.run_id, timeout=60)
        times = []
        for i in range(samples):
            t0 = time.perf_counter()
            handle = await client.submit("bench_1step", {"x": i})
            await client.result(handle.run_id, timeout=60)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        _stop_workers(procs)
    await store.aclose()
    return _percentiles(times)


def _pair(tmp: Path) -> tuple[Server, Server]:
    primary = start_server(tmp / "primary")
    replica = start_server(tmp / "replica", replicaof=f"{primary.host} {primary.port}")
    with primary.client() as admin:
        deadline = time.monotonic() + 30
        while True:  # in sync, and its first acknowledgement (up to a second) behind us
            admin.set("bench:warm", 1)
            if admin.execute_command("WAIT", 1, 1000) == 1:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not catch up with its primary")
        admin.delete("bench:warm")
    return primary, replica


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    samples: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        primary, replica = _pair(Path(tmp))
        try:
            for _ in range(args.rounds):
                for mode in MODES:
                    url = _url(primary, mode)
                    samples.setdefault(("throughput", mode), []).append(
                        await throughput(primary, url, args.runs))
                    samples.setdefault(("submit", mode), []).append(
                        await submit_latency(url, args.samples))
                    samples.setdefault(("run", mode), []).append(
                        await run_latency(url, args.samples))
        finally:
            replica.kill()
            primary.kill()
    results = []
    for (scenario, mode), rounds in samples.items():
        best = (max(rounds, key=lambda r: r["runs_per_s"]) if scenario == "throughput"
                else min(rounds, key=lambda r: r["p50_ms"]))
        result = {"scenario": _TITLES[scenario], "durability": mode, **best,
                  "rounds": len(rounds)}
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


_TITLES = {
    "throughput": "throughput 5-step, 2 worker processes, primary + 1 replica",
    "submit": "submit latency, one client, sequential",
    "run": "latency 1-step submit -> result, warm idle worker",
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.durability")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=300, help="latency samples")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both modes; best kept")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
