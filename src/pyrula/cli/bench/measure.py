"""Measuring: percentiles, the verification of every run, each child's share, the shard
balance, the store's command count, and the live progress line."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TextIO

from pyrula.cli.bench.expect import Check
from pyrula.cli.bench.load import Load, RunRecord
from pyrula.supervisor.children import ChildState
from pyrula.workflows import RunInfo, RunStatus

if TYPE_CHECKING:
    from pyrula.invariants import Report

#: Run ids named in a failed verification, per kind of failure.
EXAMPLES = 5
#: Longest a failed run's error message is shown beside its id.
WHY_SHOWN = 80


def percentiles(values: Sequence[float]) -> dict[str, float] | None:
    """Nearest-rank p50/p95/p99 and the max, rounded to 0.01; None without values."""
    if not values:
        return None
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    return {"p50": round(rank(0.50), 2), "p95": round(rank(0.95), 2),
            "p99": round(rank(0.99), 2), "max": round(ordered[-1], 2)}


# --- verification -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verification:
    """Every run checked: completed with the right result (verified), or lost, failed,
    wrong (its result differs from the one expected) or never submitted (the lists hold
    run ids, or ``#x`` for a run that has none)."""

    runs: int
    completed: int
    lost: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    not_submitted: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.completed == self.runs

    def problems(self) -> list[str]:
        """One phrase per kind of failure, e.g. ``2 lost (never ended): r-1, r-2``."""
        out = []
        for what, ids in (("lost (never ended)", self.lost), ("failed", self.failed),
                          ("with a wrong result", self.wrong),
                          ("not submitted", self.not_submitted)):
            if ids:
                more = f", ... ({len(ids) - EXAMPLES} more)" if len(ids) > EXAMPLES else ""
                out.append(f"{len(ids)} {what}: {', '.join(ids[:EXAMPLES])}{more}")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "runs": self.runs, "completed": self.completed,
                "lost": len(self.lost), "failed": len(self.failed), "wrong": len(self.wrong),
                "not_submitted": len(self.not_submitted),
                "examples": {k: v[:EXAMPLES] for k, v in (
                    ("lost", self.lost), ("failed", self.failed), ("wrong", self.wrong),
                    ("not_submitted", self.not_submitted)) if v}}


def verify(records: Iterable[RunRecord], check: Check) -> Verification:
    """Check each run's end: completed, with a result ``check`` finds right."""
    runs = completed = 0
    lost: list[str] = []
    failed: list[str] = []
    wrong: list[str] = []
    not_submitted: list[str] = []
    for record in records:
        runs += 1
        info = record.info
        if record.run_id is None:
            not_submitted.append(f"#{record.x}")
        elif info is None:
            lost.append(record.run_id)
        elif info.status is not RunStatus.COMPLETED:
            failed.append(f"{record.run_id} ({_why(info)})")
        elif (differs := check(record.x, info.result)) is not None:
            wrong.append(f"{record.run_id} ({differs})")
        else:
            completed += 1
    return Verification(runs, completed, lost, failed, wrong, not_submitted)


def _why(info: RunInfo) -> str:
    """Why a run did not complete: its error's code and, cut short, what it says
    (``workflow_error ValueError: bad x``), else its status (``cancelled``)."""
    error = info.error or {}
    code = error.get("code") or info.status.value
    message = str(error.get("message") or "")
    said = f"{error['error_type']}: {message}" if error.get("error_type") else message
    if len(said) > WHY_SHOWN:
        said = said[:WHY_SHOWN - 3] + "..."
    return f"{code} {said}" if said else str(code)


async def invariants(load: Load, fleet_log: str | None) -> Report:
    """The invariant checker over every submitted run's journal and the ledger its steps
    wrote (``bench --verify``)."""
    from pyrula.invariants import check, collect_journals, count_stale_refusals, read_ledger

    expected = {r.run_id: r.x + load.config.steps for r in load.records if r.run_id}
    journals = await collect_journals(load.store, expected)
    # Reading the ledger is file I/O: off the loop.
    executions = await asyncio.to_thread(lambda: list(read_ledger(load.ledger))
                                         if load.ledger else [])
    return check(journals, expected, executions,
                 stale_writes_refused=count_stale_refusals(fleet_log or ""))


# --- who ran what ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Journals:
    """What the journals of the completed runs tell: runs per worker id (the worker of each
    run's last ``run:started``, the attempt that finished it) and the steps of the verified
    ones (each step's ``step:completed``, recorded once whatever the attempts)."""

    workers: dict[str, int]
    steps: int


async def read_journals(load: Load, batch: int = 200) -> Journals:
    """``Journals`` of the bench's completed runs, ``batch`` runs read at a time."""
    counts: dict[str, int] = {}
    steps = 0
    done = [r for r in load.records
            if r.run_id is not None and r.info is not None
            and r.info.status is RunStatus.COMPLETED]

    async def read(record: RunRecord) -> tuple[str | None, int]:
        assert record.run_id is not None and record.info is not None
        events = await load.store.read_events(record.run_id)
        started = [e for e in events if e.get("type") == "run:started"]
        right = load.check(record.x, record.info.result) is None
        completed = sum(1 for e in events if e.get("type") == "step:completed") if right else 0
        return (str(started[-1].get("worker")) if started else None), completed

    for start in range(0, len(done), batch):
        for found, completed in await asyncio.gather(*(read(r)
                                                       for r in done[start:start + batch])):
            key = found or "unknown"
            counts[key] = counts.get(key, 0) + 1
            steps += completed
    return Journals(counts, steps)


def pid_of(worker_id: str, known: dict[str, int]) -> int | None:
    """The pid of a worker: as /status reported it, else from its id (``host-pid-xxxxxx``)."""
    if worker_id in known:
        return known[worker_id]
    parts = worker_id.rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


class ShareState(StrEnum):
    """A worker in the report's child shares: still serving, killed by the bench, or gone."""

    LIVE = "live"
    KILLED = "killed"
    GONE = "gone"


def child_shares(counts: dict[str, int], known_pids: dict[str, int], killed: set[str],
                 live: set[str]) -> list[dict[str, Any]]:
    """Each worker's runs and share in percent, biggest first."""
    total = sum(counts.values()) or 1
    return [
        {"worker_id": worker, "pid": pid_of(worker, known_pids), "runs": n,
         "percent": round(100 * n / total, 1),
         "state": ShareState.KILLED if worker in killed
         else ShareState.LIVE if worker in live else ShareState.GONE}
        for worker, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


def shard_balance(status: dict[str, Any] | None, workflow: str) -> dict[str, Any] | None:
    """Shards of ``workflow`` per live child from a /status body: min, max, per child.
    None when no child holds shards (the SQLite store has none)."""
    if not status:
        return None
    per_child = {str(c.get("worker_id") or c.get("pid")): int(c.get("shards", {}).get(workflow, 0))
                 for c in status.get("children", []) if c.get("state") == ChildState.READY}
    if not per_child or not any(per_child.values()):
        return None
    return {"workflow": workflow, "min": min(per_child.values()),
            "max": max(per_child.values()), "total": sum(per_child.values()),
            "per_child": per_child}


# --- the store's commands -------------------------------------------------------------------

COMMANDS_NOTE = ("INFO commandstats calls summed over the server (its primaries for a cluster), "
                 "from before the first submit to the last result, divided by runs: every client "
                 "of the server counts, so other users of a shared server inflate it; the fleet's "
                 "start-up and idle polling are included")


def is_valkey(url: str) -> bool:
    return url.split("://", 1)[0].lower() in ("redis", "rediss", "valkey", "valkeys")


def _redis_py_url(url: str) -> str:
    """``url`` without the query options only pyrula knows (redis-py would pass them on
    to its connections as arguments they do not take)."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if k not in ("durability", "replica_timeout")]
    return urlunsplit(parts._replace(query=urlencode(query)))


def command_calls(url: str) -> int:
    """Commands the Valkey/Redis server at ``url`` has executed (``INFO commandstats``),
    without ``info`` and ``config|resetstat``; summed over the primaries of a cluster."""
    import redis
    from redis.cluster import RedisCluster

    scheme, rest = url.split("://", 1)
    plain = _redis_py_url(
        ("rediss" if scheme.lower() in ("rediss", "valkeys") else "redis") + "://" + rest)
    client = redis.Redis.from_url(plain, socket_timeout=5, decode_responses=True)
    try:
        clustered = bool(client.info("cluster").get("cluster_enabled"))
        if not clustered:
            return _calls(client.info("commandstats"))
    finally:
        client.close()
    cluster = RedisCluster.from_url(plain, socket_timeout=5, decode_responses=True)
    try:
        replies = cluster.info("commandstats", target_nodes=RedisCluster.PRIMARIES)
    finally:
        cluster.close()
    if isinstance(replies, dict) and all(isinstance(v, dict) for v in replies.values()) and not \
            any(str(k).startswith("cmdstat_") for k in replies):
        return sum(_calls(v) for v in replies.values())
    return _calls(replies)


def _calls(stats: Any) -> int:
    return sum(int(v["calls"]) for k, v in dict(stats).items()
               if str(k).startswith("cmdstat_")
               and k not in ("cmdstat_info", "cmdstat_config|resetstat"))


# --- the live progress line -----------------------------------------------------------------


class Progress:
    """``bench  3.0s  412 runs/s  in flight 20  done 1236/5000  errors 0`` on ``stream``:
    rewritten in place (``\\r``) each second on a terminal, one line a second otherwise."""

    def __init__(self, stream: TextIO, load: Load, extra: Callable[[], str] | None = None,
                 tty: bool | None = None) -> None:
        self.stream = stream
        self.load = load
        self.extra = extra
        self.tty = stream.isatty() if tty is None else tty
        self.started = time.perf_counter()
        self._samples: deque[tuple[float, int]] = deque(maxlen=4)
        self._wrote = False

    def line(self) -> str:
        now = time.perf_counter()
        load = self.load
        self._samples.append((now, load.ended))
        then, before = self._samples[0]
        recent = (load.ended - before) / (now - then) if now > then else 0.0
        text = (f"bench {now - self.started:6.1f}s  {recent:7.1f} runs/s  in flight "
                f"{load.in_flight:>5}  done {load.completed}/{len(load.records)}  "
                f"errors {load.errors}")
        extra = self.extra() if self.extra else ""
        return f"{text}  {extra}" if extra else text

    def write(self) -> None:
        line = self.line()
        if self.tty:
            self.stream.write("\r\x1b[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._wrote = True

    async def run(self, stop: asyncio.Event, interval: float = 1.0) -> None:
        # runs/s is over the last 3 s (four samples a second apart).
        self._samples.append((time.perf_counter(), self.load.ended))
        while True:
            try:
                await asyncio.wait_for(stop.wait(), interval)
                break
            except TimeoutError:
                self.write()
        self.write()
        if self.tty and self._wrote:
            self.stream.write("\n")
            self.stream.flush()
