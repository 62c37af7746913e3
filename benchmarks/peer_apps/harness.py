"""What every system's driver shares: the benchmark's own Redis server, worker processes
in process groups of their own, the command counter and the figures of a workload."""

from __future__ import annotations

import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psutil
import redis

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
#: The environment variable the peers' app modules read their Redis URL from.
URL_ENV = "PEERS_REDIS_URL"
#: How long one run's result may take before the workload is declared broken.
RESULT_TIMEOUT = 120.0
POLL = 0.01
# Ports picked here sit below the kernel's ephemeral range, so no outgoing connection takes
# one between the check and the server's bind (a lost race is retried on another port).
_PORT_RANGE = (20000, 32000)
_LIVE: list[Service] = []


class BenchError(RuntimeError):
    """A system under test misbehaved (a wrong result, a worker that died, a timeout)."""


def until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` until it returns something truthy, or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(POLL)


def child_env(url: str) -> dict[str, str]:
    """The environment of every process started here: this tree's code, the bench server."""
    return {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", URL_ENV: url}


class Service:
    """A process started in a session (so a process group) of its own, its output in a log.

    ``stop`` asks it to end (SIGTERM to the leader, or to the whole group for commands whose
    leader does not pass it on), waits, then kills whatever of the group is left.
    ``kill_all`` is the safety net for Ctrl+C and exceptions.
    """

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str],
                 log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            list(argv), cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        _LIVE.append(self)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check(self) -> None:
        if not self.alive():
            raise BenchError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")

    def log(self, tail: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_bytes()[-tail:].decode(errors="replace")

    def stop(self, *, group: bool = False, timeout: float = 60.0) -> None:
        if self.alive():
            try:
                if group:
                    os.killpg(self.proc.pid, signal.SIGTERM)
                else:
                    self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        """SIGKILL the whole group (what a leader left behind too) and reap the leader."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        self._log.close()
        if self in _LIVE:
            _LIVE.remove(self)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _group_alive(self.proc.pid):
            time.sleep(POLL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def kill_all() -> None:
    for service in list(reversed(_LIVE)):
        try:
            service.kill()
        except Exception as exc:  # keep reaping the others
            print(f"could not reap {service.name}: {exc}", file=sys.stderr)


def start_python(name: str, args: Sequence[str], url: str, log_dir: Path) -> Service:
    return Service(name, [sys.executable, *args], child_env(url), log_dir)


class RedisServer:
    """One ``redis-server`` of the benchmark's own, on a free port, without persistence."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        for _ in range(10):
            self.port = _free_port()
            self.service = Service("redis-server", [
                "redis-server", "--port", str(self.port), "--bind", HOST, "--save", "",
                "--appendonly", "no", "--dir", str(directory), "--daemonize", "no",
            ], dict(os.environ), directory)
            self.url = f"redis://{HOST}:{self.port}"
            self.client = redis.Redis(host=HOST, port=self.port)
            if self._wait_ping():
                self.version = str(self.client.info("server")["redis_version"])
                return
            self.service.kill()
        raise BenchError("redis-server did not start on any of 10 ports")

    def _wait_ping(self) -> bool:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if not self.service.alive():
                return False  # most likely lost the race for its port: try another
            try:
                if self.client.ping():
                    return True
            except redis.ConnectionError:
                pass
            time.sleep(POLL)
        return False

    def reset(self) -> None:
        """Empty the server and zero its command statistics: a scenario starts from here."""
        self.client.flushall()
        self.client.config_resetstat()
        self._cpu_at_reset = self.cpu()

    def cpu(self) -> float:
        """The server process's CPU seconds so far (user + system, ``INFO cpu``)."""
        cpu = self.client.info("cpu")
        return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])

    def usage(self) -> tuple[int, float]:
        """Since the last reset: the calls, every command (inside scripts too) but our own,
        and the server's CPU seconds (the little our own INFO calls cost included)."""
        stats = self.client.info("commandstats")
        calls = sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_")
                    and k not in ("cmdstat_info", "cmdstat_config|resetstat"))
        return calls, self.cpu() - self._cpu_at_reset

    def stop(self) -> None:
        self.client.close()
        self.service.stop()


def _free_port() -> int:
    while True:
        port = random.randint(*_PORT_RANGE)
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
            return port


def compile_sources() -> None:
    """Write the bytecode of this tree's code, as pip does for an installed package (the
    peers are installed so): an editable checkout run with PYTHONDONTWRITEBYTECODE set
    would otherwise compile every module at every process start, fleet children's
    start-up included."""
    import compileall

    compileall.compile_dir(str(ROOT / "src"), quiet=1)


def log_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="pyrula-peers-"))


# --- figures ---------------------------------------------------------------------------


def group_cpu(service: Service) -> float:
    """CPU seconds (user + system) of a service's process and every process under it, as
    far as they are still running (a worker that exited took its count with it)."""
    total = 0.0
    try:
        leader = psutil.Process(service.proc.pid)
        processes = [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return total
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


class CpuMarks:
    """CPU seconds of the workers, of this (reading) process and of the server at one
    moment: two of them, at the first and the last result, split the steady stretch's CPU
    between the three."""

    def __init__(self, workers: Service, server: RedisServer) -> None:
        self.workers = group_cpu(workers)
        self.client = time.process_time()
        self.server = server.cpu()

    def per_run_ms(self, later: CpuMarks, runs: int) -> dict[str, float]:
        def ms(seconds: float) -> float:
            return round(seconds * 1000 / runs, 4) if runs > 0 else 0.0

        return {
            "steady_workers_cpu_ms_per_run": ms(later.workers - self.workers),
            "steady_client_cpu_ms_per_run": ms(later.client - self.client),
            "steady_server_cpu_ms_per_run": ms(later.server - self.server),
        }


class Clock:
    """The marks of a throughput workload: submits, worker spawn, first and last result."""

    def __init__(self) -> None:
        self.submit_start = self.submit_end = self.spawn = self.first = self.last = 0.0

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    def figures(self, runs: int, usage: tuple[int, float]) -> dict[str, float]:
        commands, server_cpu_s = usage
        submit_s = self.submit_end - self.submit_start
        total_s = self.last - self.spawn
        steady_s = self.last - self.first
        return {
            "runs": runs,
            "submit_s": round(submit_s, 4),
            "submit_per_s": round(runs / submit_s, 1),
            "seconds_from_spawn": round(total_s, 4),
            "runs_per_s": round(runs / total_s, 1),
            "first_result_after_spawn_s": round(self.first - self.spawn, 4),
            "steady_runs_per_s": round((runs - 1) / steady_s, 1) if steady_s > 0 else 0.0,
            "commands": commands,
            "commands_per_run": round(commands / runs, 2),
            "server_cpu_ms_per_run": round(server_cpu_s * 1000 / runs, 4),
        }


def check_value(system: str, index: int, got: Any, expected: int) -> None:
    if got != expected:
        raise BenchError(f"{system}: run {index} returned {got!r}, expected {expected}")


def latency_figures(times_ms: list[float]) -> dict[str, float]:
    ordered = sorted(times_ms)

    def rank(q: float) -> float:  # nearest-rank percentile
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    return {
        "samples": len(ordered),
        "p50_ms": round(rank(0.50), 3),
        "p99_ms": round(rank(0.99), 3),
        "mean_ms": round(sum(ordered) / len(ordered), 3),
        "max_ms": round(ordered[-1], 3),
    }


H = TypeVar("H")


def sync_throughput(server: RedisServer, system: str, runs: int, steps: int,
                    submit: Callable[[int], H], spawn: Callable[[], Service],
                    wait: Callable[[H], Any], stop: Callable[[Service], None]) -> dict[str, float]:
    """The throughput workload for a synchronous client: ``runs`` submits one by one, then
    the workers are spawned (the clock starts there), then every result is read back in
    submit order and checked to be ``x + steps``. Commands cover all of it."""
    server.reset()
    clock = Clock()
    clock.submit_start = clock.now()
    handles = [submit(i) for i in range(runs)]
    clock.submit_end = clock.spawn = clock.now()
    workers = spawn()
    first_cpu: CpuMarks | None = None
    try:
        for i, handle in enumerate(handles):
            check_value(system, i, wait(handle), i + steps)
            if i == 0:
                clock.first = clock.now()
                first_cpu = CpuMarks(workers, server)
        clock.last = clock.now()
        last_cpu = CpuMarks(workers, server)
        assert first_cpu is not None  # at least one run
        usage = server.usage()
        workers.check()
    finally:
        stop(workers)
    return {**clock.figures(runs, usage), **first_cpu.per_run_ms(last_cpu, runs - 1)}


def timed_round_trips(system: str, samples: int, warmup: int,
                      round_trip: Callable[[int], Any]) -> dict[str, float]:
    """``warmup`` untimed, then ``samples`` timed sequential ``round_trip(i)`` calls
    (submit -> result of ``x + 1``) on warm, idle workers."""
    for i in range(warmup):
        check_value(system, i, round_trip(i), i + 1)
    times = []
    for i in range(samples):
        t0 = time.perf_counter()
        value = round_trip(i)
        times.append((time.perf_counter() - t0) * 1000)
        check_value(system, i, value, i + 1)
    return latency_figures(times)


async def atimed_round_trips(system: str, samples: int, warmup: int,
                             round_trip: Callable[[int], Awaitable[Any]]) -> dict[str, float]:
    """``timed_round_trips`` for an async client."""
    for i in range(warmup):
        check_value(system, i, await round_trip(i), i + 1)
    times = []
    for i in range(samples):
        t0 = time.perf_counter()
        value = await round_trip(i)
        times.append((time.perf_counter() - t0) * 1000)
        check_value(system, i, value, i + 1)
    return latency_figures(times)
