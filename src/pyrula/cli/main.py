"""``pyrula``: run a worker, a dev worker, and inspect or drive runs from the shell."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import click

from pyrula import logs
from pyrula.apps import AppError
from pyrula.cli import runs
from pyrula.cli.cloud import cloud
from pyrula.cli.common import (
    CLUSTER,
    NAMESPACE,
    STORE,
    existing_store,
    json_argument,
    load_workflows,
    open_store,
    option_flags,
    run_group,
    serve,
    worker_options,
)
from pyrula.cli.projections import projections
from pyrula.cli.repair import cancel_command, fork_command, retry_command
from pyrula.cli.runs import runs as runs_group
from pyrula.cli.schedules import schedules
from pyrula.config.fleet import resolve_store_url
from pyrula.config.store_url import shown_url

LOG_FORMAT = click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text",
    envvar="PYRULA_LOG_FORMAT", show_default=True,
)
LOG_LEVEL = click.option("--log-level", default="INFO", envvar="PYRULA_LOG_LEVEL",
                         show_default=True)


@click.group()
@click.version_option(package_name="pyrula")
def cli() -> None:
    """pyrula: durable workflows for Python."""


def _worker_command(dev: bool) -> Any:
    @click.option("--workflow", "workflows", multiple=True, metavar="MODULE:FN",
                  help="serve only this @workflow (repeatable); its module is imported")
    @click.option("--app", "apps", multiple=True, metavar="MODULE", envvar="PYRULA_APP",
                  help="import this module so its @workflow functions register (repeatable)")
    @STORE
    @NAMESPACE
    @CLUSTER
    @LOG_FORMAT
    @LOG_LEVEL
    @click.option("--cloud/--no-cloud", default=True, help="report to Cloud if configured")
    @option_flags
    def command(workflows: tuple[str, ...], apps: tuple[str, ...], store: str | None,
                namespace: str | None, cluster: bool | None, log_format: str,
                log_level: str, cloud: bool, **options: Any) -> None:
        logs.configure(log_format, log_level)
        from pyrula.workflows import WorkflowWorker
        from pyrula.workflows.stores.archive import ArchivingStore

        if not workflows and not apps:
            raise click.UsageError("name what to serve: --workflow MODULE:FN or --app MODULE")
        # Before the import: a fix saved while the import fails, or right after, must count
        # as the change to wait for.
        before = _tree_files(os.getcwd()) if dev else {}
        try:
            chosen = load_workflows(apps, workflows)
        except AppError as exc:
            if not dev or not exc.frames:  # not the code: the flags name the wrong thing
                raise
            # A code change broke the import: say so, and restart on the next change
            # instead of leaving the developer without a worker.
            click.echo(f"{exc.render()}\nwaiting for a change to the code...", err=True)
            _wait_for_any_change(before)
            _restart()
        overrides: dict[str, Any] = {}
        if dev:
            overrides = {"shutdown_grace": 3.0, "cancel_timeout": 2.0,
                         "poison_counts_loop_blocked": False}
        opts = worker_options(options, **overrides)
        worker = WorkflowWorker(store=open_store(store, namespace, cluster=cluster),
                                workflows=chosen, options=opts, cloud=cloud)
        archived = (f" (archived to {worker.store.archive.where()})"
                    if isinstance(worker.store, ArchivingStore) else "")
        where = shown_url(resolve_store_url(store))
        worker.store_shown = where
        logs.announce(f"pyrula worker {worker.worker_id} on {where}{archived} serving "
                      f"{', '.join(worker.workflow_names)}", "worker_banner",
                      worker_id=worker.worker_id, store=where)
        on_start = (lambda: _watch_for_changes(worker)) if dev else None
        code = serve(worker, on_start)
        if dev and getattr(worker, "reload_requested", False):
            logs.announce("code changed: restarting", "code_changed")
            _restart()
        sys.exit(code)

    return command


cli.command("worker", help="Run a WorkflowWorker: SIGTERM drains, a second signal quits.")(
    _worker_command(dev=False)
)
cli.command(
    "dev",
    help="A worker for development: fast drain (--shutdown-grace 3 --cancel-timeout 2), "
    "loop-blocked stand-downs not counted, restart on code change.",
)(_worker_command(dev=True))


cli.add_command(schedules)
cli.add_command(cloud)
cli.add_command(projections)


def _restart() -> None:
    os.execv(sys.executable, [sys.executable, "-m", "pyrula.cli", *sys.argv[1:]])


def _tree_files(root: str, limit: int = 5000) -> dict[str, float]:
    """Modification times of the .py files under ``root`` (virtualenvs and caches skipped)."""
    found: dict[str, float] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in (
            "__pycache__", "node_modules", "venv", "site-packages")]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                try:
                    found[path] = os.stat(path).st_mtime
                except OSError:
                    continue
                if len(found) >= limit:
                    return found
    return found


def _wait_for_any_change(before: dict[str, float], interval: float = 0.5) -> None:
    """Return once the .py files under the current directory differ from ``before``."""
    while _tree_files(os.getcwd()) == before:
        time.sleep(interval)


def _source_files() -> dict[str, float]:
    cwd = os.getcwd()
    found: dict[str, float] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and path.endswith(".py") and os.path.abspath(path).startswith(cwd):
            try:
                found[path] = os.stat(path).st_mtime
            except OSError:
                continue
    return found


def _watch_for_changes(worker: Any, interval: float = 0.5) -> None:
    """Stop the worker when a source file of the app changes (dev reload)."""
    before = _source_files()

    def watch() -> None:
        while worker.state != "stopped":
            time.sleep(interval)
            now = _source_files()
            if any(now.get(path) != mtime for path, mtime in before.items()):
                worker.reload_requested = True
                worker.stop()
                return

    threading.Thread(target=watch, name="pyrula-dev-reload", daemon=True).start()


# --- driving runs from the shell: the flat spellings of ``pyrula runs`` subcommands ---

for command in (retry_command, cancel_command, fork_command):
    runs_group.add_command(command)
cli.add_command(runs_group)


@cli.command("submit")
@click.argument("workflow")
@click.argument("params", default="{}", metavar="[PARAMS_JSON]")
@click.option("--owner", default=None)
@click.option("--idempotency-key", default=None)
@runs.PRIORITY
@STORE
@NAMESPACE
def submit(workflow: str, params: str, owner: str | None, idempotency_key: str | None,
           priority: int, store: str | None, namespace: str | None) -> None:
    """Submit a run of WORKFLOW with PARAMS_JSON (same as "pyrula runs submit")."""
    runs.submit_run(workflow, params, owner, idempotency_key, store, namespace, priority)


@cli.command("emit")
@click.argument("topic")
@click.argument("payload", metavar="JSON")
@click.option("--key", default=None, help="the event's key: a second emit with it on this "
              "topic is the same event")
@click.option("--owner", default=None, help="the tenant whose batch run takes the event")
@STORE
@NAMESPACE
def emit(topic: str, payload: str, key: str | None, owner: str | None, store: str | None,
         namespace: str | None) -> None:
    """Emit an event on TOPIC with the JSON payload; print its id. Workflows declared with
    trigger=BatchTrigger(TOPIC, ...) get it in a batch run (docs/triggers.md)."""
    from pyrula.workflows.triggers import check_topic

    check_topic(topic)  # a usage mistake, said before the store is opened
    value = json_argument("the payload", payload)
    click.echo(runs.client(store, namespace).emit(topic, value, key=key, owner=owner))


@cli.command("get")
@click.argument("run_id")
@STORE
@NAMESPACE
def get(run_id: str, store: str | None, namespace: str | None) -> None:
    """Show a run as JSON ("pyrula runs show --json" adds its timeline)."""
    runs.print_json(runs.info_dict(runs.get_run(runs.client(store, namespace), run_id)))


@cli.command("result")
@click.argument("run_id")
@click.option("--timeout", type=float, default=None)
@STORE
@NAMESPACE
def result(run_id: str, timeout: float | None, store: str | None,
           namespace: str | None) -> None:
    """Wait for a run to end and print its result (same as "pyrula runs result")."""
    runs.wait_result(run_id, timeout, store, namespace)


@cli.command("events")
@click.argument("run_id")
@STORE
@NAMESPACE
def events(run_id: str, store: str | None, namespace: str | None) -> None:
    """Print a run's journal (same as "pyrula runs events")."""
    runs.print_events(runs.client(store, namespace).events(run_id))


@cli.command("signal")
@click.argument("run_id")
@click.argument("name")
@click.argument("payload", default="null", metavar="[PAYLOAD_JSON]")
@STORE
@NAMESPACE
def send_signal(run_id: str, name: str, payload: str, store: str | None,
                namespace: str | None) -> None:
    """Send signal NAME with PAYLOAD_JSON to a run (same as "pyrula runs signal")."""
    runs.send_signal(run_id, name, payload, store, namespace, what="PAYLOAD_JSON")


@cli.command("cancel")
@click.argument("run_id")
@STORE
@NAMESPACE
def cancel(run_id: str, store: str | None, namespace: str | None) -> None:
    """Cancel a run; print {"cancelled": bool} ("pyrula runs cancel" says it in words)."""
    runs.print_json({"cancelled": runs.cancel_run(run_id, store, namespace)})


# --- the Postgres archive ------------------------------------------------------------

POSTGRES_DSN = click.option(
    "--postgres-dsn", "postgres_dsn", default=None, envvar="PYRULA_POSTGRES_DSN", metavar="DSN",
    help="the archive's Postgres (default $PYRULA_POSTGRES_DSN)",
)
ARCHIVE_SCHEMA = click.option("--schema", default="pyrula", show_default=True,
                              help="the Postgres schema that holds the archive")


def _archive(postgres_dsn: str | None, schema: str) -> Any:
    from pyrula.workflows.stores.archive import PostgresArchive

    if not postgres_dsn:
        raise click.UsageError("name the archive: --postgres-dsn DSN or PYRULA_POSTGRES_DSN")
    return PostgresArchive(dsn=postgres_dsn, schema=schema)


def _on_archive(archive: Any, call: Any) -> Any:
    """Run ``call(archive)`` on a fresh loop and close the pool it opened."""
    import asyncio

    async def run() -> Any:
        try:
            return await call(archive)
        finally:
            await archive.aclose()

    return asyncio.run(run())


@cli.group("db")
def db() -> None:
    """The Postgres archive's schema: migrate it, check it."""


@db.command("migrate")
@POSTGRES_DSN
@ARCHIVE_SCHEMA
def db_migrate(postgres_dsn: str | None, schema: str) -> None:
    """Create the archive schema, or bring it to this build's version (idempotent)."""
    archive = _archive(postgres_dsn, schema)
    result = _on_archive(archive, lambda a: a.migrate())
    click.echo(f"archive {archive.where()}: {result}")


@db.command("check")
@STORE
@NAMESPACE
@POSTGRES_DSN
@ARCHIVE_SCHEMA
def db_check(store: str | None, namespace: str | None, postgres_dsn: str | None,
             schema: str) -> None:
    """Check that the live store answers and that this build can use the archive schema
    (exit 1 with the reason if not)."""
    from pyrula.errors import ArchiveSchemaMismatch, StoreUnavailable

    archive = _archive(postgres_dsn, schema)
    live = existing_store(store, namespace, archive=False)
    failed = False
    try:
        live.ping()
        click.echo(f"store ok: {live!r}")
    except StoreUnavailable as exc:
        click.echo(f"error: store unreachable: {exc}", err=True)
        failed = True
    finally:
        live.close()
    try:
        status = _on_archive(archive, lambda a: a.check())
        click.echo(f"archive ok: {archive.where()} {status}")
    except ArchiveSchemaMismatch as exc:
        click.echo(f"error: archive schema mismatch: {exc}", err=True)
        failed = True
    except StoreUnavailable as exc:
        click.echo(f"error: archive unreachable: {exc}", err=True)
        failed = True
    if failed:
        sys.exit(1)


def main() -> None:
    run_group(cli)
