"""``python -m pyrula.examples`` (what ``make run`` starts).

Runs the example app on the embedded SQLite store: ``pyrula-fleet start -n 2`` serves it,
and this script submits a stream of example runs and prints each as it completes. A big
order waits for an ``approved`` signal, which this script sends; a digest sleeps and
continues as new. Ctrl+C drains the fleet and exits. ``--runs N`` stops after N orders;
``--embedded`` runs one worker in this process instead of the fleet. The first lines
printed are the URLs of the fleet's dashboard (with ``pyrula[http]`` installed) and
metrics, on the fleet's default health port (8081, or ``$PORT``) when it is free.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from typing import Any

import pyrula.examples.orders  # noqa: F401  (registers the example workflows)
from pyrula import logs
from pyrula.config.fleet import resolve_health_port
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
    if stop.is_set():
        for task in pending:
            task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def approve_later(client: WorkflowClient, run_id: str) -> None:
    await asyncio.sleep(1.0)
    info = await client.get(run_id)
    print(f"  {run_id[-8:]} is {info.status.value} for approval; sending 'approved'",
          flush=True)
    await client.signal(run_id, "approved", True)


async def report(client: WorkflowClient, label: str, run_id: str) -> None:
    try:
        result: Any = await client.result(run_id, timeout=60)
    except Exception as exc:  # show failures as they are
        print(f"  {label:<15} {run_id[-8:]}  {type(exc).__name__}: {exc}", flush=True)
        return
    info = await client.get(run_id)
    print(f"  {label:<15} {run_id[-8:]}  {info.status.value:<9} attempt={info.attempt} "
          f"{result}", flush=True)


def health_port(preferred: int) -> int:
    """``preferred`` (the fleet's default health port, 8081 or ``$PORT``) if nothing on
    this host listens there, so that the README's ``curl localhost:8081/metrics`` and a
    bare ``pyrula-fleet status`` reach the example fleet; else a free port (the URLs
    printed first then name it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", preferred))
        except OSError:
            sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_fleet(path: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYRULA_STORE_URL": f"sqlite:///{path}"}
    fleet = os.path.join(os.path.dirname(sys.executable), "pyrula-fleet")
    command = [fleet] if os.path.exists(fleet) else [
        sys.executable, "-c", "from pyrula.cli.fleet import main; main()"]
    return subprocess.Popen(
        [*command, "start", "-n", "2", "--app", "pyrula.examples.orders",
         "--health-port", str(port), "--timer-poll-interval-s", "0.25",
         "--log-level", "WARNING"],
        env=env,
    )


async def main(path: str, runs: int | None, embedded: bool) -> None:
    store = SQLiteStore(path)
    client = WorkflowClient(store)
    stop = asyncio.Event()
    received: list[int] = []
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        received.append(signum)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    fleet: subprocess.Popen[bytes] | None = None
    worker: WorkflowWorker | None = None
    serving: asyncio.Task[None] | None = None
    if embedded:
        worker = WorkflowWorker(store=store, options=WorkerOptions(timer_poll_interval_s=0.25))
        serving = asyncio.create_task(worker.run())
        print(f"pyrula example app on {path}: one worker in this process")
    else:
        port = health_port(resolve_health_port(None))
        fleet = _start_fleet(path, port)
        # First, so that they are on screen before the stream of runs scrolls them away.
        print(f"dashboard: http://127.0.0.1:{port}/ (the runs below appear there as they "
              "stream)", flush=True)
        print(f"metrics: curl -s http://127.0.0.1:{port}/metrics", flush=True)
        print(f"pyrula example app on {path}: pyrula-fleet -n 2 (pid {fleet.pid}); "
              f"status: pyrula-fleet status --url http://127.0.0.1:{port}")
    print("submitting example runs (Ctrl+C to stop)", flush=True)
    await submit_stream(client, runs, stop)
    if worker is not None and serving is not None:
        worker.stop()
        await serving
    if fleet is not None:
        # Ctrl+C in a terminal reaches the whole process group, the fleet included; a
        # second signal would make it quit at once instead of draining.
        if fleet.poll() is None and signal.SIGINT not in received:
            fleet.send_signal(signal.SIGTERM)
        await loop.run_in_executor(None, fleet.wait)
    await store.aclose()
    print("drained; bye")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m pyrula.examples")
    parser.add_argument("--db", default="pyrula.db", help="SQLite file (default ./pyrula.db)")
    parser.add_argument("--runs", type=int, default=None, help="stop after this many orders")
    parser.add_argument("--embedded", action="store_true",
                        help="one worker in this process instead of the fleet")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args()
    logs.configure("text", args.log_level)
    # By its absolute path: which file the fleet uses must not depend on where one reads.
    asyncio.run(main(os.path.abspath(args.db), args.runs, args.embedded))
