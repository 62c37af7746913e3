"""``python -m benchmarks.peers``: pyrula against Dramatiq and SAQ, same harness, same run.

One Redis 7 server of the benchmark's own (``redis-server`` on a free port, no persistence)
serves every system in turn; it is emptied (FLUSHALL) and its command statistics reset
before each scenario. The workload, for each system:

- **1-step**: ``--runs`` (5,000) runs of a one-step ``x + 1`` job submitted one by one
  from a synchronous client (the submit rate), then the workers are spawned as a
  subprocess (the clock starts at the spawn) and every result is read back in submit
  order and checked. Runs/s from the spawn to the last result, steady runs/s from the
  first result to the last, Redis commands per run (``INFO commandstats``, commands
  inside Lua scripts included) and the server's own CPU time per run (``INFO cpu``, user +
  system: what bounds every system on one server) over submit + run + read.
- **5-step**: the same with ``--runs-5step`` (1,000) runs of five chained ``x + 1`` steps.
- **latency**: ``--samples`` (300) sequential submit -> result round trips on warm, idle
  workers (after 20 untimed ones): p50 and p99.
- **async bulk** (pyrula only): the 1-step workload from the async client, submits and
  result reads gathered in batches of 200.

The systems: pyrula (``pyrula-fleet start -n 2``, every step journaled in the store);
Dramatiq (``dramatiq --processes 2 --threads 8``, a ``RedisBroker`` with the ``Results``
middleware; 5 steps are a ``dramatiq.pipeline``); SAQ (``saq ... --workers 2``; an asyncio
client, since SAQ has no synchronous one; 5 steps chained by the client). Neither peer
journals anything: a peer's step is a message. See ``benchmarks/peer_apps/`` for each.

Each scenario is repeated ``--repeat`` times, the systems interleaved (pyrula, dramatiq,
saq, pyrula, ...) so their ranges come from the same stretch of machine time. Prints one
markdown table (ranges over the repeats, pyrula/peer ratios against the targets) to
stdout, progress to stderr; ``--json PATH`` writes every raw figure. Missing peers are
installed into this interpreter's environment with pip unless ``--skip-install``.
Measured and reported, never asserted.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Protocol

from benchmarks.peer_apps.harness import RedisServer, compile_sources, kill_all, log_dir

SYSTEMS = ("pyrula", "dramatiq", "saq")
TITLES = {"pyrula": "pyrula", "dramatiq": "Dramatiq", "saq": "SAQ"}
SCENARIOS = ("1-step", "5-step", "latency", "async-bulk")
WARMUP = 20


class Peer(Protocol):
    name: str
    scenarios: tuple[str, ...]

    def run(self, scenario: str, runs: int) -> dict[str, float]: ...


# --- installing the peers ------------------------------------------------------------


def _importable(*modules: str) -> bool:
    try:
        for module in modules:
            importlib.import_module(module)
    except ImportError:
        return False
    return True


def ensure_installed(systems: list[str], skip: bool) -> None:
    """pip-install the peers that are not importable yet.

    SAQ is installed without its ``redis`` extra, which pins ``redis<8``: pip would
    downgrade the redis-py that pyrula itself runs on. SAQ needs only ``redis.asyncio``,
    already there as pyrula's own dependency.
    """
    wanted = []
    if "dramatiq" in systems and not _importable("dramatiq", "dramatiq.brokers.redis"):
        wanted.append("dramatiq[redis]")
    if "saq" in systems and not _importable("saq", "redis.asyncio"):
        wanted.extend(["saq", "redis"])
    if not wanted:
        return
    if skip:
        raise SystemExit(f"--skip-install, but not importable: {', '.join(wanted)}")
    print(f"installing {' '.join(wanted)}", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *wanted], check=True)
    importlib.invalidate_caches()


def versions(server: RedisServer) -> dict[str, str]:
    found = {"redis-server": server.version, "python": sys.version.split()[0]}
    for package in ("pyrula", "dramatiq", "saq", "redis"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "-"
    return found


# --- running -------------------------------------------------------------------------


def make_peer(system: str, server: RedisServer, logs: Path,
              args: argparse.Namespace | None = None) -> Peer:
    if system == "pyrula":
        from benchmarks.peer_apps.pyrula_peer import PyrulaPeer

        best = args is not None and args.best_case
        return PyrulaPeer(server, logs, WARMUP, step_kind="async" if best else "sync",
                          log_level="WARNING" if best else None)
    if system == "dramatiq":
        from benchmarks.peer_apps.dramatiq_peer import DramatiqPeer

        return DramatiqPeer(server, logs, WARMUP)
    from benchmarks.peer_apps.saq_peer import SaqPeer

    return SaqPeer(server, logs, WARMUP)


def size_of(scenario: str, args: argparse.Namespace) -> int:
    sizes: dict[str, int] = {"1-step": args.runs, "5-step": args.runs_5step,
                             "latency": args.samples, "async-bulk": args.runs}
    return sizes[scenario]


Raw = dict[str, dict[str, list[dict[str, float]]]]


def run_all(peers: list[Peer], args: argparse.Namespace) -> tuple[Raw, list[str]]:
    """Every scenario ``--repeat`` times, the systems interleaved within each repeat."""
    raw: Raw = {p.name: {} for p in peers}
    errors: list[str] = []
    for scenario in SCENARIOS:
        for repeat in range(args.repeat):
            for peer in peers:
                if scenario not in peer.scenarios:
                    continue
                size = size_of(scenario, args)
                started = time.monotonic()
                try:
                    figures = peer.run(scenario, size)
                except Exception as exc:
                    errors.append(f"{peer.name} {scenario} #{repeat + 1}: {exc!r}")
                    traceback.print_exc()
                    continue
                figures = {"repeat": repeat + 1,
                           "wall_s": round(time.monotonic() - started, 2), **figures}
                raw[peer.name].setdefault(scenario, []).append(figures)
                print(json.dumps({"system": peer.name, "scenario": scenario, **figures}),
                      file=sys.stderr, flush=True)
    return raw, errors


# --- the table -----------------------------------------------------------------------


@dataclass(frozen=True)
class Measure:
    label: str
    scenario: str
    field: str
    unit: str  # "rate" | "ms" | "fine_ms" | "count" | "s_as_ms" (seconds, shown as ms)
    #: the peers' field a pyrula/peer ratio divides by (default: ``field``)
    compare_to: str | None = None


@dataclass(frozen=True)
class Target:
    text: str
    peer: str | None  # the ratio pyrula/peer is judged; None: pyrula's own value
    met: Callable[[float], bool]


MEASURES = {
    "submit": Measure("sync-client submit rate, 1-step (submits/s)", "1-step",
                      "submit_per_s", "rate"),
    "first1": Measure("spawn → first result, 1-step (ms)", "1-step",
                      "first_result_after_spawn_s", "s_as_ms"),
    "runs1": Measure("1-step runs/s (spawn → last result)", "1-step", "runs_per_s", "rate"),
    "steady1": Measure("1-step steady runs/s (first → last result)", "1-step",
                       "steady_runs_per_s", "rate"),
    "cmds1": Measure("commands per 1-step run", "1-step", "commands_per_run", "count"),
    "cpu1": Measure("server CPU per 1-step run (ms)", "1-step", "server_cpu_ms_per_run",
                    "fine_ms"),
    "wcpu1": Measure("workers' CPU per 1-step run, steady (ms)", "1-step",
                     "steady_workers_cpu_ms_per_run", "fine_ms"),
    "ccpu1": Measure("reading client's CPU per result, steady (ms)", "1-step",
                     "steady_client_cpu_ms_per_run", "fine_ms"),
    "scpu1": Measure("server CPU per 1-step run, steady (ms)", "1-step",
                     "steady_server_cpu_ms_per_run", "fine_ms"),
    "submit5": Measure("sync-client submit rate, 5-step (submits/s)", "5-step",
                       "submit_per_s", "rate"),
    "runs5": Measure("5-step runs/s (spawn → last result)", "5-step", "runs_per_s", "rate"),
    "steady5": Measure("5-step steady runs/s (first → last result)", "5-step",
                       "steady_runs_per_s", "rate"),
    "cmds5": Measure("commands per 5-step run", "5-step", "commands_per_run", "count"),
    "cpu5": Measure("server CPU per 5-step run (ms)", "5-step", "server_cpu_ms_per_run",
                    "fine_ms"),
    "p50": Measure("latency p50 (ms)", "latency", "p50_ms", "ms"),
    "p99": Measure("latency p99 (ms)", "latency", "p99_ms", "ms"),
    "ap50": Measure("latency p50, pyrula's async client (ms)", "latency", "async_p50_ms", "ms",
                    compare_to="p50_ms"),
    "ap99": Measure("latency p99, pyrula's async client (ms)", "latency", "async_p99_ms", "ms",
                    compare_to="p99_ms"),
    "bulk": Measure("1-step runs/s, async bulk client (spawn → last)", "async-bulk",
                    "runs_per_s", "rate"),
    "bulksteady": Measure("1-step steady runs/s, async bulk client", "async-bulk",
                          "steady_runs_per_s", "rate"),
}

TARGETS = {
    "first1": Target("≤ Dramatiq's", "dramatiq", lambda r: r <= 1.0),
    "runs1": Target("≥ 1.5× Dramatiq", "dramatiq", lambda r: r >= 1.5),
    "steady1": Target("≥ 2× Dramatiq", "dramatiq", lambda r: r >= 2.0),
    "runs5": Target("≥ 2.5× Dramatiq", "dramatiq", lambda r: r >= 2.5),
    "cpu1": Target("≤ Dramatiq's", "dramatiq", lambda r: r <= 1.0),
    "submit": Target("≥ Dramatiq's", "dramatiq", lambda r: r >= 1.0),
    "p50": Target("≤ SAQ's p50", "saq", lambda r: r <= 1.0),
    "p99": Target("≤ 5 ms", None, lambda v: v <= 5.0),
    "ap50": Target("≤ SAQ's p50", "saq", lambda r: r <= 1.0),
    "ap99": Target("≤ 5 ms", None, lambda v: v <= 5.0),
    "cmds1": Target("≤ 16", None, lambda v: v <= 16.0),
}


def values(raw: Raw, system: str, measure: Measure) -> list[float]:
    return list(by_repeat(raw, system, measure).values())


def median(xs: list[float]) -> float:
    ordered = sorted(xs)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def fmt(value: float, unit: str) -> str:
    if unit == "rate":
        return f"{value:,.0f}"
    if unit == "ms":
        return f"{value:.2f}"
    if unit == "fine_ms":
        return f"{value:.3f}"
    if unit == "s_as_ms":
        return f"{value * 1000:.0f}"
    return f"{value:.1f}"


def fmt_range(xs: list[float], unit: str) -> str:
    if not xs:
        return "—"
    low, high = fmt(min(xs), unit), fmt(max(xs), unit)
    return low if low == high else f"{low} – {high}"


def by_repeat(raw: Raw, system: str, measure: Measure,
              field: str | None = None) -> dict[float, float]:
    name = field or measure.field
    return {f["repeat"]: f[name] for f in raw.get(system, {}).get(measure.scenario, [])
            if name in f}


def ratios(raw: Raw, measure: Measure, peer: str) -> list[float]:
    """pyrula / peer, repeat by repeat (the repeats were interleaved)."""
    mine = by_repeat(raw, "pyrula", measure)
    theirs = by_repeat(raw, peer, measure, measure.compare_to)
    return [mine[r] / theirs[r] for r in sorted(mine) if theirs.get(r)]


def fmt_ratio(rs: list[float]) -> str:
    if not rs:
        return "—"
    spread = "" if len(rs) == 1 else f" ({min(rs):.2f}–{max(rs):.2f})"
    return f"{median(rs):.2f}×{spread}"


def verdict(raw: Raw, key: str, measure: Measure) -> str:
    target = TARGETS.get(key)
    if target is None:
        return ""
    if target.peer is None:
        mine = values(raw, "pyrula", measure)
        if not mine:
            return f"{target.text}: n/a"
        value = median(mine)
        shown = f"{fmt(value, measure.unit)}{' ms' if measure.unit in ('ms', 'fine_ms') else ''}"
    else:
        rs = ratios(raw, measure, target.peer)
        if not rs:
            return f"{target.text}: n/a"
        value = median(rs)
        shown = f"{value:.2f}×"
    return f"{target.text}: {shown} — {'met' if target.met(value) else 'not met'}"


def table(raw: Raw, systems: list[str]) -> str:
    peers = [s for s in systems if s != "pyrula"]
    head = (["measure"] + [TITLES[s] for s in systems]
            + [f"pyrula/{TITLES[p]}" for p in peers if "pyrula" in systems] + ["target"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, measure in MEASURES.items():
        cells = [fmt_range(values(raw, s, measure), measure.unit) for s in systems]
        if all(c == "—" for c in cells):
            continue
        if "pyrula" in systems:
            cells += [fmt_ratio(ratios(raw, measure, p)) for p in peers]
        lines.append("| " + " | ".join([measure.label, *cells, verdict(raw, key, measure)])
                     + " |")
    return "\n".join(lines)


NOTES = """\
- Ranges are min – max over the repeats; a ratio is the median of the per-repeat
  pyrula/peer ratios (its range in brackets); a target is judged on that median.
- Workers: pyrula `pyrula-fleet start -n 2`; Dramatiq `--processes 2 --threads 8`; SAQ
  `--workers 2` (concurrency 10 each, its default). Clocks start at the workers' spawn.
- pyrula journals every step in the store; Dramatiq and SAQ journal nothing.
- pyrula runs as users write and run it: `def` steps (on the worker's thread pool) and
  the fleet's default log level; `--best-case` measures `async def` steps at WARNING.
- SAQ has no synchronous client: its client is one asyncio loop awaiting each enqueue in
  turn; results via `job.refresh(until_complete=...)` with one pub/sub listener kept for
  the client's life. SAQ has no pipeline: its 5 steps are chained by the client (each
  enqueued with the previous result), the chains concurrent in the client's loop.
- Dramatiq's 5 steps are a `dramatiq.pipeline` of five `add_one` messages; its client is
  synchronous. pyrula's latency is measured with `SyncWorkflowClient` (the rows judged) and
  with the async `WorkflowClient`, on the same warm fleet."""


def saq_notes(raw: Raw) -> str:
    """What SAQ's own behaviour did to its figures in this run, if anything."""
    lines = []
    lost = sum(f.get("rechecks", 0) for f in raw.get("saq", {}).get("latency", []))
    if lost:
        lines.append(f"- SAQ latency: {lost:.0f} wait(s) re-armed after 1 s without a "
                     "notification (lost wake-ups), in its p99.")
    for scenario, figures in raw.get("saq", {}).items():
        swept = [int(f.get("swept", 0)) for f in figures]
        if any(swept):
            lines.append(f"- SAQ {scenario}: {sum(swept)} job(s) over {len(swept)} repeat(s) "
                         "aborted by SAQ's own sweeper as a worker started (a job dequeued "
                         "but not yet marked active; tobymao/saq#277): no result, left out "
                         "of the checks, the clock ran on.")
    return "\n".join(lines)


def report(args: argparse.Namespace, found: dict[str, str], raw: Raw, systems: list[str],
           errors: list[str]) -> str:
    head = (f"pyrula vs peers — runs {args.runs} (1-step), {args.runs_5step} (5-step), "
            f"{args.samples} latency samples, {args.repeat} repeat(s); "
            + ", ".join(f"{k} {v}" for k, v in found.items()))
    parts = [head, table(raw, systems), NOTES + ("\n" + saq_notes(raw)).rstrip()]
    parts += [f"ERROR: {error}" for error in errors]
    return "\n\n".join(parts)


# --- main ----------------------------------------------------------------------------


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers",
                                     description="pyrula vs Dramatiq vs SAQ on one Redis")
    parser.add_argument("--runs", type=int, default=5000, help="1-step runs")
    parser.add_argument("--runs-5step", type=int, default=1000, help="5-step runs")
    parser.add_argument("--samples", type=int, default=300, help="latency samples")
    parser.add_argument("--repeat", type=int, default=3, help="repeats of each scenario")
    parser.add_argument("--best-case", action="store_true",
                        help="pyrula with async def steps and --log-level WARNING (default: "
                        "def steps and the fleet's default log level, the path users take)")
    parser.add_argument("--only", action="append", choices=SYSTEMS, default=None,
                        help="run only this system (repeatable)")
    parser.add_argument("--skip-install", action="store_true",
                        help="do not pip-install missing peers")
    parser.add_argument("--json", type=Path, default=None, help="write every raw figure here")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the servers' and workers' logs (their folder is printed)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if min(args.runs, args.runs_5step, args.samples, args.repeat) < 1:
        raise SystemExit("--runs, --runs-5step, --samples and --repeat must be ≥ 1")
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not on PATH")
    systems = [s for s in SYSTEMS if args.only is None or s in args.only]
    ensure_installed(systems, args.skip_install)
    compile_sources()
    # Ctrl+C and SIGTERM raise KeyboardInterrupt at once, inside asyncio.run too (whose own
    # SIGINT handler only cancels the main task, which a client library may swallow), and
    # unwind through the finally below, which reaps every process started.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    logs = log_dir()
    try:
        with tempfile.TemporaryDirectory(prefix="pyrula-peers-redis-") as tmp:
            server = RedisServer(Path(tmp))
            peers = [make_peer(s, server, logs, args) for s in systems]
            raw, errors = run_all(peers, args)
            found = versions(server)
            server.stop()
    finally:
        kill_all()
        if args.keep_logs:
            print(f"logs in {logs}", file=sys.stderr)
        else:
            shutil.rmtree(logs, ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps({
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "versions": found, "raw": raw, "errors": errors, "table": table(raw, systems),
        }, indent=2))
    print(report(args, found, raw, systems, errors))
    return 1 if errors else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:
        print(f"interrupted ({exc}): every process started was stopped",
              file=sys.stderr)
        sys.exit(130)
