"""``pyrula-fleet bench``: load a store, start a fleet on it, time the drain."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_bench(children: int, runs: int, steps: int, store_url: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pyrula-bench-") as tmp:
        url = store_url or f"sqlite:///{os.path.join(tmp, 'bench.db')}"
        namespace = f"bench{os.urandom(3).hex()}"
        return asyncio.run(_bench(children, runs, steps, url, namespace))


async def _bench(children: int, runs: int, steps: int, url: str,
                 namespace: str) -> dict[str, Any]:
    from pyrula.workflows import WorkflowClient, store_from_url

    valkey = not url.startswith(("sqlite", "memory"))
    store = store_from_url(url, **({"namespace": namespace} if valkey else {}))
    client = WorkflowClient(store)
    t0 = time.perf_counter()
    ids: list[str] = []
    for start in range(0, runs, 500):
        handles = await asyncio.gather(*(
            client.submit("pyrula.bench", {"x": i, "steps": steps})
            for i in range(start, min(runs, start + 500))
        ))
        ids.extend(h.run_id for h in handles)
    submit_s = time.perf_counter() - t0
    env = {**os.environ, "PYRULA_STORE_URL": url}
    if valkey:
        env["PYRULA_VALKEY_NAMESPACE"] = namespace
    fleet = subprocess.Popen(  # noqa: ASYNC220 - started once; its wait runs in a thread
        [sys.executable, "-c", "from pyrula.cli.fleet import main; main()", "start",
         "-n", str(children), "--app", "pyrula.examples.bench",
         "--health-port", str(_free_port()), "--log-level", "WARNING"],
        env=env,
    )
    started = time.perf_counter()
    try:
        for run_id in ids:
            info = await store.wait_result(run_id, timeout=3600)
            if info.status != "completed":
                raise RuntimeError(f"run {run_id} ended {info.status}: {info.error}")
        elapsed = time.perf_counter() - started
    finally:
        fleet.send_signal(signal.SIGTERM)
        await asyncio.get_running_loop().run_in_executor(None, fleet.wait)
    durations = []
    for run_id in ids[:: max(1, len(ids) // 1000)]:
        ended = await store.get_run(run_id)
        if ended is not None and ended.started_at and ended.finished_at:
            durations.append((ended.finished_at - ended.started_at) * 1000)
    durations.sort()
    await store.aclose()
    return {
        "store": url.split("://", 1)[0],
        "children": children,
        "runs": runs,
        "steps": steps,
        "submit_seconds": round(submit_s, 3),
        "seconds": round(elapsed, 3),
        "runs_per_s": round(runs / elapsed, 1),
        "steps_per_s": round(runs * steps / elapsed, 1),
        "run_duration_p50_ms": round(statistics.median(durations), 2) if durations else None,
        "run_duration_p99_ms": (round(durations[int(len(durations) * 0.99) - 1], 2)
                                if durations else None),
        "note": "fleet start-up is included; runs were all queued before it started",
    }
