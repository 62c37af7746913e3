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
from collections.abc import Callable
from typing import Any

import click

from pyrula.config.parse import parse_namespace, redact_url
from pyrula.config.worker import WorkerOptions
from pyrula.errors import ConfigurationError

logger = logging.getLogger("pyrula.cli")

DEFAULT_STORE_URL = "sqlite:///pyrula.db"

#: The exit codes of a second signal while draining (128 + signal number).
FORCED_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
#: The exit code of a ConfigurationError, whether the options or the store refused.
CONFIGURATION_ERROR_EXIT = 2


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


def store_url(url: str | None) -> str:
    return url or os.environ.get("PYRULA_STORE_URL", "").strip() or DEFAULT_STORE_URL


def open_store(url: str | None, namespace: str | None = None, *, archive: bool = True) -> Any:
    """The store a URL names; with PYRULA_POSTGRES_DSN set (and ``archive``), wrapped in
    an ArchivingStore so finished runs go to, and are read back from, Postgres."""
    from pyrula.workflows.stores import store_from_url
    from pyrula.workflows.stores.archive import archived_if_configured

    options: dict[str, Any] = {}
    if namespace is not None:
        # click reads the flag or the variable: name both.
        options["namespace"] = parse_namespace(
            "--namespace (or PYRULA_VALKEY_NAMESPACE)", namespace
        )
    try:
        store = store_from_url(store_url(url), **options)
    except TypeError:
        raise InputError(
            f"--namespace applies to Valkey stores only, not {redact_url(store_url(url))!r}"
        ) from None
    return archived_if_configured(store) if archive else store


class InputError(click.ClickException):
    """A user's mistake on the command line: one line on stderr, exit 2, no traceback."""

    exit_code = CONFIGURATION_ERROR_EXIT


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


def serve(worker: Any, on_start: Callable[[], None] | None = None) -> int:
    """Run the worker until SIGTERM/SIGINT drains it (exit 0); a second one exits at once
    with 143/130. Returns the exit code."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        received: asyncio.Queue[int] = asyncio.Queue()
        for signum in FORCED_EXIT:
            # The handler only records; the watcher below acts.
            loop.add_signal_handler(signum, received.put_nowait, signum)

        async def watch() -> None:
            first = await received.get()
            logger.info("received %s: draining (send it again to quit at once)",
                        signal.Signals(first).name, extra={"event": "shutdown_requested"})
            worker.stop()
            second = await received.get()
            logger.warning("received %s while draining: quitting now",
                           signal.Signals(second).name, extra={"event": "forced_exit"})
            logging.shutdown()
            os._exit(FORCED_EXIT[signal.Signals(second)])

        watcher = asyncio.create_task(watch())
        if on_start is not None:
            on_start()
        try:
            await worker.run()
        finally:
            watcher.cancel()
        return 0

    try:
        return asyncio.run(main())
    except ConfigurationError as exc:
        click.echo(f"configuration error: {exc}", err=True)
        return CONFIGURATION_ERROR_EXIT
