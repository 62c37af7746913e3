"""``pyrula runs``: list, inspect, drive and retry runs from the shell.

Each subcommand is a thin shell over one function here (``submit_run``, ``wait_result``,
``send_signal``...), which the older flat commands (``pyrula submit``, ``get``, ``result``,
``events``, ``signal``, ``cancel``) call too, so the two spellings cannot drift. A user's
mistake is one line on stderr: exit 2 for a usage error, exit 1 when the run asked about
failed, is missing, or has not ended.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict
from typing import Any

import click

from pyrula.cli.common import (
    NAMESPACE,
    STORE,
    InputError,
    Refusal,
    existing_store,
    json_argument,
)
from pyrula.cli.timeline import describe, iso, timeline
from pyrula.timestamps import iso_utc_or_none, readable_event

logger = logging.getLogger(__name__)

JSON = click.option("--json", "as_json", is_flag=True, help="one JSON document on stdout")
PRIORITY = click.option("--priority", type=click.IntRange(0, 9), default=0, show_default=True,
                        help="0..9: among its owner's queued runs, a higher one is claimed "
                        "first")


class RunRefusal(Refusal):
    """The run asked about failed, is missing, or has not ended: one line, exit 1."""


def client(store: str | None, namespace: str | None) -> Any:
    from pyrula.workflows import SyncWorkflowClient

    return SyncWorkflowClient(existing_store(store, namespace))


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


#: A run's timestamps: printed as ISO-8601 UTC (``2026-12-01T16:40:00.123Z``), which a
#: person reads and every JSON consumer parses, rather than as epoch floats.
_TIMES = ("created_at", "updated_at", "started_at", "finished_at", "wake_at")


def info_dict(info: Any) -> dict[str, Any]:
    data = asdict(info)
    data["status"] = info.status.value
    for key in _TIMES:
        if key in data:
            data[key] = iso_utc_or_none(data[key])
    return data


def print_events(events: list[dict[str, Any]]) -> None:
    """A journal as one JSON array, each event's instants (``ts``, ``wake_at``...) in
    ISO-8601 UTC; the store keeps them as epoch seconds."""
    print_json([readable_event(event) for event in events])


def run_status(text: str | None) -> Any:
    """``--status`` as a RunStatus; an unknown one is a usage error naming the valid ones."""
    from pyrula.workflows import RunStatus

    if text is None:
        return None
    try:
        return RunStatus(text)
    except ValueError:
        valid = ", ".join(s.value for s in RunStatus)
        raise InputError(f"--status {text!r} is not a run status; use one of: {valid}") from None


def get_run(runs: Any, run_id: str) -> Any:
    from pyrula.workflows import WorkflowNotFound

    try:
        return runs.get(run_id)
    except WorkflowNotFound:
        raise RunRefusal(f"no run with id {run_id!r}") from None


def store_call(store: Any, coro: Any) -> Any:
    """Run one of ``store``'s coroutines from this synchronous command, the way the sync
    client does: on this thread if the store's calls never suspend, else on its loop."""
    from pyrula.workflows._sync import drive, run_sync
    from pyrula.workflows.stores.admin import SyncAdmin

    kind = type(store)
    return drive(coro) if issubclass(kind, SyncAdmin) and kind.sync_driven else run_sync(coro)


def warn_if_unknown(store: Any, name: str, then: str = "") -> bool:
    """Warn on stderr, in one line ending with ``then``, when no worker of ``store`` has
    ever served ``name`` (a typo, most likely), naming the closest names that were; True
    if it warned."""
    from pyrula.workflows.definition import unknown_name

    mistyped = unknown_name(name, store_call(store, store.served_names()))
    if mistyped is not None:
        click.echo(f"warning: {mistyped}{then}", err=True)
    return mistyped is not None


def _unserved(store: Any, name: str) -> bool:
    """Whether runs of ``name`` are queued that no live worker serves."""
    return name in store_call(store, store.stranded(now=time.time()))


def submit_run(workflow: str, params: str, owner: str | None, idempotency_key: str | None,
               store: str | None, namespace: str | None, priority: int = 0) -> None:
    """Submit and print ``{"name", "run_id"}``; warn on stderr if no live worker serves
    the workflow yet (the run waits for one)."""
    value = json_argument("PARAMS_JSON", params)
    runs = client(store, namespace)
    handle = runs.submit(workflow, value, owner=owner, idempotency_key=idempotency_key,
                         priority=priority)
    print_json({"name": handle.name, "run_id": handle.run_id})
    if not warn_if_unknown(runs.store, handle.name, "; the run waits until a worker serves it") \
            and _unserved(runs.store, handle.name):
        click.echo(f"warning: no live worker serves {handle.name!r} yet; the run waits "
                   "until one does", err=True)


def wait_result(run_id: str, timeout: float | None, store: str | None,
                namespace: str | None) -> None:
    """Print the run's result; one line and exit 1 if it failed, was cancelled, is
    unknown, or has not ended within ``timeout``."""
    from pyrula.workflows import RunCancelled, RunFailed, WorkflowNotFound

    try:
        value = client(store, namespace).result(run_id, timeout=timeout)
    except TimeoutError:
        raise RunRefusal(f"run {run_id} has not ended after {timeout:g} s; "
                         "try a longer --timeout") from None
    except WorkflowNotFound:
        raise RunRefusal(f"no run with id {run_id!r}") from None
    except RunCancelled:
        raise RunRefusal(f"run {run_id} was cancelled") from None
    except RunFailed as exc:
        error = exc.error or {}
        raise RunRefusal(f"run {run_id} failed: {error.get('code')}: "
                         f"{error.get('error_type')}: {error.get('message')}") from None
    print_json(value)


def send_signal(run_id: str, name: str, payload: str, store: str | None,
                namespace: str | None, *, what: str = "PAYLOAD_JSON") -> None:
    """Send the signal and say so; ``what`` names the payload argument in a refusal."""
    value = json_argument(what, payload)
    client(store, namespace).signal(run_id, name, value)
    click.echo(f"signal {name!r} sent to run {run_id}")


def cancel_run(run_id: str, store: str | None, namespace: str | None) -> bool:
    """Cancel the run (missing: exit 1); False if it had already ended."""
    runs = client(store, namespace)
    get_run(runs, run_id)
    cancelled: bool = runs.cancel(run_id)
    return cancelled


def list_lines(name: str | None, status: str | None, owner: str | None, limit: int,
               store: str | None, namespace: str | None) -> None:
    """The bare ``pyrula runs`` listing, one line a run as it has always been printed."""
    wanted = run_status(status)
    for info in client(store, namespace).list_runs(
        name=name, status=wanted, owner=owner, limit=limit
    ):
        click.echo(f"{info.run_id}  {info.name:<24} {info.status.value:<9} "
                   f"attempt={info.attempt} owner={info.owner or '-'}")


@click.group("runs", invoke_without_command=True)
@click.option("--name", default=None, hidden=True)
@click.option("--status", default=None, hidden=True)
@click.option("--owner", default=None, hidden=True)
@click.option("--limit", type=int, default=20, hidden=True)
@STORE
@NAMESPACE
@click.pass_context
def runs(ctx: click.Context, name: str | None, status: str | None, owner: str | None,
         limit: int, store: str | None, namespace: str | None) -> None:
    """List, inspect, drive and retry runs (bare: list runs, newest first)."""
    if ctx.invoked_subcommand is None:
        list_lines(name, status, owner, limit, store, namespace)


@runs.command("list")
@click.option("--workflow", default=None, help="only runs of this workflow name")
@click.option("--status", default=None, help="only runs in this status")
@click.option("--owner", default=None, help="only runs of this owner")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@JSON
@STORE
@NAMESPACE
def list_command(workflow: str | None, status: str | None, owner: str | None, limit: int,
                 as_json: bool, store: str | None, namespace: str | None) -> None:
    """List runs, newest first (paged through the store by keyset)."""
    wanted = run_status(status)  # a mistake in the arguments is said before the store
    rows = list(client(store, namespace).list_runs(
        name=workflow, status=wanted, owner=owner, limit=limit
    ))
    if as_json:
        print_json([info_dict(info) for info in rows])
        return
    for line in runs_table(rows):
        click.echo(line)


def id_width(ids: list[str]) -> int:
    """The width of a table's run id column: the longest id shown (SQLite's are 32
    characters, Valkey's 40), at least the header's."""
    return max([len("RUN ID"), *map(len, ids)])


def runs_table(rows: list[Any]) -> list[str]:
    """``pyrula runs list`` as lines: a header, then one run a line, the columns aligned
    whatever the length of the store's run ids."""
    width = id_width([info.run_id for info in rows])
    lines = [f"{'RUN ID':<{width}}  {'WORKFLOW':<24} {'STATUS':<9} {'ATTEMPT':>7}  "
             f"{'OWNER':<16} CREATED"]
    for info in rows:
        lines.append(f"{info.run_id:<{width}}  {info.name:<24} {info.status.value:<9} "
                     f"{info.attempt:>7}  {info.owner or '-':<16} {iso(info.created_at)}")
    return lines


@runs.command("show")
@click.argument("run_id")
@JSON
@STORE
@NAMESPACE
def show_command(run_id: str, as_json: bool, store: str | None, namespace: str | None) -> None:
    """A run: status, attempt, owner, priority, times, error, result, and its step
    timeline."""
    from pyrula.workflows.triage import retries_of

    runs_client = client(store, namespace)
    info = get_run(runs_client, run_id)
    events = runs_client.events(run_id)
    steps = timeline(events)
    retries = retries_of(info)
    kin = family_of(runs_client, events)
    if as_json:
        print_json({**info_dict(info), "retries": retries, "timeline": steps,
                    "parent_id": info.parent_id, "children": kin})
        return
    click.echo(f"run {info.run_id}  workflow {info.name}")
    rows = [("status", info.status.value), ("attempt", info.attempt),
            ("owner", info.owner or "-"), ("priority", info.priority),
            ("created", iso(info.created_at)),
            ("started", iso(info.started_at) or "-"),
            ("finished", iso(info.finished_at) or "-")]
    if retries:
        rows.append(("retries", retries))
    if info.waiting_for:
        rows.append(("waiting for", ", ".join(info.waiting_for)))
    if info.interrupt is not None:
        rows.append(("asks", json.dumps(info.interrupt, default=str)))
    if info.error:
        rows.append(("error", f"{info.error.get('code')}: {info.error.get('error_type')}: "
                              f"{info.error.get('message')}"))
    if info.status.value == "completed":
        rows.append(("result", json.dumps(info.result, default=str)))
    for label, value in rows:
        click.echo(f"  {label + ':':<12} {value}")
    click.echo("timeline:" if steps else "timeline: (not started)")
    for entry in steps:
        click.echo(f"  {describe(entry)}")
    echo_family(info, kin)
    trace = ((info.error or {}).get("detail") or {}).get("traceback")
    if trace:
        click.echo("traceback:")
        for line in str(trace).rstrip("\n").splitlines():
            click.echo(f"  {line}")


def family_of(runs_client: Any, events: list[Any]) -> list[dict[str, Any]]:
    """The children the run's journal records starting (``children_of``, which the
    dashboard's run page reads too)."""
    from pyrula.workflows.family import children_of

    kin: list[dict[str, Any]] = store_call(runs_client.store,
                                           children_of(runs_client.store, events))
    return kin


def echo_family(info: Any, kin: list[dict[str, Any]]) -> None:
    """The run in its tree: its parent above it, its children below."""
    if info.parent_id is None and not kin:
        return
    click.echo("family:")
    indent = "  "
    if info.parent_id is not None:
        click.echo(f"  parent {info.parent_id}")
        indent = "    "
    click.echo(f"{indent}└─ {info.run_id} {info.name} ({info.status.value})  <- this run")
    from pyrula.workflows.family import SHOWN_CHILDREN

    lines = [f"{child['run_id']} {child['name']} ({child['status'] or '?'})"
             for child in kin[:SHOWN_CHILDREN]]
    if len(kin) > SHOWN_CHILDREN:
        lines.append(f"... and {len(kin) - SHOWN_CHILDREN} more children")
    for number, line in enumerate(lines, 1):
        click.echo(f"{indent}   {'└─' if number == len(lines) else '├─'} {line}")


@runs.command("events")
@click.argument("run_id")
@JSON
@STORE
@NAMESPACE
def events_command(run_id: str, as_json: bool, store: str | None,
                   namespace: str | None) -> None:
    """A run's journal (always JSON: one array of events)."""
    runs_client = client(store, namespace)
    get_run(runs_client, run_id)
    print_events(runs_client.events(run_id))


@runs.command("result")
@click.argument("run_id")
@click.option("--timeout", type=float, default=None, help="seconds to wait for the end")
@JSON
@STORE
@NAMESPACE
def result_command(run_id: str, timeout: float | None, as_json: bool, store: str | None,
                   namespace: str | None) -> None:
    """Wait for a run to end and print its result (JSON)."""
    wait_result(run_id, timeout, store, namespace)


@runs.command("signal")
@click.argument("run_id")
@click.argument("name")
@click.argument("payload", default="null", metavar="[PAYLOAD_JSON]")
@STORE
@NAMESPACE
def signal_command(run_id: str, name: str, payload: str, store: str | None,
                   namespace: str | None) -> None:
    """Send signal NAME with PAYLOAD_JSON to a run."""
    send_signal(run_id, name, payload, store, namespace)


def query_run(run_id: str, name: str, args: str, apps: tuple[str, ...], store: str | None,
              namespace: str | None) -> None:
    """Print what query ``name`` answers (JSON); ``args`` is a JSON list of its arguments
    (or one JSON value, its only argument). One line and exit 1 if it cannot answer."""
    from pyrula.apps import AppError, import_module, importable_from
    from pyrula.workflows import QueryFailed, WorkflowNotFound

    value = json_argument("ARGS_JSON", args)
    positional = value if isinstance(value, list) else [value]
    importable_from(os.getcwd())
    for app in apps:
        try:
            import_module("--app", app, app)
        except AppError as exc:
            raise InputError(str(exc)) from None
    try:
        answer = client(store, namespace).query(run_id, name, *positional)
    except WorkflowNotFound:
        raise RunRefusal(f"no run with id {run_id!r}") from None
    except QueryFailed as exc:
        hint = "; name its module with --app" if exc.error_type == "WorkflowNotFound" else ""
        raise RunRefusal(f"{exc}{hint}") from None
    print_json(answer)


def update_run(run_id: str, name: str, payload: str, timeout: float | None,
               store: str | None, namespace: str | None) -> None:
    """Send the update and print its reply (JSON); one line and exit 1 if it failed."""
    from pyrula.workflows import RunNotActive, UpdateFailed, WorkflowNotFound

    value = json_argument("PAYLOAD_JSON", payload)
    try:
        reply = client(store, namespace).update(run_id, name, value, timeout=timeout)
    except WorkflowNotFound:
        raise RunRefusal(f"no run with id {run_id!r}") from None
    except (UpdateFailed, RunNotActive, TimeoutError) as exc:
        raise RunRefusal(str(exc)) from None
    print_json(reply)


@runs.command("query")
@click.argument("run_id")
@click.argument("name")
@click.argument("args", default="[]", metavar="[ARGS_JSON]")
@click.option("--app", "apps", multiple=True, metavar="MODULE", envvar="PYRULA_APP",
              help="import this module so the run's @workflow registers (repeatable)")
@STORE
@NAMESPACE
def query_command(run_id: str, name: str, args: str, apps: tuple[str, ...],
                  store: str | None, namespace: str | None) -> None:
    """Print what the run's query handler NAME answers for ARGS_JSON (a JSON list).

    Answered by replaying the run's journal here with the workflow's code: import it
    with --app MODULE. Writes nothing."""
    query_run(run_id, name, args, apps, store, namespace)


@runs.command("update")
@click.argument("run_id")
@click.argument("name")
@click.argument("payload", metavar="PAYLOAD_JSON")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="seconds to wait for the run to apply it")
@STORE
@NAMESPACE
def update_command(run_id: str, name: str, payload: str, timeout: float, store: str | None,
                   namespace: str | None) -> None:
    """Send update NAME with PAYLOAD_JSON to a run and print the handler's reply."""
    update_run(run_id, name, payload, timeout, store, namespace)


@runs.command("resume")
@click.argument("run_id")
@click.argument("value", default="null", metavar="[VALUE_JSON]")
@STORE
@NAMESPACE
def resume_command(run_id: str, value: str, store: str | None, namespace: str | None) -> None:
    """Answer a run's interrupt with VALUE_JSON."""
    answer = json_argument("VALUE_JSON", value)
    client(store, namespace).resume(run_id, answer)
    click.echo(f"run {run_id} resumed")


@runs.command("submit")
@click.argument("workflow", metavar="NAME")
@click.argument("params", default="{}", metavar="[PARAMS_JSON]")
@click.option("--owner", default=None)
@click.option("--idempotency-key", default=None)
@PRIORITY
@STORE
@NAMESPACE
def submit_command(workflow: str, params: str, owner: str | None, idempotency_key: str | None,
                   priority: int, store: str | None, namespace: str | None) -> None:
    """Submit a run of NAME with PARAMS_JSON; print its id."""
    submit_run(workflow, params, owner, idempotency_key, store, namespace, priority)


@runs.command("stuck")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="at most this many runs of each kind")
@JSON
@STORE
@NAMESPACE
def stuck_command(limit: int, as_json: bool, store: str | None, namespace: str | None) -> None:
    """Runs that will not finish by themselves: queued for a workflow no live worker
    serves, failed as stranded, or quarantined."""
    from pyrula.workflows.triage import stuck_runs

    runs_client = client(store, namespace)
    found = store_call(runs_client.store, stuck_runs(runs_client.store, limit, time.time()))
    if as_json:
        print_json([{**row, "updated_at": iso_utc_or_none(row["updated_at"])} for row in found])
        return
    if not found:
        click.echo("no stuck runs")
        return
    width = id_width([row["run_id"] for row in found])
    for row in found:
        click.echo(f"{row['run_id']:<{width}}  {row['workflow']:<24} {row['status']:<9} "
                   f"{iso(row['updated_at'])}  {row['why']}")
