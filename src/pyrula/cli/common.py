"""What the ``pyrula`` commands share: loading the app, the store, option flags, serving."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import click

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

STORE = click.option("--store", "store", default=None, metavar="URL",
                     help="store URL (default $PYRULA_STORE_URL, else sqlite:///pyrula.db)")
NAMESPACE = click.option("--namespace", default=None, envvar="PYRULA_VALKEY_NAMESPACE",
                         help="Valkey key namespace")
#: None (neither flag): the Valkey store detects a cluster itself.
CLUSTER = click.option("--cluster/--no-cluster", default=None,
                       help="force the Valkey cluster client, or the plain one "
                       "(default: detect)")


def import_target(target: str) -> Any:
    """Import ``module`` or ``module:attribute`` (the current directory is importable)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the app's own code failed at import: say what and where
        raise click.ClickException(
            f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    if not attr:
        return module
    try:
        return getattr(module, attr)
    except AttributeError:
        raise click.ClickException(f"module {module_name!r} has no attribute {attr!r}") from None


def load_workflows(apps: tuple[str, ...], workflows: tuple[str, ...]) -> list[Any] | None:
    """Import the app modules; return the ``--workflow`` functions (None: serve all)."""
    for app in apps:
        import_target(app)
    if not workflows:
        return None
    return [import_target(target) for target in workflows]


def open_store(url: str | None, namespace: str | None = None, *, archive: bool = True,
               cluster: bool | None = None) -> Any:
    """The store a URL names; with PYRULA_POSTGRES_DSN set (and ``archive``), wrapped in
    an ArchivingStore so finished runs go to, and are read back from, Postgres.
    ``cluster`` (None: detect) is the Valkey store's ``cluster``."""
    from pyrula.workflows.stores import store_from_url
    from pyrula.workflows.stores.archive import archived_if_configured

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


class InputError(click.ClickException):
    """A user's mistake on the command line: one line on stderr, exit 2, no traceback."""

    exit_code = CONFIGURATION_ERROR_EXIT


def run_group(group: click.Group) -> None:
    """Run ``group`` as click's standalone mode would, except that a usage error is one
    line (the mistake and where the help is) instead of click's usage block, and Ctrl-C
    is exit 130 without a traceback. Returns only by ``sys.exit``."""
    try:
        code = group.main(standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # the help is what was asked for
        exc.show()
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        click.echo(f"Error: {exc.format_message()}{where}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (click.Abort, KeyboardInterrupt, EOFError):
        click.echo("Aborted!", err=True)
        sys.exit(FORCED_EXIT[signal.SIGINT])
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
        raise click.ClickException(str(exc)) from None


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
        click.echo(f"configuration error: {exc}", err=True)
        return CONFIGURATION_ERROR_EXIT
