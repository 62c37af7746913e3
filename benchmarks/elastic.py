"""``python -m benchmarks.elastic``: an elastic fleet under a load step. Measured, never
asserted (not part of ``make test``).

A fleet ``--min 1 --max 4`` on a private Valkey server (``tests.servers.start_server``)
serving ``fa_load`` (two steps of 50 ms each, in the child's thread pool, from the fleet
tests' app), idle and ready; then ``--runs`` runs (2,000) are submitted at once. Measured,
from /status polled every ``POLL`` on a thread of its own and from the fleet's log:

- from the load step (the first submit) to the first ``fleet_scaled: up`` and to the
  first added child ready, and to each later size;
- for each scale-up, from the decision (its ``fleet_scaled: up`` line) to the added
  child's ``child_ready`` line, from the log lines' own times;
- throughput (runs done per second, from the children's ``runs_done``) at each number of
  ready children;
- the way back: from the last run done to each ``fleet_scaled: down`` and to one child;
- every ``fleet_scale_held`` line (growth refused for want of headroom), as the log says.

Prints one JSON line of figures and a summary. Run from the repository root:
``PYTHONPATH=src python -m benchmarks.elastic`` (the fleet runs this tree's ``src``).
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.fleet.fleetprocs import Fleet, Fleets, ready
from tests.servers import start_server

from pyrula.workflows import SyncWorkflowClient, ValkeyStore

POLL = 0.02
QUICK = ("--shutdown-grace", "5", "--cancel-timeout", "1")


class Timeline:
    """(monotonic time, /status) samples, polled on a thread of its own."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        while not self._stop.is_set():
            status = self.fleet.status()
            if status is not None:
                self.samples.append((time.monotonic(), status))
            self._stop.wait(POLL)

    def __enter__(self) -> Timeline:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def first(self, condition: Any, after: float = 0.0) -> float | None:
        return next((t for t, s in self.samples if t >= after and condition(s)), None)


def _done(status: dict[str, Any]) -> int:
    return sum(c["runs_done"] for c in status["children"])


def _throughput(samples: list[tuple[float, dict[str, Any]]], start: float,
                end: float) -> dict[str, float]:
    """Runs done per second while k children were ready (k: the figure's key), between
    consecutive samples within [start, end] in which no child left."""
    time_at: dict[int, float] = {}
    runs_at: dict[int, int] = {}
    window = [(t, s) for t, s in samples if start <= t <= end]
    for (t0, s0), (t1, s1) in zip(window, window[1:], strict=False):
        if len(s1["children"]) < len(s0["children"]):
            continue
        k = len(ready(s0))
        time_at[k] = time_at.get(k, 0.0) + (t1 - t0)
        runs_at[k] = runs_at.get(k, 0) + max(0, _done(s1) - _done(s0))
    return {str(k): round(runs_at[k] / time_at[k], 1) for k in sorted(time_at)
            if time_at[k] >= 0.5}


def measure(directory: Path, runs: int, scale_up_after: float,
            scale_down_after: float) -> dict[str, Any]:
    server = start_server(directory / "valkey")
    fleets = Fleets(directory)
    store = ValkeyStore(url=server.url, namespace="bench")
    try:
        fleet = fleets.start("--min", "1", "--max", "4", "--workflow", "fleetapp:load",
                             "--namespace", "bench", "--scale-up-after", str(scale_up_after),
                             "--scale-down-after", str(scale_down_after), *QUICK, app=None,
                             store=server.url, name="elastic")
        fleet.wait_ready(1)
        client = SyncWorkflowClient(store)
        with Timeline(fleet) as timeline:
            step = time.monotonic()
            handles = [client.submit("fa_load", {"tag": f"b{i}"}) for i in range(runs)]
            submitted = time.monotonic()
            for handle in handles:
                client.result(handle.run_id, timeout=300)
            finished = time.monotonic()
            fleet.wait_status(lambda s: s["desired"] == 1 and len(s["children"]) == 1,
                              timeout=30 + 5 * scale_down_after, what="back to one child")
            back = time.monotonic()
        samples = timeline.samples
        sizes: dict[str, float] = {}
        for k in (2, 3, 4):
            at = timeline.first(lambda s, k=k: len(ready(s)) >= k, after=step)
            if at is not None and at <= finished:
                sizes[str(k)] = round(at - step, 3)
        wanted = timeline.first(lambda s: s["desired"] > 1, after=step)
        downs = [round(t - finished, 3) for (t, s), (_, prev) in
                 zip(samples[1:], samples, strict=False)
                 if t > finished and s["desired"] < prev["desired"]]
        log = fleet.log()
        figures = {
            "runs": runs, "scale_up_after_s": scale_up_after,
            "scale_down_after_s": scale_down_after,
            "submit_s": round(submitted - step, 3), "load_s": round(finished - step, 3),
            "runs_per_s_overall": round(runs / (finished - step), 1),
            "first_up_decision_s": None if wanted is None else round(wanted - step, 3),
            "ready_children_reached_s": sizes,
            "runs_per_s_by_ready_children": _throughput(samples, step, finished),
            "down_decisions_after_load_s": downs,
            "back_to_one_s": round(back - finished, 3),
            "up_decision_to_child_ready_ms": decision_to_ready(log),
            "scaled": re.findall(r"fleet_scaled: [^\n]*", log),
            "held": re.findall(r"fleet_scale_held: [^\n]*", log),
        }
        fleet.send(2)
        fleet.wait(60)
        return figures
    finally:
        store.close()
        fleets.reap()
        server.kill()


#: A text log line's time and message (``2026-12-01T12:00:00.123Z INFO    name: message``).
LINE = re.compile(r"^(\d{4}-\d\d-\d\dT[\d:.]+)Z\s+\w+\s+(?:\[[^]]*\] )?\S+: (.*)$")


def decision_to_ready(log: str) -> list[float]:
    """For each ``fleet_scaled: up``, ms from it to the next ``child_ready`` (the child it
    added, forked as the decision is taken), from the log lines' own times."""
    from datetime import datetime

    out, decided = [], None
    for line in log.splitlines():
        found = LINE.match(line)
        if found is None:
            continue
        at = datetime.fromisoformat(found.group(1)).timestamp()
        if found.group(2).startswith("fleet_scaled: up"):
            decided = at
        elif found.group(2).startswith("child_ready") and decided is not None:
            out.append(round((at - decided) * 1000, 1))
            decided = None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.elastic")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--scale-up-after", type=float, default=2.0)
    parser.add_argument("--scale-down-after", type=float, default=5.0,
                        help="short, so that the way back is measured in seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pyrula-bench-elastic-") as tmp:
        figures = measure(Path(tmp), args.runs, args.scale_up_after, args.scale_down_after)
    print(json.dumps(figures), flush=True)
    print(f"load step of {figures['runs']} runs (submitted in {figures['submit_s']} s), "
          f"done in {figures['load_s']} s ({figures['runs_per_s_overall']} runs/s)")
    print(f"first up decision after {figures['first_up_decision_s']} s; ready children "
          f"reached (s after the step): {figures['ready_children_reached_s']}")
    print(f"each scale-up, decision -> the child it added ready (ms): "
          f"{figures['up_decision_to_child_ready_ms']}")
    print(f"runs/s by ready children: {figures['runs_per_s_by_ready_children']}")
    print(f"after the load: down decisions at {figures['down_decisions_after_load_s']} s, "
          f"one child again after {figures['back_to_one_s']} s")
    for line in figures["scaled"] + figures["held"]:
        print("  " + line)


if __name__ == "__main__":
    main()
