"""The Valkey store under load: throughput, latency, commands and round trips per run.

Scenarios (each on a fresh Valkey 9 server of its own, on a free port):
- throughput: N runs of a 1-step (x + 1) or 5-step workflow are submitted first, then W
  worker processes start; the clock runs from their start until every result is read back.
- latency: 300 sequential submit -> result on a warm, idle worker (p50/p99).
Commands per run come from INFO commandstats (script-inner commands included); round
trips per run are counted by the store objects themselves (clients and workers).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from tests.servers import start_server

from pyrula.workflows import ValkeyStore, WorkflowClient

ROOT = Path(__file__).resolve().parents[1]


def _commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_")
               and k not in ("cmdstat_info", "cmdstat_config|resetstat"))


def _server_cpu(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return round(float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), 3)


def _start_workers(url: str, ns: str, count: int, concurrency: int) -> list[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    return [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.worker", url, ns, str(concurrency)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )
        for _ in range(count)
    ]


def _stop_workers(procs: list[subprocess.Popen[str]]) -> dict[str, float]:
    totals: dict[str, float] = {"round_trips": 0, "runs": 0, "cpu_s": 0.0}
    for proc in procs:
        proc.terminate()
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if not lines:
            raise RuntimeError(f"bench worker printed no stats:\n{err[-2000:]}")
        stats = json.loads(lines[-1])
        totals["round_trips"] += stats["round_trips"]
        totals["runs"] += stats["runs"]
        totals["cpu_s"] += stats.get("cpu_s", 0.0)
    return totals


async def _submit_all(store: ValkeyStore, name: str, runs: int) -> list[str]:
    client = WorkflowClient(store)
    ids: list[str] = []
    batch = 200
    for start in range(0, runs, batch):
        handles = await asyncio.gather(
            *(client.submit(name, {"x": i}) for i in range(start, min(runs, start + batch)))
        )
        ids.extend(h.run_id for h in handles)
    return ids


async def _read_all(store: ValkeyStore, ids: list[str]) -> None:
    for run_id in ids:
        info = await store.wait_result(run_id, timeout=600)
        if info.status != "completed":
            raise RuntimeError(f"run {run_id} ended {info.status}: {info.error}")


async def throughput(url: str, steps: int, workers: int, runs: int,
                     concurrency: int) -> dict[str, Any]:
    ns = f"bench{os.urandom(3).hex()}"
    name = "bench_1step" if steps == 1 else "bench_5step"
    store = ValkeyStore(url=url, namespace=ns)
    direct = redis.Redis.from_url(url)
    direct.config_resetstat()
    at_start = _commands(direct)
    ids = await _submit_all(store, name, runs)
    submit_trips = store.stats["round_trips"]
    before = _commands(direct)
    submit_commands = before - at_start
    store.stats["round_trips"] = 0
    started = time.perf_counter()
    procs = _start_workers(url, ns, workers, concurrency)
    try:
        await _read_all(store, ids)
        elapsed = time.perf_counter() - started
    finally:
        worker_stats = _stop_workers(procs)
    commands = _commands(direct) - before
    server_cpu = _server_cpu(direct)
    read_trips = store.stats["round_trips"]
    await store.aclose()
    return {
        "scenario": f"throughput {steps}-step, {workers} worker process(es)",
        "runs": runs,
        "seconds": round(elapsed, 3),
        "runs_per_s": round(runs / elapsed, 1),
        "commands_per_run": round((submit_commands + commands) / runs, 1),
        "commands_per_run_submit": round(submit_commands / runs, 1),
        "commands_per_run_execution_and_read": round(commands / runs, 1),
        "worker_round_trips_per_run": round(worker_stats["round_trips"] / runs, 2),
        "submit_round_trips_per_run": round(submit_trips / runs, 2),
        "read_round_trips_per_run": round(read_trips / runs, 2),
        "worker_cpu_s_per_1000_runs": round(worker_stats["cpu_s"] / runs * 1000, 3),
        "valkey_cpu_s_total": server_cpu,
        "worker_processes_startup_included": True,
    }


async def latency(url: str, steps: int, samples: int) -> dict[str, Any]:
    ns = f"lat{os.urandom(3).hex()}"
    name = "bench_1step" if steps == 1 else "bench_5step"
    store = ValkeyStore(url=url, namespace=ns)
    client = WorkflowClient(store)
    procs = _start_workers(url, ns, 1, 50)
    try:
        # Warm up: the worker has started, loaded the script and claimed something.
        for i in range(20):
            handle = await client.submit(name, {"x": i})
            await client.result(handle.run_id, timeout=60)
        times = []
        for i in range(samples):
            t0 = time.perf_counter()
            handle = await client.submit(name, {"x": i})
            await client.result(handle.run_id, timeout=60)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        _stop_workers(procs)
    await store.aclose()
    times.sort()
    return {
        "scenario": f"latency {steps}-step, warm idle worker, {samples} sequential runs",
        "p50_ms": round(statistics.median(times), 2),
        "p99_ms": round(times[int(len(times) * 0.99) - 1], 2),
        "mean_ms": round(statistics.fmean(times), 2),
    }


async def main_async(args: Any) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp))
        try:
            for steps in args.steps:
                for workers in args.workers:
                    result = await throughput(server.url, steps, workers, args.runs,
                                              args.concurrency)
                    print(json.dumps(result), flush=True)
                    results.append(result)
                result = await latency(server.url, steps, args.samples)
                print(json.dumps(result), flush=True)
                results.append(result)
        finally:
            server.stop()
    return results
