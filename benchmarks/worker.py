"""A benchmark worker process: serves the bench workflows until SIGTERM, then prints its
store's round-trip count as one JSON line."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import psutil

import benchmarks.workflows  # noqa: F401  (registers the bench workflows)
from pyrula.workflows import ValkeyStore, WorkerOptions, WorkflowWorker


async def main(url: str, namespace: str, concurrency: int) -> None:
    store = ValkeyStore(url=url, namespace=namespace)
    worker = WorkflowWorker(
        store=store,
        options=WorkerOptions(max_concurrent_runs=concurrency, shard_lease_interval=1.0,
                              shutdown_grace=5.0),
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, worker.stop)
    await worker.run()
    cpu = psutil.Process().cpu_times()
    print(json.dumps({"round_trips": store.stats["round_trips"], "runs": worker.runs_done,
                      "cpu_s": round(cpu.user + cpu.system, 3)}), flush=True)
    await store.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
