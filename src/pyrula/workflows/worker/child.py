"""A fleet child: one WorkflowWorker in its own process, reporting to its supervisor.

Started by the supervisor (through ``pyrula.supervisor.trampoline``) after a fork from
the fork server, which holds no threads, loops or sockets; everything here — the event
loop, the store's connections, the sync-step pool — is created after the fork.
The child heartbeats over its pipe from its own event loop (a stuck loop sends nothing),
drains on SIGTERM and ignores SIGINT (Ctrl+C reaches the whole process group; the
supervisor decides). A child that cannot boot says why and exits with EXIT_BOOT_FAILURE.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from pyrula import logs
from pyrula.shared_report import SharedReport
from pyrula.wire import (
    EXIT_BOOT_FAILURE,
    HEARTBEAT_INTERVAL,
    METRICS_INTERVAL,
    Heartbeat,
    decode,
    encode,
    heartbeat_message,
    metrics_message,
)

logger = logging.getLogger("pyrula.fleet.child")

#: Heartbeat cadence until the worker is ready (seconds).
STARTING_HEARTBEAT_INTERVAL = 0.01
#: How often the child looks whether its store answers (seconds).
STORE_CHECK_INTERVAL = 1.0
#: Frames of a boot error's traceback that are reported (the innermost ones).
BOOT_TRACEBACK_FRAMES = 8
#: The youngest generation's collection threshold in a child (Python's default: 700). A
#: busy child always holds more young objects than 700, those of its runs in flight, so at
#: the default it walks them again and again although they are freed, as each attempt
#: ends, without the collector; the collector is for cycles, which a child makes few of.
#: Over a 5,000-run drain its collections took ~10 us of CPU per run at 700 and none at
#: this threshold; cyclic garbage waits for up to this many objects (a few MB at most).
GC_YOUNG_THRESHOLD = 10_000


def _boot_failed(conn: Connection, message: str, detail: str = "") -> None:
    """Tell the supervisor why this child cannot serve, and exit as a boot failure.

    The supervisor logs it (the traceback once, not once per child that fails the same
    way); the child logs it itself only when the supervisor cannot be told."""
    try:
        conn.send_bytes(encode({"type": "boot_error", "message": message,
                                "traceback": detail}))
    except OSError:
        logger.error("child_boot_failed: %s", f"{message}\n{detail}" if detail else message,
                     extra={"event": "child_boot_failed"})
    logging.shutdown()
    os._exit(EXIT_BOOT_FAILURE)


def _app_traceback(exc: BaseException) -> str:
    """The app's own frames of an error raised while booting (``pyrula.apps.app_frames``:
    none of pyrula's, none of the import machinery's), its innermost kept, then the
    exception; empty when no app code was involved (the store refused the child)."""
    from pyrula.apps import app_frames

    frames = app_frames(exc.__traceback__)
    if not frames:
        return ""
    lines = [*traceback.format_list(frames[-BOOT_TRACEBACK_FRAMES:]),
             *traceback.format_exception_only(exc)]
    return "".join(lines).rstrip("\n")


def _import(target: str) -> Any:
    import importlib

    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module


def preloaded() -> None:
    """In the fork server, once it has loaded the app and this runtime: read the text of
    the workflow code for the build, which every child would otherwise read (and tokenize)
    for itself on its way to its first run. Inherited by fork; and the text of the code the
    children run, even if its file changes on disk later."""
    from pyrula.workflows.build import read_texts
    from pyrula.workflows.definition import REGISTRY

    read_texts(REGISTRY)


def _archived(store: Any) -> Any:
    """``store``, archived to Postgres where the fleet's environment names an archive (its
    module is imported only then: the fork server preloads it only then)."""
    from pyrula.config.defaults import archive_configured

    if not archive_configured(os.environ):
        return store
    from pyrula.workflows.stores.archive import archived_if_configured

    return archived_if_configured(store)


def main(config: dict[str, Any], conn: Connection, board: SharedReport | None = None) -> None:
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # The children share the fleet's stderr: each line says which child wrote it.
    process = {"slot": config["slot"], "pid": os.getpid()} if "slot" in config else None
    logs.configure(config.get("log_format", "text"), config.get("log_level", "INFO"), process)
    if config.get("cwd") and config["cwd"] not in sys.path:
        sys.path.insert(0, config["cwd"])
    try:
        from pyrula.config.store_url import shown_url
        from pyrula.config.worker import WorkerOptions
        from pyrula.workflows.stores import store_from_url
        from pyrula.workflows.worker.worker import WorkflowWorker

        for app in config.get("apps", []):
            _import(app)
        chosen = [_import(t) for t in config.get("workflows", [])] or None
        store_options: dict[str, Any] = {}
        if config.get("namespace"):
            store_options["namespace"] = config["namespace"]
        if config.get("cluster") is not None:
            store_options["cluster"] = config["cluster"]
        backend = _archived(store_from_url(config["store_url"], **store_options))
        options = WorkerOptions(**config.get("worker_options", {}), health_port=None)
        reach = StoreCheck()
        reports = Reports(conn, board)
        worker = WorkflowWorker(store=backend, workflows=chosen, options=options,
                                on_claimed=lambda _: reports.held(worker, reach),
                                on_user_code=lambda: reports.held(worker, reach))
        worker.store_shown = shown_url(config["store_url"])
        # The fork server is the fleet's own (one per fleet): its pid names the fleet.
        worker.fleet = f"{socket.gethostname()}-{os.getppid()}"
    except BaseException as exc:  # the child cannot serve: say why, exit as a boot failure
        _boot_failed(conn, f"{type(exc).__name__}: {exc}", _app_traceback(exc))
        return
    code = asyncio.run(_serve(worker, conn, reach, reports))
    logging.shutdown()
    os._exit(code)


class StoreCheck:
    """Whether the child's store answered when the child last looked (every
    ``STORE_CHECK_INTERVAL``): a child whose store does not answer is alive but not ready,
    and the fleet's /readyz turns 503 while no child can reach its store."""

    def __init__(self) -> None:
        self.ok = True

    async def watch(self, worker: Any) -> None:
        while True:
            if worker.state == "ready":
                self.ok = await worker.store_reachable()
            await asyncio.sleep(STORE_CHECK_INTERVAL)


class Reports:
    """What this child tells its supervisor of itself, numbered: a heartbeat over the pipe
    at its interval, and the runs it holds (``held``) right after each claim and before a
    run enters its code unreported, into the memory it shares with the supervisor when it
    has some (no wake-up of the supervisor on the path of a run), else as a heartbeat."""

    def __init__(self, conn: Connection, board: SharedReport | None) -> None:
        self.conn = conn
        self.board = board
        self.seq = 0

    def heartbeat(self, worker: Any, reach: StoreCheck) -> bytes:
        """The periodic heartbeat: it names exactly the runs in user code now."""
        self.seq += 1
        return heartbeat_message(_beat(worker, reach, self.seq,
                                       *worker.user_code_report(heartbeat=True)))

    def held(self, worker: Any, reach: StoreCheck) -> None:
        """Report the held runs now (see ``pyrula.wire``)."""
        self.seq += 1
        user_code, suspects = worker.user_code_report(heartbeat=False)
        if self.board is not None and self.board.write(self.seq, {
                "worker_id": worker.worker_id, "held": worker.held_runs(),
                "user_code": user_code, "suspects": suspects}):
            return
        _send(self.conn, heartbeat_message(_beat(worker, reach, self.seq, user_code,
                                                 suspects)))


def _beat(worker: Any, reach: StoreCheck, seq: int, user_code: list[str],
          suspects: list[str]) -> Heartbeat:
    return Heartbeat(
        state=worker.state,
        worker_id=worker.worker_id,
        pid=os.getpid(),
        in_flight=worker.in_flight,
        runs_done=worker.runs_done,
        shards=worker.shards(),
        held=worker.held_runs(),
        user_code=user_code,
        suspects=suspects,
        claim_tick_age=round(worker.claim_tick_age(), 3),
        free=worker.free_slots,
        store_ok=reach.ok,
        build=worker.build,
        seq=seq,
    )


def _on_supervisor(worker: Any, conn: Connection) -> None:
    """What the supervisor tells this child during an upgrade (``supervisor.upgrade``)."""
    try:
        while conn.poll():
            message = decode(conn.recv_bytes())
            kind = message.get("type")
            if kind == "retire":
                worker.retire()
            elif kind == "take":
                task = asyncio.get_running_loop().create_task(worker.take(str(message["run_id"])))
                _TAKES.add(task)
                task.add_done_callback(_TAKES.discard)
            elif kind == "generations":
                worker.generation.set_older(message.get("older") or [])
            elif kind == "audit":
                task = asyncio.get_running_loop().create_task(
                    _audit(worker, conn, str(message["build"])))
                _TAKES.add(task)
                task.add_done_callback(_TAKES.discard)
    except (EOFError, OSError, ValueError):
        asyncio.get_running_loop().remove_reader(conn.fileno())


#: The runs being taken over by id, and audits under way (kept referenced until done).
_TAKES: set[asyncio.Task[Any]] = set()
#: Run ids an audit's reply names (its count is whole).
AUDIT_IDS_SHOWN = 20


async def _audit(worker: Any, conn: Connection, build: str) -> None:
    """Tell the supervisor how many open runs of ``build`` this child's code cannot replay
    (``worker.generations.open_runs_of``); an audit that fails says nothing, and the
    supervisor asks again."""
    try:
        found = await worker.open_runs_of(build)
    except Exception as exc:  # the store went away meanwhile: the next audit tries again
        logger.warning("audit of build %s failed: %s", build, exc)
        return
    _send(conn, encode({"type": "audited", "build": build, "open": len(found),
                        "runs": found[:AUDIT_IDS_SHOWN]}))


def _metrics(worker: Any) -> bytes:
    worker.metrics.set("pyrula.workflows.runs.in_flight", float(worker.in_flight))
    worker.metrics.set("pyrula.workflows.step_threads.busy", float(worker.step_threads_busy))
    return metrics_message(worker.metrics.samples(), worker.workflow_names)


def _send(conn: Connection, message: bytes) -> bool:
    """Send one message to the supervisor; False once it is gone."""
    try:
        conn.send_bytes(message)
    except OSError:  # BrokenPipeError included
        return False
    return True


async def _serve(worker: Any, conn: Connection, reach: StoreCheck, reports: Reports) -> int:
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, worker.stop)

    async def beat() -> None:
        # Stamped by this loop: a child whose loop is stuck stops sending, and is replaced.
        # A heartbeat also goes out after every claim (``on_claimed``) and before a run
        # enters its code unreported (``on_user_code``), so the supervisor knows each run
        # this child holds, and each that is in its own code, before that code can crash it.
        # While starting it beats often, and once more the moment it is ready, so that the
        # supervisor sees it ready at once (a respawn, a recycle and a reload wait for
        # that), not a beat later.
        metrics_due = time.monotonic()
        while True:
            if not _send(conn, reports.heartbeat(worker, reach)):
                worker.stop()  # the supervisor is gone: drain and leave
                return
            if time.monotonic() >= metrics_due:
                _send(conn, _metrics(worker))
                metrics_due = time.monotonic() + METRICS_INTERVAL
            if worker.state == "starting":  # the next beat at once when it is ready
                await worker.wait_ready(STARTING_HEARTBEAT_INTERVAL)
            else:
                await asyncio.sleep(HEARTBEAT_INTERVAL)

    heartbeat = asyncio.create_task(beat())
    checker = asyncio.create_task(reach.watch(worker))
    worker.generation.on_refused = lambda run_id, build: _send(
        conn, encode({"type": "refused", "run_id": run_id, "build": build}))
    loop.add_reader(conn.fileno(), _on_supervisor, worker, conn)
    try:
        await worker.run()
    except Exception as exc:
        if worker.state == "starting":  # refused before serving (e.g. the store's checks)
            heartbeat.cancel()
            _boot_failed(conn, f"{type(exc).__name__}: {exc}")
        logger.exception("worker failed: %s", exc)
        return 1
    finally:
        loop.remove_reader(conn.fileno())
        heartbeat.cancel()
        checker.cancel()
        await asyncio.gather(heartbeat, checker, return_exceptions=True)
        _send(conn, _metrics(worker))  # what the drain counted, before the fleet sums it
        try:
            await worker.store.aclose()
        except Exception:  # closing is best effort on the way out
            logger.debug("store close failed", exc_info=True)
    return 0
