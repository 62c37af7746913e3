"""``pyrula runs retry|cancel|fork``: repair one run, or every run a filter selects.

With a RUN_ID each command acts on that run. Without one, ``--workflow W --status S``
(both required) select runs, newest first, narrowed by ``--since T`` (created at or after
an ISO-8601 instant, or within a duration back from now: ``90s``, ``30m``, ``2h``, ``7d``)
and ``--error-type E`` (a failed run's error type); ``--dry-run`` lists them and does
nothing. A bulk command says what it did to each run, one line a run, then a summary,
and exits 1 if any run was refused. The commands live apart from ``pyrula.cli.runs``
(whose group they join, in ``pyrula.cli.main``) to keep that module to one screenful per
concern.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from pyrula.cli.common import NAMESPACE, STORE, InputError, json_argument
from pyrula.cli.runs import (
    JSON,
    RunRefusal,
    cancel_run,
    client,
    get_run,
    print_json,
    run_status,
    store_call,
)
from pyrula.cli.timeline import iso

#: ``--since`` durations: the unit letter and its seconds.
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Selection:
    """The runs a bulk command acts on."""

    workflow: str
    status: Any  # RunStatus: imported with the engine, only when a command runs
    since: float | None
    error_type: str | None

    def matches(self, info: Any) -> bool:
        error = info.error or {}
        return self.error_type is None or error.get("error_type") == self.error_type


def since_of(text: str, now: float) -> float:
    """``--since``: an ISO-8601 instant, or a duration back from ``now`` (``30m``)."""
    from pyrula.timestamps import epoch_of

    unit = _UNITS.get(text[-1:])
    if unit is not None and text[:-1].isdigit():
        return now - int(text[:-1]) * unit
    try:
        return epoch_of(text)
    except ValueError:
        raise InputError(f"--since {text!r} is neither an ISO-8601 instant nor a duration "
                         "like 90s, 30m, 2h, 7d") from None


def selection(run_id: str | None, workflow: str | None, status: str | None,
              since: str | None, error_type: str | None, dry_run: bool) -> Selection | None:
    """The bulk selection the options make; None for one run by RUN_ID."""
    filters = {"--workflow": workflow, "--status": status, "--since": since,
               "--error-type": error_type, "--dry-run": dry_run or None}
    given = [name for name, value in filters.items() if value is not None]
    if run_id is not None:
        if given:
            raise InputError(f"give RUN_ID or {', '.join(given)}, not both")
        return None
    if workflow is None or status is None:
        raise InputError("give a RUN_ID, or --workflow and --status to select runs")
    return Selection(workflow, run_status(status),
                     None if since is None else since_of(since, time.time()), error_type)


def selected(runs_client: Any, chosen: Selection) -> list[Any]:
    """The runs ``chosen`` selects, newest first (the listing stops at ``since``)."""
    found = []
    for info in runs_client.list_runs(name=chosen.workflow, status=chosen.status):
        if chosen.since is not None and info.created_at < chosen.since:
            break
        if chosen.matches(info):
            found.append(info)
    return found


def bulk(runs_client: Any, chosen: Selection, verb: tuple[str, str],
         act: Callable[[str], dict[str, Any]], *, dry_run: bool, as_json: bool) -> None:
    """``act`` on each selected run (it returns what it did, or raises ValueError or
    WorkflowNotFound to refuse that run), and say so; ``verb``: its infinitive and its
    past participle (``retry``, ``retried``)."""
    from pyrula.workflows import WorkflowNotFound

    runs = selected(runs_client, chosen)
    if dry_run:
        _dry_run(runs, verb[0], as_json)
        return
    done: list[dict[str, Any]] = []
    for info in runs:
        try:
            done.append({"run_id": info.run_id, **act(info.run_id)})
        except (ValueError, WorkflowNotFound) as exc:
            done.append({"run_id": info.run_id, "refused": str(exc)})
    refused = sum(1 for row in done if "refused" in row)
    summary = f"{verb[1]}: {len(done) - refused} of {len(done)} selected run(s), {refused} refused"
    if as_json:
        print_json({"selected": len(done), "refused": refused, "runs": done})
    else:
        for row in done:
            what = row.get("refused") or row["said"]
            click.echo(f"run {row['run_id']}: {'refused: ' if 'refused' in row else ''}{what}")
        click.echo(summary)
    if refused:
        raise RunRefusal(summary)


def _dry_run(runs: list[Any], verb: str, as_json: bool) -> None:
    rows = [{"run_id": info.run_id, "workflow": info.name, "status": info.status.value,
             "created_at": iso(info.created_at, precise=True),
             "error_type": (info.error or {}).get("error_type")} for info in runs]
    if as_json:
        print_json({"dry_run": True, "selected": len(rows), "runs": rows})
        return
    for row in rows:
        error = f", {row['error_type']}" if row["error_type"] else ""
        click.echo(f"would {verb} run {row['run_id']} ({row['status']}, created "
                   f"{row['created_at']}{error})")
    click.echo(f"{len(rows)} run(s) selected; dry run: nothing done")


def bulk_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """RUN_ID (optional) and the options that select runs instead."""
    for option in reversed((
        click.argument("run_id", required=False),
        click.option("--workflow", default=None, help="bulk: runs of this workflow"),
        click.option("--status", default=None, help="bulk: runs in this status"),
        click.option("--since", default=None, metavar="T",
                     help="bulk: created at or after T (ISO-8601, or 90s / 30m / 2h / 7d ago)"),
        click.option("--error-type", default=None, metavar="E",
                     help="bulk: failed with this error type (e.g. ValueError)"),
        click.option("--dry-run", is_flag=True, help="bulk: list the runs, do nothing"),
        JSON, STORE, NAMESPACE,
    )):
        fn = option(fn)
    return fn


@click.command("retry")
@bulk_options
def retry_command(run_id: str | None, workflow: str | None, status: str | None,
                  since: str | None, error_type: str | None, dry_run: bool, as_json: bool,
                  store: str | None, namespace: str | None) -> None:
    """Submit a failed (or quarantined) run again from its params, workflow and owner;
    or every run --workflow and --status select."""
    from pyrula.workflows import WorkflowClient
    from pyrula.workflows.triage import retry_run

    chosen = selection(run_id, workflow, status, since, error_type, dry_run)
    runs_client = client(store, namespace)

    def retry(target: str) -> dict[str, Any]:
        handle = store_call(runs_client.store, retry_run(WorkflowClient(runs_client.store), target))
        return {"new_run_id": handle.run_id, "workflow": handle.name,
                "said": f"retried as run {handle.run_id}"}

    if chosen is not None:
        bulk(runs_client, chosen, ("retry", "retried"), retry, dry_run=dry_run, as_json=as_json)
        return
    assert run_id is not None
    get_run(runs_client, run_id)
    try:
        retried = retry(run_id)
    except ValueError as exc:  # NotRetryable
        raise RunRefusal(str(exc)) from None
    if as_json:
        print_json({"run_id": retried["new_run_id"], "workflow": retried["workflow"],
                    "retries": run_id})
    else:
        click.echo(f"run {retried['new_run_id']} retries run {run_id}")


@click.command("cancel")
@bulk_options
def cancel_command(run_id: str | None, workflow: str | None, status: str | None,
                   since: str | None, error_type: str | None, dry_run: bool, as_json: bool,
                   store: str | None, namespace: str | None) -> None:
    """Cancel a run; say whether it was cancelled or had already ended. Or every run
    --workflow and --status select."""
    chosen = selection(run_id, workflow, status, since, error_type, dry_run)
    if chosen is not None:
        runs_client = client(store, namespace)

        def cancel(target: str) -> dict[str, Any]:
            cancelled = bool(runs_client.cancel(target))
            return {"cancelled": cancelled,
                    "said": "cancelled" if cancelled else "had already ended"}

        bulk(runs_client, chosen, ("cancel", "cancelled"), cancel, dry_run=dry_run, as_json=as_json)
        return
    assert run_id is not None
    cancelled = cancel_run(run_id, store, namespace)
    if as_json:
        print_json({"run_id": run_id, "cancelled": cancelled})
    elif cancelled:
        click.echo(f"run {run_id} cancelled")
    else:
        click.echo(f"run {run_id} had already ended; nothing to cancel")


def step_reference(text: str) -> str | int:
    """``--from-step``: digits are a 1-based position among the run's step calls, anything
    else a step's name."""
    return int(text) if text.isdigit() else text


@click.command("fork")
@bulk_options
@click.option("--from-step", "from_step", required=True, metavar="K",
              help="a step name (the run's first call of it) or a 1-based position among "
                   "the run's step calls")
@click.option("--params", default=None, metavar="JSON",
              help="the fork's params (default: the run's)")
def fork_command(run_id: str | None, workflow: str | None, status: str | None,
                 since: str | None, error_type: str | None, dry_run: bool, as_json: bool,
                 store: str | None, namespace: str | None, from_step: str,
                 params: str | None) -> None:
    """Start a new run of RUN_ID's workflow that reuses the results of its steps before
    step K and runs the rest on today's code; or fork every run --workflow and --status
    select."""
    chosen = selection(run_id, workflow, status, since, error_type, dry_run)
    value = None if params is None else json_argument("--params", params)
    runs_client = client(store, namespace)
    step = step_reference(from_step)

    def fork(target: str) -> dict[str, Any]:
        handle = runs_client.fork(target, from_step=step, params=value)
        return {"new_run_id": handle.run_id, "workflow": handle.name,
                "said": f"forked as run {handle.run_id}"}

    if chosen is not None:
        bulk(runs_client, chosen, ("fork", "forked"), fork, dry_run=dry_run, as_json=as_json)
        return
    assert run_id is not None
    get_run(runs_client, run_id)
    try:
        forked = fork(run_id)
    except ValueError as exc:
        raise RunRefusal(str(exc)) from None
    if as_json:
        print_json({"run_id": forked["new_run_id"], "workflow": forked["workflow"],
                    "forks": run_id, "from_step": step})
    else:
        click.echo(f"run {forked['new_run_id']} forks run {run_id} from step {from_step}")
