"""``pyrula runs fork``: a new run that reuses what a run recorded before a step.

Apart from ``pyrula.cli.runs`` (which it is a subcommand of) to keep that module one
screenful per concern; ``pyrula.cli.main`` adds it to the ``runs`` group.
"""

from __future__ import annotations

import click

from pyrula.cli.common import NAMESPACE, STORE, json_argument
from pyrula.cli.runs import JSON, RunRefusal, client, get_run, print_json


def step_reference(text: str) -> str | int:
    """``--from-step``: digits are a 1-based position among the run's step calls, anything
    else a step's name."""
    return int(text) if text.isdigit() else text


@click.command("fork")
@click.argument("run_id")
@click.option("--from-step", "from_step", required=True, metavar="K",
              help="a step name (the run's first call of it) or a 1-based position among "
                   "the run's step calls")
@click.option("--params", default=None, metavar="JSON",
              help="the fork's params (default: the run's)")
@JSON
@STORE
@NAMESPACE
def fork_command(run_id: str, from_step: str, params: str | None, as_json: bool,
                 store: str | None, namespace: str | None) -> None:
    """Start a new run of RUN_ID's workflow that reuses the results of its steps before
    step K and runs the rest on today's code."""
    value = None if params is None else json_argument("--params", params)
    runs_client = client(store, namespace)
    get_run(runs_client, run_id)
    step = step_reference(from_step)
    try:
        handle = runs_client.fork(run_id, from_step=step, params=value)
    except ValueError as exc:
        raise RunRefusal(str(exc)) from None
    if as_json:
        print_json({"run_id": handle.run_id, "workflow": handle.name, "forks": run_id,
                    "from_step": step})
    else:
        click.echo(f"run {handle.run_id} forks run {run_id} from step {from_step}")
