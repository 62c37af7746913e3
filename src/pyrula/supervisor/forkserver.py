"""How the supervisor starts the fork server its children are forked from: what the fork
server is told to preload, through the environment it inherits. The fork server runs
``pyrula.supervisor.preload``, which reads these variables.

Light on purpose (multiprocessing's fork server, ``os``, ``json``): a fleet starts its fork
server before it has imported anything else (``pyrula.supervisor.prestart``).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing.forkserver
import multiprocessing.process
import os
import signal
import socket
import sys
from collections.abc import Callable
from multiprocessing import connection, resource_tracker, spawn, util
from typing import Any

#: The module the fork server preloads: it loads the app and the modules below itself.
PRELOAD_MODULE = "pyrula.supervisor.preload"
#: Environment variable naming the modules the fork server preloads (comma-separated;
#: internal, read by ``pyrula.supervisor.preload``).
PRELOAD_ENV = "_PYRULA_FLEET_PRELOAD"
#: Environment variable with the fork server's app check (JSON ``{"apps", "workflows",
#: "report"}``; internal): it loads the app as a child would and writes what came of it
#: (JSON ``{"ok": true}`` or ``{"ok": false, "message", "frames"}``) to ``report``.
PRELOAD_CHECK_ENV = "_PYRULA_FLEET_PRELOAD_CHECK"
#: Environment variable with the path of the supervisor's main script (the
#: ``pyrula-fleet`` console script; internal): the fork server takes it as its own
#: ``__main__.__file__``, so that a child does not run that script again at its start.
PRELOAD_MAIN_ENV = "_PYRULA_FLEET_MAIN"


def main_script() -> str | None:
    """The path multiprocessing gives each child of this process as the main script to
    run again (``__main__``'s file, made absolute as it does), or None when it gives none
    (an interpreter run with ``-c`` or ``-m``)."""
    main = sys.modules["__main__"]
    if getattr(main.__spec__, "name", None) is not None:
        return None
    path = getattr(main, "__file__", None)
    if not isinstance(path, str):
        return None
    origin = multiprocessing.process.ORIGINAL_DIR  # type: ignore[attr-defined]
    if not os.path.isabs(path) and origin is not None:
        path = os.path.join(origin, path)
    return os.path.normpath(path)


def configure(preload: list[str], check: dict[str, Any] | None) -> None:
    """Make the next fork server started preload ``preload`` and check the app as
    ``check`` says (through ``PRELOAD_MODULE``, which survives an app that fails to import,
    where multiprocessing's own preload by name would not)."""
    os.environ[PRELOAD_ENV] = ",".join(preload)
    main = main_script()
    if main is not None:
        os.environ[PRELOAD_MAIN_ENV] = main
    if check is not None:
        os.environ[PRELOAD_CHECK_ENV] = json.dumps(check)
    multiprocessing.forkserver.set_forkserver_preload([PRELOAD_MODULE])


def start(*, tracker_later: bool = False, fork: bool = False) -> None:
    """Start the fork server now, unless one is running.

    multiprocessing starts its resource tracker (another interpreter) first. With
    ``tracker_later`` it does not: at a fleet's start that interpreter would take a core
    from the fork server's imports and the supervisor's, both on the way to the first
    child. The supervisor starts it with ``start_tracker`` once its own imports are done;
    a first spawn would start it anyway (multiprocessing does when it passes the tracker
    to a child).

    ``fork``: this process is young (one thread, no loop, no socket, little imported), so
    the fork server is forked from it (``fork_server``) instead of started as a new
    interpreter: the interpreter's own start, ~30 ms on the way to the first child. The
    resource tracker is then forked too (``fork_tracker``), at once: a fork takes no core
    from the imports on the way to the first child."""
    real = resource_tracker.ensure_running
    if tracker_later:
        resource_tracker.ensure_running = _not_yet
    try:
        if fork and fork_server():
            resource_tracker.ensure_running = real
            try:
                fork_tracker()  # as cheap now as later
            except OSError:  # the host refused the fork: started as usual, later
                pass
            return
        multiprocessing.forkserver.ensure_running()
    finally:
        resource_tracker.ensure_running = real


#: The version whose fork server and resource tracker this module knows how to start by a
#: fork (their ``main``'s arguments); later ones are started as multiprocessing starts them.
_FORKS_BEFORE = (3, 14)


def _may_fork() -> bool:
    return sys.version_info < _FORKS_BEFORE and hasattr(os, "fork")


def fork_server() -> bool:
    """Start multiprocessing's fork server as a fork of this process, exactly as
    ``ForkServer.ensure_running`` would start it as a new interpreter (the same listening
    socket, "alive" pipe and preload), and record it the same way; False (nothing done)
    where that is not known to hold, or a fork server runs already."""
    server: Any = multiprocessing.forkserver._forkserver  # private state, stable 3.4-3.13
    if not _may_fork():
        return False
    with server._lock:
        if server._forkserver_pid is not None:
            return False
        preload = server._preload_modules
        data = {}
        if preload:
            data = {key: value for key, value in spawn.get_preparation_data("ignore").items()
                    if key in ("main_path", "sys_path")}
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            # Every client holds the write end of the "alive" pipe; the fork server exits
            # when they all have closed it.
            alive_r, alive_w = os.pipe()
            try:
                fd = listener.fileno()
                pid = _fork_into(
                    lambda: multiprocessing.forkserver.main(fd, alive_r, preload, **data),
                    keep=(fd, alive_r))
            except BaseException:
                os.close(alive_w)
                raise
            finally:
                os.close(alive_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid
    return True


def fork_tracker() -> bool:
    """Start multiprocessing's resource tracker as a fork of this process (young, as for
    ``fork_server``), as ``ResourceTracker.ensure_running`` would start it as a new
    interpreter; False (nothing done) where that is not known to hold, or one runs."""
    tracker: Any = resource_tracker._resource_tracker  # private state, stable 3.8-3.13
    if not _may_fork():
        return False
    with tracker._lock:
        if tracker._fd is not None:
            return False
        r, w = os.pipe()
        # The signals the tracker ignores stay blocked until it ignores them (its main
        # unblocks them): one that came in between would kill it.
        blocked = resource_tracker._IGNORED_SIGNALS  # type: ignore[attr-defined]
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            pid = _fork_into(lambda: resource_tracker.main(r), keep=(r,))
        except BaseException:
            os.close(w)
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
            os.close(r)
        tracker._fd = w
        tracker._pid = pid
    return True


def _fork_into(life: Callable[[], object], keep: tuple[int, ...]) -> int:
    """Fork; the parent gets the child's pid. The child keeps only the standard streams
    and ``keep`` of its descriptors (as an interpreter started anew with them would), runs
    ``life``, and leaves with ``os._exit``: never back into this process's code, its
    ``atexit`` handlers or what its buffers held before the fork."""
    _flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        _close_all_but((0, 1, 2, *keep))
        life()
        code = 0
    except SystemExit as exc:  # a fork server whose clients have all gone
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:  # noqa: BLE001  (said as a process started anew would say it)
        sys.excepthook(*sys.exc_info())
    finally:
        _flush()
        os._exit(code)


def _close_all_but(keep: tuple[int, ...]) -> None:
    """Close every file descriptor but ``keep``, one by one. Not multiprocessing's
    ``util.close_all_fds_except``: it calls ``os.closerange(0, 0)`` for a kept 0, which
    CPython 3.11 turns into ``close_range(0, ~0)`` and so closes every descriptor."""
    try:
        open_fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every number up to the limit
        open_fds = list(range(os.sysconf("SC_OPEN_MAX")))
    for fd in open_fds:
        if fd not in keep:
            with contextlib.suppress(OSError):  # the listing's own, or not open
                os.close(fd)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.flush()


def _not_yet() -> None:
    """The resource tracker's start, left for later (``start``)."""


def start_tracker() -> None:
    """Start multiprocessing's resource tracker, unless it is running."""
    resource_tracker.ensure_running()
