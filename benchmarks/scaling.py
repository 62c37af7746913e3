"""``python -m benchmarks.scaling``: does the cost per run stay flat as work grows?

On one Redis 7 server the benchmark starts itself (no persistence), with a real
``pyrula-fleet start -n 2`` serving ``pyrula.bench`` (one ``x + 1`` step):

- **backlog N** (N = 5,000 and 40,000): N runs submitted from an async client (gathered
  200 at a time), then the fleet is started; results are read back gathered 200 at a time,
  in submit order. Runs/s from the fleet's spawn to the last result, and steady (from the
  first result). The two sizes should give the same rate: nothing per run grows with the
  queue.
- **timers**: 20,000 runs that first sleep until one common moment T (a durable timer
  each), submitted while the fleet runs; once every run is parked, the clock runs from T to
  the last result. The rate is compared with the steady 1-step rate of the 5,000 backlog
  in the same invocation.

Speed is reported, never asserted. Prints one JSON line per scenario and a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.peer_apps.harness import (
    RedisServer,
    Service,
    compile_sources,
    kill_all,
    log_dir,
    start_python,
)
from pyrula.workflows import RunStatus, ValkeyStore, WorkflowClient

WORKFLOW = "pyrula.bench"
BATCH = 200


def _fleet(server: RedisServer, namespace: str, logs: Path) -> Service:
    return start_python("pyrula-fleet", [
        "-c", "from pyrula.cli.fleet import main; main()", "start", "-n", "2",
        "--app", "pyrula.examples.bench", "--store", server.url, "--namespace", namespace,
        "--health-port", "0", "--log-level", "WARNING",
    ], server.url, logs)


async def _submit(client: WorkflowClient, params: list[dict[str, Any]]) -> list[str]:
    ids: list[str] = []
    for start in range(0, len(params), BATCH):
        handles = await asyncio.gather(*(client.submit(WORKFLOW, p)
                                         for p in params[start:start + BATCH]))
        ids.extend(h.run_id for h in handles)
    return ids


async def _read(client: WorkflowClient, ids: list[str], expected: list[int]) -> list[float]:
    """Every result, checked; the times they were seen."""
    seen: list[float] = []

    async def one(run_id: str, want: int) -> None:
        got = await client.result(run_id, timeout=600)
        if got != want:
            raise RuntimeError(f"run {run_id}: {got!r}, expected {want}")
        seen.append(time.perf_counter())

    for start in range(0, len(ids), BATCH):
        await asyncio.gather(*(one(r, w) for r, w in zip(ids[start:start + BATCH],
                                                         expected[start:start + BATCH],
                                                         strict=True)))
    return seen


async def backlog(server: RedisServer, runs: int, logs: Path) -> dict[str, Any]:
    server.reset()
    namespace = f"scale{os.urandom(3).hex()}"
    store = ValkeyStore(url=server.url, namespace=namespace)
    client = WorkflowClient(store)
    try:
        ids = await _submit(client, [{"x": i, "steps": 1} for i in range(runs)])
        spawned = time.perf_counter()
        fleet = _fleet(server, namespace, logs)
        try:
            seen = await _read(client, ids, [i + 1 for i in range(runs)])
            fleet.check()
        finally:
            fleet.stop()
    finally:
        await store.aclose()
    first, last = min(seen), max(seen)
    return {"scenario": f"backlog {runs}", "runs": runs,
            "runs_per_s": round(runs / (last - spawned), 1),
            "steady_runs_per_s": round((runs - 1) / (last - first), 1)}


async def timers(server: RedisServer, runs: int, logs: Path, lead: float) -> dict[str, Any]:
    """``runs`` runs sleep until one moment ``lead`` seconds away, then end together."""
    server.reset()
    namespace = f"timers{os.urandom(3).hex()}"
    store = ValkeyStore(url=server.url, namespace=namespace)
    client = WorkflowClient(store)
    fleet = _fleet(server, namespace, logs)
    try:
        due = time.time() + lead
        ids = await _submit(client, [{"x": i, "steps": 1, "until": due} for i in range(runs)])
        parked_by = None
        while parked_by is None:
            infos = []
            for start in range(0, runs, 2000):
                infos += await asyncio.gather(*(client.get(r) for r in ids[start:start + 2000]))
            if all(i.status is RunStatus.SLEEPING for i in infos):
                parked_by = time.time()
            elif any(i.status.terminal for i in infos):
                raise RuntimeError("a run ended before its timer: raise --timer-lead")
            else:
                await asyncio.sleep(0.5)  # polling the fleet's progress, not synchronising
        if parked_by >= due:
            raise RuntimeError(f"parking {runs} runs took past their timer: raise --timer-lead")
        seen = await _read(client, ids, [i + 1 for i in range(runs)])
        fleet.check()
    finally:
        fleet.stop()
        await store.aclose()
    # perf_counter and time.time tick together over a run this short; take the wall clock
    # of the last result from the offset between them.
    offset = time.time() - time.perf_counter()
    last = max(seen) + offset
    return {"scenario": f"timers {runs}", "runs": runs, "parked_s_before_due": round(
        due - parked_by, 2), "runs_per_s": round(runs / (last - due), 1)}


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    logs = log_dir()
    server = RedisServer(logs)
    results: list[dict[str, Any]] = []
    try:
        for _ in range(args.repeat):
            for runs in args.backlog:
                results.append(await backlog(server, runs, logs))
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
            results.append(await timers(server, args.timers, logs, args.timer_lead))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    finally:
        server.stop()
        kill_all()
    return results


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    def span(scenario: str, key: str) -> str:
        values = [r[key] for r in results if r["scenario"] == scenario]
        return f"{min(values):,.0f}–{max(values):,.0f}" if values else "—"

    small, big = f"backlog {min(args.backlog)}", f"backlog {max(args.backlog)}"
    lines = ["| scenario | runs/s (from the fleet's start) | steady runs/s |", "|---|---|---|"]
    for runs in args.backlog:
        name = f"backlog {runs}"
        lines.append(f"| {name} queued | {span(name, 'runs_per_s')} | "
                     f"{span(name, 'steady_runs_per_s')} |")
    name = f"timers {args.timers}"
    lines.append(f"| {args.timers} timers due together | {span(name, 'runs_per_s')} "
                 "(from the moment due) | — |")

    def median(scenario: str, key: str) -> float:
        values = sorted(r[key] for r in results if r["scenario"] == scenario)
        return values[len(values) // 2]

    flat = median(big, "runs_per_s") / median(small, "runs_per_s")
    wake = median(name, "runs_per_s") / median(small, "steady_runs_per_s")
    lines.append("")
    lines.append(f"{big} / {small}: {flat:.2f}× (target ≥ 1.0)")
    lines.append(f"timers / steady 1-step rate: {wake:.2f}× (target ≥ 0.5)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, nargs="+", default=[5000, 40000])
    parser.add_argument("--timers", type=int, default=20000)
    parser.add_argument("--timer-lead", type=float, default=30.0,
                        help="seconds from the first submit to the common wake time")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    compile_sources()
    results = asyncio.run(main_async(args))
    print(report(results, args))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
