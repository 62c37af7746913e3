"""A PostgreSQL cluster of a test's own, to stop and start at will (the machine's shared
server is never touched): ``initdb`` into a fresh directory, ``pg_ctl start`` on a free
port of 127.0.0.1, ``pg_ctl stop -m immediate`` for a crash, ``pg_ctl start`` again (crash
recovery replays the WAL).

Postgres refuses to run as root, so every command runs as the ``postgres`` user through
``runuser`` (which needs root), in a directory of its own under the system's temporary
directory (a pytest ``tmp_path`` sits under a root-only directory the postgres user cannot
enter). ``skip_reason()`` says why no cluster can be had here (no binaries, not root, no
postgres user); tests skip with it (``tests/tools.py``: under CI=true they fail). Every
cluster is stopped when the test process exits, should a test not get to it.
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from tests.servers import free_port

HOST = "127.0.0.1"
USER = "postgres"
#: Where Debian puts the server binaries (the newest version first);
#: ``$PYRULA_TEST_PG_BIN`` overrides.
BIN_GLOB = "/usr/lib/postgresql/*/bin"

_LIVE: set[PgCluster] = set()
_LIVE_LOCK = threading.Lock()


def bin_dir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or None."""
    override = os.environ.get("PYRULA_TEST_PG_BIN")
    for path in [Path(override)] if override else _debian_bin_dirs():
        if (path / "initdb").is_file() and (path / "pg_ctl").is_file():
            return path
    return None


def _debian_bin_dirs() -> list[Path]:
    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in path.parent.name.split(".") if part.isdigit())

    return sorted(Path("/").glob(BIN_GLOB.lstrip("/")), key=version, reverse=True)


def skip_reason() -> str | None:
    """None if a private cluster can be started here, else why not."""
    if bin_dir() is None:
        return (f"no PostgreSQL server binaries (initdb, pg_ctl) in {BIN_GLOB} or "
                "$PYRULA_TEST_PG_BIN (make system-deps installs them as root: apt-get install "
                "postgresql)")
    if os.geteuid() != 0:
        return "a private PostgreSQL cluster runs as the postgres user: that needs root"
    if shutil.which("runuser") is None:
        return "runuser (util-linux) is needed to run PostgreSQL as the postgres user"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"no {USER!r} user to run a private PostgreSQL cluster as"
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return "asyncpg is not installed"
    return None


class PgClusterError(RuntimeError):
    """initdb or pg_ctl failed; the message carries the server's log."""


class PgCluster:
    """One cluster in ``directory`` (``data/``, ``server.log``, the socket), on ``port``."""

    def __init__(self, directory: Path, port: int) -> None:
        self.directory = directory
        self.port = port
        self.data = directory / "data"
        self.log_path = directory / "server.log"
        self._bin = bin_dir()
        assert self._bin is not None, skip_reason()

    @property
    def dsn(self) -> str:
        return f"postgresql://{USER}@{HOST}:{self.port}/postgres"

    def _run(self, *command: str, timeout: float = 60.0) -> str:
        assert self._bin is not None
        args = ["runuser", "-u", USER, "--", str(self._bin / command[0]), *command[1:]]
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise PgClusterError(f"{' '.join(args)} failed ({done.returncode}):\n"
                                 f"{done.stdout}{done.stderr}\n--- {self.log_path} ---\n"
                                 f"{self.log_tail()}")
        return done.stdout

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", USER, "-E", "UTF8",
                  "--no-sync")

    def start(self) -> None:
        """Start the server and wait until it accepts connections (crash recovery first,
        after an immediate stop)."""
        options = (f"-p {self.port} -k {self.directory} -c listen_addresses={HOST} "
                   "-c max_connections=100 -c shared_buffers=32MB")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log_path),
                  "-w", "-t", "60", "start")
        with _LIVE_LOCK:
            _LIVE.add(self)

    def stop(self, mode: str = "immediate") -> None:
        """``pg_ctl stop -m immediate`` (default): every server process quits at once, as
        in a crash; ``fast`` shuts down cleanly."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
        with _LIVE_LOCK:
            _LIVE.discard(self)

    @property
    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def destroy(self) -> None:
        """Stop the server if it runs and remove its directory."""
        if self.running:
            try:
                self.stop()
            except PgClusterError:
                pass
        shutil.rmtree(self.directory, ignore_errors=True)

    def __repr__(self) -> str:
        return f"<PgCluster {HOST}:{self.port} {self.directory}>"


def start_pgcluster() -> PgCluster:
    """A new cluster, initialised and started; the caller ``destroy()``s it."""
    directory = Path(tempfile.mkdtemp(prefix="pyrula-pg-"))
    entry = pwd.getpwnam(USER)
    os.chown(directory, entry.pw_uid, entry.pw_gid)
    cluster = PgCluster(directory, free_port())
    try:
        cluster.init()
        for attempt in range(5):
            try:
                cluster.start()
                break
            except PgClusterError:
                # Another process took the port between our look and the server's bind.
                if attempt == 4 or "already in use" not in cluster.log_tail():
                    raise
                cluster.port = free_port()
    except BaseException:
        cluster.destroy()
        raise
    return cluster


@atexit.register
def _stop_all() -> None:
    with _LIVE_LOCK:
        clusters = list(_LIVE)
    for cluster in clusters:
        try:
            cluster.stop()
        except Exception:  # the process is exiting: stop what can be stopped
            pass
