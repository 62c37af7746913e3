"""One bench from start to end: open the store, get a fleet (its own or an attached one),
load it, measure, stop what it started, and gather every figure."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TextIO

from pyrula.cli.bench.config import WORKFLOW, BenchConfig, BenchError
from pyrula.cli.bench.control import AttachedFleet, Fleet, Killer, OwnFleet, Upgrader
from pyrula.cli.bench.load import Load
from pyrula.cli.bench.measure import (
    COMMANDS_NOTE,
    Journals,
    Progress,
    child_shares,
    command_calls,
    invariants,
    is_valkey,
    percentiles,
    read_journals,
    shard_balance,
    verify,
)
from pyrula.config.fleet import resolve_store_url
from pyrula.config.store_url import shown_url, sqlite_file
from pyrula.supervisor.children import ChildState
from pyrula.workflows import (
    ConfigurationError,
    StoreUnavailable,
    WorkflowClient,
    store_from_url,
)
from pyrula.workflows.stores import Store


def run_bench(config: BenchConfig, stream: TextIO | None = None) -> dict[str, Any]:
    """Run the bench; its figures (``verification.ok`` says if every run was right).
    Raises BenchError when it cannot be run (exit code in ``.code``)."""
    with tempfile.TemporaryDirectory(prefix="pyrula-bench-") as tmp:
        return asyncio.run(_Bench(config, Path(tmp), stream or sys.stderr).run())


def _store_url(config: BenchConfig, tmp: Path) -> str:
    if config.store_url:
        return config.store_url
    if config.attach:
        return resolve_store_url(None)
    return f"sqlite:///{tmp / 'bench.db'}"


class _Bench:
    def __init__(self, config: BenchConfig, tmp: Path, stream: TextIO) -> None:
        self.config = config
        self.tmp = tmp
        self.stream = stream
        self.url = _store_url(config, tmp)
        self.valkey = is_valkey(self.url)
        self.namespace = config.namespace
        if self.valkey and self.namespace is None and not config.attach:
            self.namespace = f"bench{os.urandom(3).hex()}"  # a fresh one: no leftovers
        # A waiter holds a Valkey connection while it blocks; SQLite waiters poll.
        self.waiters = 256 if self.valkey else 64
        self.commands_error: str | None = None
        #: The side-effect ledger's directory (absolute: the fleet runs elsewhere).
        self.ledger = os.path.abspath(config.ledger or tmp / "ledger") if config.verify else None
        path = sqlite_file(self.url)
        #: The SQLite file the URL names when it does not exist (absolute), else None.
        self.missing_file = (os.path.abspath(path) if path is not None
                             and not os.path.exists(path) else None)

    def _open_store(self) -> Store:
        if self.url.split("://", 1)[0].lower() == "memory":
            raise BenchError("--store memory:// lives in one process: a fleet cannot share it "
                             "(use sqlite:///FILE or redis://HOST:PORT)", code=2)
        options: dict[str, Any] = {}
        if self.valkey:
            if self.namespace:
                options["namespace"] = self.namespace
            options["max_connections"] = max(512, (self.config.concurrency or 0) + 256)
        try:
            return store_from_url(self.url, **options)
        except ConfigurationError as exc:
            raise BenchError(f"--store: {exc}", code=2) from None
        except Exception as exc:
            raise BenchError(f"cannot open the store {self.url}: {exc}", code=2) from None

    async def _refuse_a_missing_store(self, attach: str) -> None:
        """Opening a SQLite file that is not there would create an empty store no fleet
        reads, and every run would wait: refused, once the fleet is known to answer (a
        fleet that does not is the first thing to say)."""
        if self.missing_file is None:
            return
        await AttachedFleet(attach).check(want_kills=False)
        raise BenchError(f"no store at {self.missing_file}: pass the --store the fleet "
                         f"at {attach} runs on (its /status names it)", code=2)

    async def run(self) -> dict[str, Any]:
        if self.config.attach:
            await self._refuse_a_missing_store(self.config.attach)
        store = self._open_store()
        try:
            try:
                await asyncio.wait_for(store.aping(), 10)
            except Exception as exc:
                raise BenchError(f"cannot reach the store at {self.url}: "
                                 f"{exc or type(exc).__name__}", code=2) from None
            return await self._run(WorkflowClient(store))
        finally:
            await store.aclose()

    async def _commands(self) -> int | None:
        if not self.valkey:
            return None
        try:
            return await asyncio.to_thread(command_calls, self.url)
        except Exception as exc:  # e.g. an ACL that forbids INFO: go on without the figure
            self.commands_error = f"{type(exc).__name__}: {exc}"
            return None

    async def _fleet(self) -> tuple[Fleet, int]:
        """The fleet to load and its children: the attached one, checked to serve the
        workflow on the bench's store, or one of the bench's own (started later)."""
        config = self.config
        if config.attach:
            attached = AttachedFleet(config.attach)
            status = await attached.check(want_kills=config.kill_every is not None
                                          or config.upgrade_every is not None)
            _check_serves(status, config.attach, config.workflow_name)
            _check_same_store(status, config.attach, self.url)
            return attached, len(status["children"])
        bounds = (None if config.min_children is None or config.max_children is None
                  else (config.min_children, config.max_children))
        own = OwnFleet(config.children, self.url, self.namespace, self.tmp / "fleet.log", bounds)
        return own, config.children

    async def _run(self, client: WorkflowClient) -> dict[str, Any]:
        config = self.config
        fleet, children = await self._fleet()
        load = Load(client, config, self.waiters)
        load.ledger = self.ledger
        await load.check_params()
        commands_before = await self._commands()
        stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        killer: Killer | None = None
        upgrader: Upgrader | None = None

        def background(coro: Coroutine[Any, Any, None]) -> None:
            tasks.append(asyncio.create_task(_guarded(load, coro)))

        def begin() -> float:
            nonlocal killer, upgrader
            now = time.perf_counter()
            load.progress_from = now
            check = fleet.check_alive if isinstance(fleet, OwnFleet) else _nothing
            background(load.watch(check))
            if config.kill_every is not None:
                killer = Killer(fleet, config.kill_every, now)
                background(_kill(fleet, killer, stop))
            if config.upgrade_every is not None:
                upgrader = Upgrader(fleet, config.upgrade_every, now)
                background(_upgrade(fleet, upgrader, stop))
            progress.extra = _kills(killer)
            return now

        progress = Progress(self.stream, load)
        background(progress.run(stop))

        try:
            started, submit_seconds = await self._drive(load, fleet, begin)
            ended = load.last_end or time.perf_counter()
            stop.set()
            await asyncio.gather(*tasks)
            if load.fatal is not None:
                raise load.fatal
            commands_after = await self._commands()
            final_status = await _final_status(fleet)
            journals = await _journals(load)
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if isinstance(fleet, OwnFleet):
                await fleet.stop()

        figures = self._figures(load, children, started, ended, submit_seconds,
                                commands_before, commands_after, final_status, journals,
                                killer, upgrader)
        if config.verify:
            await _verify(figures, load, fleet)
        if not figures["verification"]["ok"] and isinstance(fleet, OwnFleet):
            figures["fleet_log_tail"] = fleet.log_tail(40)  # its temporary directory goes
        return figures

    async def _drive(self, load: Load, fleet: Fleet, begin: Callable[[], float]
                     ) -> tuple[float, float]:
        """Put the load through: queue it all then start the fleet (``queue`` mode), or
        start the fleet then submit as it goes. (When the timing started, the seconds
        the submits took.)"""
        config = self.config
        if config.mode == "queue":
            t0 = time.perf_counter()
            await load.submit_all()
            submit_seconds = time.perf_counter() - t0
            if load.fatal is not None:
                raise load.fatal
            if isinstance(fleet, OwnFleet):
                fleet.start()
                started = begin()
            else:
                begin()
                started = t0
            await load.wait_all()
            return started, submit_seconds
        if isinstance(fleet, OwnFleet):
            fleet.start()
            await fleet.wait_ready()
        started = begin()
        if config.rate is not None:
            await load.open_loop(config.rate)
        else:
            await load.closed_loop(config.concurrency or 1)
        return started, (load.last_submit or started) - (load.first_submit or started)

    def _figures(self, load: Load, children: int, started: float, ended: float,
                 submit_seconds: float, commands_before: int | None,
                 commands_after: int | None, status: dict[str, Any] | None,
                 journals: Journals | None, killer: Killer | None,
                 upgrader: Upgrader | None = None) -> dict[str, Any]:
        config = self.config
        runs, steps = config.runs, config.steps
        seconds = max(ended - started, 1e-9)
        infos = [r.info for r in load.records if r.info is not None]
        duration, latency = _timings(load, infos)
        kills = killer.kills if killer else []
        verification = verify(load.records, config.check)
        # The user's workflow: as many steps as its journals recorded.
        steps_done = verification.completed * steps if config.workflow is None else (
            journals.steps if journals else None)
        per_run = None if commands_before is None or commands_after is None else round(
            (commands_after - commands_before) / runs, 1)
        return {
            "store": self.url.split("://", 1)[0],
            "children": children,
            "runs": runs,
            "workflow": load.workflow,
            "params": config.params if config.workflow else None,
            "expect": config.expect.value if config.expect else None,
            "expect_given": config.expect is not None,
            "steps": steps if config.workflow is None else None,
            "steps_completed": steps_done,
            "submit_seconds": round(submit_seconds, 3),
            "seconds": round(seconds, 3),
            "runs_per_s": round(verification.completed / seconds, 1),
            "steps_per_s": None if steps_done is None else round(steps_done / seconds, 1),
            "run_duration_p50_ms": duration["p50"] if duration else None,
            "run_duration_p99_ms": duration["p99"] if duration else None,
            "note": _note(config),
            "mode": config.mode,
            "rate": config.rate,
            "concurrency": config.concurrency,
            "submit_rate_achieved": _submit_rate(load, runs),
            "step_kind": config.step_kind if config.workflow is None else None,
            "payload_bytes": config.payload_bytes if config.workflow is None else None,
            "attached": config.attach,
            "namespace": self.namespace if self.valkey else None,
            "latency_ms": latency,
            "run_duration_ms": duration,
            "child_shares": _shares(status, kills, journals),
            "shards": shard_balance(status, load.workflow),
            "store_commands_per_run": per_run,
            "store_commands_note": (COMMANDS_NOTE if per_run is not None else
                                    self.commands_error or "measured on Valkey/Redis stores only"),
            "kill_every": config.kill_every,
            "kills": kills,
            "min": config.min_children,
            "max": config.max_children,
            "upgrade_every": config.upgrade_every,
            "upgrades_at_s": upgrader.sent if upgrader else [],
            "runs_retried": sum(1 for i in infos if i.attempt > 1),
            "verification": verification.as_dict(),
            "problems": verification.problems(),
            "gave_up": _gave_up(load, config),
        }


def _submit_rate(load: Load, runs: int) -> float | None:
    """Runs submitted per second, from the first submit to the last."""
    if load.first_submit is None or load.last_submit is None or runs <= 1:
        return None
    span = load.last_submit - load.first_submit
    return round((load.submitted - 1) / span, 1) if span > 0 else None


def _shares(status: dict[str, Any] | None, kills: list[dict[str, Any]],
            journals: Journals | None) -> list[dict[str, Any]]:
    """Each child's share of the runs: the children the final status lists, those killed
    on the way (by pid), from the workers the journals name."""
    children = (status or {}).get("children", [])
    live = {str(c.get("worker_id")) for c in children}
    known = {str(c.get("worker_id")): c["pid"] for c in children
             if isinstance(c.get("pid"), int)}
    known.update({str(k["worker_id"]): k["pid"] for k in kills if k.get("worker_id")})
    killed = {str(k["worker_id"]) for k in kills}
    return child_shares(journals.workers if journals else {}, known, killed, live)


def _nothing() -> None:
    return None


def _kills(killer: Killer | None) -> Any:
    if killer is None:
        return None
    return lambda: f"kills {len(killer.kills)}"


async def _upgrade(fleet: Fleet, upgrader: Upgrader, stop: asyncio.Event) -> None:
    if isinstance(fleet, OwnFleet):
        await fleet.wait_url()
    await upgrader.run(stop)


async def _kill(fleet: Fleet, killer: Killer, stop: asyncio.Event) -> None:
    if isinstance(fleet, OwnFleet):
        await fleet.wait_url()  # queue mode starts the load before the fleet is up
    await killer.run(stop)


def _check_serves(status: dict[str, Any], url: str, workflow: str) -> None:
    """A fleet with no ready child, or whose ready children do not serve ``workflow``, is a
    usage error: its runs would only wait. The names served are each child's
    ``workflows`` in ``/status``, else (a fleet that does not list them) the shards'."""
    ready = [c for c in status["children"] if c.get("state") == ChildState.READY]
    if not ready:
        raise BenchError(f"--attach: the fleet at {url} has no ready child "
                         f"(status {status.get('status')!r})", code=2)
    served = {str(name) for c in ready for name in c.get("workflows") or []}
    served |= set(status.get("shards") or {})
    if served and workflow not in served:
        how = ("start it with --app pyrula.examples.bench" if workflow == WORKFLOW
               else "pick one of them with --workflow")
        raise BenchError(
            f"--attach: the fleet at {url} does not serve {workflow!r}; it serves "
            f"{', '.join(sorted(served))}: {how}", code=2,
        )


def _check_same_store(status: dict[str, Any], url: str, store_url: str) -> None:
    """An attached fleet on a SQLite file other than the bench's is a usage error: its
    runs would never be claimed. (A Valkey URL may name one server by several hosts, so
    only SQLite files, named by their absolute paths, are compared.)"""
    theirs = status.get("store")
    ours = shown_url(store_url)
    if not isinstance(theirs, str) or theirs == ours:
        return
    if sqlite_file(theirs) is not None or sqlite_file(store_url) is not None:
        raise BenchError(f"--attach: the fleet at {url} runs on {theirs}, the bench on "
                         f"{ours}: pass --store {theirs}", code=2)


def _timings(load: Load, infos: list[Any]) -> tuple[Any, Any]:
    """The runs' durations (start to end, from their records) and latencies (submit to
    result), as percentiles in ms."""
    durations = [(i.finished_at - i.started_at) * 1000 for i in infos
                 if i.started_at is not None and i.finished_at is not None]
    latencies = [v for r in load.records if (v := r.latency_ms) is not None]
    return percentiles(durations), percentiles(latencies)


def _gave_up(load: Load, config: Any) -> str | None:
    """Why the load stopped waiting for its runs, if it did (an attached fleet: a hint)."""
    if load.reason and config.attach:
        return (f"{load.reason} (is the fleet at {config.attach} on this store and "
                "namespace?)")
    return load.reason


def _note(config: BenchConfig) -> str:
    if config.mode == "rate":
        how = (f"open loop: {config.rate:g} runs/s submitted while the fleet ran; the time runs "
               "from the first submit to the last result")
    elif config.mode == "concurrency":
        how = (f"closed loop: {config.concurrency} runs kept in flight; the time runs from the "
               "first submit to the last result")
    elif config.attach:
        how = ("runs were all submitted at once to a running fleet; the time runs from the "
               "first submit to the last result, and latency includes the time runs queued")
    else:
        how = ("fleet start-up is included; runs were all queued before it started, so "
               "latency is mostly the time they queued")
    return how


async def _guarded(load: Load, coro: Coroutine[Any, Any, None]) -> None:
    """Run a background part of the load; a BenchError it raises abandons the load."""
    try:
        await coro
    except BenchError as exc:
        load.abandon(str(exc).splitlines()[0], exc)


async def _journals(load: Load) -> Journals | None:
    """The load's journals, for the shares; None when the store does not answer (the
    report goes on without them)."""
    try:
        return await read_journals(load)
    except StoreUnavailable:
        return None


async def _final_status(fleet: Fleet) -> dict[str, Any] | None:
    """The fleet's ``/status`` once the load is done; None when it cannot be read."""
    if isinstance(fleet, OwnFleet) and fleet.url is None:
        await fleet.wait_url()
    if fleet.url is None:
        return None
    try:
        status: dict[str, Any] = await fleet.status()
        return status
    except BenchError:
        return None


async def _verify(figures: dict[str, Any], load: Load, fleet: Fleet) -> None:
    """``--verify``: the invariant checker's report over the load, into ``figures``."""
    log = fleet.log_text() if isinstance(fleet, OwnFleet) else None
    report = await invariants(load, log)
    figures["invariants"] = report.as_dict()
    figures["invariants_line"] = report.line()
    figures["invariants_note"] = (
        None if log is not None else
        "stale_writes_refused is counted from the fleet's log: an attached fleet's "
        "is not read, so it shows 0")
    if not report.ok:
        figures["verification"]["ok"] = False
        figures["problems"] = [*figures["problems"], *report.problems[:5]]
