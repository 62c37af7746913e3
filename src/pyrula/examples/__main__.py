"""``python -m pyrula.examples`` (what ``make run`` starts).

Runs the example app on the embedded SQLite store: a worker in this process, and a
stream of example runs submitted to it, each printed as it completes. A big order waits
for an ``approved`` signal, which this script sends; a digest sleeps and continues as
new. Ctrl+C drains the worker and exits. ``--runs N`` stops after N orders.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import Any

import pyrula.examples  # noqa: F401  (registers the example workflows)
from pyrula import logs
from pyrula.workflows import SQLiteStore, WorkerOptions, WorkflowClient, WorkflowWorker


async def submit_stream(client: WorkflowClient, runs: int | None, stop: asyncio.Event) -> None:
    i = 0
    pending: set[asyncio.Task[None]] = set()
    digest = await client.submit("nightly_digest", {"days": 3, "interval": 1.0})
    pending.add(asyncio.create_task(report(client, "nightly_digest", digest.run_id)))
    while not stop.is_set() and (runs is None or i < runs):
        i += 1
        amount = 1500.0 if i % 5 == 0 else 20.0 * i
        handle = await client.submit(
            "process_order",
            {"order_id": f"order-{i}", "amount": amount, "items": ["tea", "cup"]},
            owner=f"tenant-{i % 3}",
        )
        if amount >= 1000:
            pending.add(asyncio.create_task(approve_later(client, handle.run_id)))
        pending.add(asyncio.create_task(report(client, f"order-{i}", handle.run_id)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.3)
    await asyncio.gather(*pending)


async def approve_later(client: WorkflowClient, run_id: str) -> None:
    await asyncio.sleep(1.0)
    info = await client.get(run_id)
    print(f"  {run_id[-8:]} is {info.status.value} for approval; sending 'approved'")
    await client.signal(run_id, "approved", True)


async def report(client: WorkflowClient, label: str, run_id: str) -> None:
    try:
        result: Any = await client.result(run_id, timeout=60)
    except Exception as exc:  # show failures as they are
        print(f"  {label:<15} {run_id[-8:]}  {type(exc).__name__}: {exc}")
        return
    info = await client.get(run_id)
    print(f"  {label:<15} {run_id[-8:]}  {info.status.value:<9} attempt={info.attempt} "
          f"{result}")


async def main(path: str, runs: int | None) -> None:
    store = SQLiteStore(path)
    worker = WorkflowWorker(
        store=store, options=WorkerOptions(timer_poll_interval_s=0.25, health_port=0)
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    serving = asyncio.create_task(worker.run())
    while worker.health_address is None and not serving.done():
        await asyncio.sleep(0.01)
    print(f"pyrula example app on {path}; worker {worker.worker_id}; probes at "
          f"http://{worker.health_address[0]}:{worker.health_address[1]}/readyz" if
          worker.health_address else "")
    print("submitting example runs (Ctrl+C to stop)")
    await submit_stream(worker.client, runs, stop)
    worker.stop()
    await serving
    store.close()
    print("drained; bye")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m pyrula.examples")
    parser.add_argument("--db", default="pyrula.db", help="SQLite file (default ./pyrula.db)")
    parser.add_argument("--runs", type=int, default=None, help="stop after this many orders")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args()
    logs.configure("text", args.log_level)
    asyncio.run(main(args.db, args.runs))
