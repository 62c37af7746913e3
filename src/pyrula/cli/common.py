"""What the ``pyrula`` commands share: loading the app, the store, option flags, serving."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

import click

from pyrula.apps import AppError, importable_from
from pyrula.apps import load as load_app
from pyrula.config.fleet import resolve_store_url
from pyrula.config.parse import parse_namespace, redact_url
from pyrula.config.worker import WorkerOptions
from pyrula.errors import ConfigurationError
from pyrula.logs import CLI_LOGGER

logger = logging.getLogger(CLI_LOGGER)


#: The exit codes of a second signal while draining (128 + signal number).
FORCED_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
#: The exit code of a ConfigurationError, whether the options or the store refused.
CONFIGURATION_ERROR_EXIT = 2
#: The exit code when what was asked about is missing or failed (an unknown run, no store).
NOT_FOUND_EXIT = 1

STORE = click.option("--store", "store", default=None, metavar="URL",
                     help="store URL (default $PYRULA_STORE_URL, else sqlite:///pyrula.db)")
NAMESPACE = click.option("--namespace", default=None, envvar="PYRULA_VALKEY_NAMESPACE",
                         help="Valkey key namespace")
#: None (neither flag): the Valkey store detects a cluster itself.
CLUSTER = click.option("--cluster/--no-cluster", default=None,
                       help="force the Valkey cluster client, or the plain one "
                       "(default: detect)")


def load_workflows(apps: tuple[str, ...], workflows: tuple[str, ...]) -> list[Any] | None:
    """Import the app modules (the current directory is importable); return the
    ``--workflow`` functions (None: serve all). Raises ``pyrula.apps.AppError``."""
    importable_from(os.getcwd())
    return load_app(apps, workflows)


def open_store(url: str | None, namespace: str | None = None, *, archive: bool = True,
               cluster: bool | None = None) -> Any:
    """The store a URL names; with PYRULA_POSTGRES_DSN set (and ``archive``), wrapped in
    an ArchivingStore so finished runs go to, and are read back from, Postgres.
    ``cluster`` (None: detect) is the Valkey store's ``cluster``."""
    from pyrula.workflows.stores import store_from_url
    from pyrula.workflows.stores.archive import archived_if_configured

    checked_store_url(url)

    options: dict[str, Any] = {}
    if namespace is not None:
        # click reads the flag or the variable: name both.
        options["namespace"] = parse_namespace(
            "--namespace (or PYRULA_VALKEY_NAMESPACE)", namespace
        )
    if cluster is not None:
        options["cluster"] = cluster
    try:
        store = store_from_url(resolve_store_url(url), **options)
    except TypeError:
        flags = " and ".join(
            flag for flag, given in (("--namespace", namespace is not None),
                                     ("--cluster/--no-cluster", cluster is not None)) if given
        )
        raise InputError(
            f"{flags} applies to Valkey stores only, not {redact_url(resolve_store_url(url))!r}"
        ) from None
    return archived_if_configured(store) if archive else store


def checked_store_url(url: str | None, flag: str = "--store",
                      variable: str = "PYRULA_STORE_URL") -> str:
    """The store URL a command uses (``url``, else ``$PYRULA_STORE_URL``, else the
    default), refused as a usage mistake naming where it came from (the flag or the
    variable the user must fix) when no store could be opened from it."""
    from pyrula.config.store_url import check_url

    resolved = resolve_store_url(url)
    try:
        check_url(resolved)
    except ConfigurationError as exc:
        given = flag if url is not None else variable if os.environ.get(variable) else None
        raise InputError(f"{given}: {exc}" if given else str(exc)) from None
    return resolved


def existing_store(url: str | None, namespace: str | None = None, *,
                   archive: bool = True) -> Any:
    """The store for a command that reads, or acts on, what a worker or a fleet keeps in
    it (every command but ``worker`` and ``dev``). Opening a SQLite file that is not there
    would create an empty store and answer from it (no runs, no such run), or leave a
    submitted run in a file no worker reads: so a missing file is refused (exit 1), and
    ``memory://``, always empty in a new process, is refused as a mistake (exit 2)."""
    from pyrula.config.store_url import sqlite_file

    resolved = resolve_store_url(url)
    named = f"--store {resolved}" if url is not None else f"PYRULA_STORE_URL={resolved}"
    if not resolved.lower().startswith("memory:"):
        checked_store_url(url)
    if resolved.lower().startswith("memory:"):
        raise InputError(f"{named}: a memory store is private to one process, empty in this "
                         "one, and no worker could reach it; name a SQLite file or a Valkey "
                         "server")
    path = sqlite_file(resolved)
    if path is not None and namespace is not None:  # the mistake first, then the file
        raise InputError(f"--namespace applies to Valkey stores only, not {resolved!r}")
    if path is not None and not os.path.exists(path):
        raise Refusal(f"no store at {os.path.abspath(path)}: run where your fleet runs, "
                      "or set PYRULA_STORE_URL")
    return open_store(url, namespace, archive=archive)


class InputError(click.ClickException):
    """A user's mistake on the command line: one line on stderr, exit 2, no traceback."""

    exit_code = CONFIGURATION_ERROR_EXIT


class Refusal(click.ClickException):
    """What was asked about is missing or failed: one line on stderr, exit 1."""

    exit_code = NOT_FOUND_EXIT


def fail(message: str, code: int) -> NoReturn:
    """Print ``error: message`` as the one line on stderr and exit with ``code``."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def run_group(group: click.Group) -> NoReturn:
    """Run ``group`` under the one error contract of ``pyrula`` and ``pyrula-fleet``:

    - a usage or configuration mistake (click's own, an ``InputError``, a
      ``ConfigurationError``, a value the client refuses) is one line ``error: ...`` on
      stderr and exit 2;
    - a thing asked about that is missing or failed is one line ``error: ...``, exit 1;
    - the app's code raising at import is ``error: ...`` then the app's own frames, exit 2;
    - Ctrl-C is exit 130; never a traceback of pyrula's own.
    Returns only by ``sys.exit``."""
    from pyrula.errors import PayloadTooLarge, PyrulaError

    try:
        code = group.main(standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # the help is what was asked for
        exc.show()
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        fail(f"{exc.format_message()}{where}", CONFIGURATION_ERROR_EXIT)
    except click.ClickException as exc:
        fail(exc.format_message(), exc.exit_code)
    except AppError as exc:
        click.echo(exc.render(), err=True)
        sys.exit(CONFIGURATION_ERROR_EXIT)
    except (click.Abort, KeyboardInterrupt, EOFError):
        click.echo("Aborted!", err=True)
        sys.exit(FORCED_EXIT[signal.SIGINT])
    except (ConfigurationError, PayloadTooLarge) as exc:
        fail(str(exc), CONFIGURATION_ERROR_EXIT)
    except PyrulaError as exc:  # the store is unreachable, a run is missing or has ended
        fail(str(exc), NOT_FOUND_EXIT)
    except ValueError as exc:
        # What the client refuses in its arguments (a signal name, params that are not
        # JSON): the user's mistake.
        fail(str(exc), CONFIGURATION_ERROR_EXIT)
    sys.exit(code if isinstance(code, int) else 0)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (JSON has no NaN or Infinity)")


def json_argument(what: str, text: str) -> Any:
    """``text`` parsed as JSON, strictly: ``NaN``/``Infinity``, which Python's parser
    would take, are refused like any other text that is not JSON."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise InputError(f"{what} is not JSON: {exc}") from None


def option_flags(func: Callable[..., Any]) -> Callable[..., Any]:
    """One ``--flag`` per WorkerOptions field (and its PYRULA_* variable stays in force)."""
    for field in reversed(dataclasses.fields(WorkerOptions)):
        flag = "--" + field.name.replace("_", "-")
        if field.type in ("bool", bool):
            func = click.option(
                f"{flag}/--no-{field.name.replace('_', '-')}", field.name, default=None,
                help=f"WorkerOptions.{field.name} (default {field.default})",
            )(func)
        else:
            func = click.option(
                flag, field.name, default=None, metavar="VALUE",
                help=f"WorkerOptions.{field.name} (default {field.default})",
            )(func)
    return func


def worker_options(values: dict[str, Any], **overrides: Any) -> WorkerOptions:
    given = {k: v for k, v in values.items() if v is not None}
    for key, value in overrides.items():
        given.setdefault(key, value)
    try:
        return WorkerOptions(**given)
    except ConfigurationError as exc:
        raise InputError(flag_named(str(exc))) from None


def flag_named(message: str) -> str:
    """A WorkerOptions refusal as the command line says it: ``health_port must be...``
    becomes ``--health-port must be...`` (one given by its variable names the variable)."""
    for field in dataclasses.fields(WorkerOptions):
        if message.startswith(field.name + " "):
            return "--" + field.name.replace("_", "-") + message[len(field.name):]
    return message


class _ShutdownSignals:
    """TERM/INT for a serving worker: the first drains it, a second quits at once.

    A loop blocked by a run (an async step calling ``time.sleep``) runs none of its
    callbacks until the block ends, and Python runs a ``signal.signal`` handler only in the
    main thread, between two bytecodes: if the kernel hands the signal to another thread
    (the lock renewal's, a step's), a main thread asleep in a blocking call is not even
    interrupted, and the handler waits for the call to end. So the handler does nothing
    itself: the C-level handler Python installs with it writes the signal's number to the
    wakeup fd (``signal.set_wakeup_fd``) at once, whichever thread took the signal, and a
    thread of ours reads it and acts. It logs the first signal and asks the loop to drain
    the worker; on a second it logs and exits, so neither waits for the blocked loop.
    """

    _DONE = 0  # not a signal number: tells the thread to end

    def __init__(self, loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> None:
        self._loop = loop
        self._stop = stop
        self._previous: dict[int, Any] = {}
        self._previous_wakeup = -1
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._thread = threading.Thread(target=self._act, name="pyrula-signals", daemon=True)

    def install(self) -> None:
        for signum in FORCED_EXIT:
            self._previous[signum] = signal.signal(signum, self._record)
        self._previous_wakeup = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._thread.start()

    def restore(self) -> None:
        signal.set_wakeup_fd(self._previous_wakeup)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        os.write(self._write, bytes([self._DONE]))
        self._thread.join(1.0)
        if not self._thread.is_alive():
            os.close(self._read)
        os.close(self._write)

    def _record(self, signum: int, frame: object) -> None:
        """Python's handler: the wakeup fd has told our thread already."""

    def _next(self) -> int:
        """The next TERM/INT (or ``_DONE``) written to the wakeup fd; other signals that
        have Python handlers write there too and are passed over."""
        while True:
            data = os.read(self._read, 1)
            if not data:
                return self._DONE
            if data[0] == self._DONE or data[0] in FORCED_EXIT:
                return data[0]

    def _act(self) -> None:
        first = self._next()
        if first == self._DONE:
            return
        logger.info("received %s: draining (send it again to quit at once)",
                    signal.Signals(first).name, extra={"event": "shutdown_requested"})
        try:
            self._loop.call_soon_threadsafe(self._stop)
        except RuntimeError:  # the loop has closed: the worker stopped meanwhile
            return
        second = self._next()
        if second == self._DONE:
            return
        logger.warning("received %s while draining: quitting now", signal.Signals(second).name,
                       extra={"event": "forced_exit"})
        logging.shutdown()
        os._exit(FORCED_EXIT[signal.Signals(second)])


def serve(worker: Any, on_start: Callable[[], None] | None = None) -> int:
    """Run the worker until SIGTERM/SIGINT drains it (exit 0); a second one exits at once
    with 143/130, even while a run blocks the event loop. Returns the exit code."""

    async def main() -> int:
        signals = _ShutdownSignals(asyncio.get_running_loop(), worker.stop)
        signals.install()
        if on_start is not None:
            on_start()
        try:
            await worker.run()
        finally:
            signals.restore()
        return 0

    try:
        return asyncio.run(main())
    except ConfigurationError as exc:
        click.echo(f"error: {exc}", err=True)
        return CONFIGURATION_ERROR_EXIT
