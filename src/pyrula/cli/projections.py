"""``pyrula projections list|show|rebuild``: read and reset the projections the workers
fold (docs/projections.md)."""

from __future__ import annotations

from typing import Any

import click

from pyrula.cli.common import NAMESPACE, STORE, Refusal
from pyrula.cli.runs import JSON, client, print_json


@click.group("projections")
def projections() -> None:
    """The projections of a store: their state, and rebuilding one."""


@projections.command("list")
@JSON
@STORE
@NAMESPACE
def list_projections(as_json: bool, store: str | None, namespace: str | None) -> None:
    """Every projection folded in the store: runs folded, checkpoint, last write."""
    from pyrula.workflows.projections import head_document

    heads = [head_document(h) for h in client(store, namespace).projections()]
    if as_json:
        print_json(heads)
        return
    if not heads:
        click.echo("no projections yet (workers fold them once runs end)")
        return
    click.echo(f"{'NAME':<32} {'FOLDED':>8} {'KEYED':<5} {'CHECKPOINT':<25} UPDATED")
    for h in heads:
        at = h["checkpoint"]["finished_at"] if h["checkpoint"] else "-"
        click.echo(f"{h['name']:<32} {h['folded']:>8} {'yes' if h['keyed'] else 'no':<5} "
                   f"{at:<25} {h['updated_at']}")


@projections.command("show")
@click.argument("name")
@click.option("--key", default=None, help="the key of a keyed projection's state")
@JSON
@STORE
@NAMESPACE
def show(name: str, key: str | None, as_json: bool, store: str | None,
         namespace: str | None) -> None:
    """Print projection NAME's state as JSON (a keyed one: every key's, or --key's);
    --json wraps it with the projection's version, checkpoint and runs folded."""
    from pyrula.workflows.projections import check_projection_name, head_document

    check_projection_name(name)
    c = client(store, namespace)
    head = c.projection_info(name)
    if head is None:
        raise Refusal(f"no projection named {name!r} in this store (workers write it "
                      "once they fold their first run)")
    value: Any = c.projection(name, key)
    print_json({**head_document(head), "key": key, "state": value} if as_json else value)


@projections.command("rebuild")
@click.argument("name")
@STORE
@NAMESPACE
def rebuild(name: str, store: str | None, namespace: str | None) -> None:
    """Drop projection NAME's state and checkpoint: workers fold it again from the first
    run the store still keeps."""
    client(store, namespace).rebuild_projection(name)
    click.echo(f"rebuilding {name}: workers fold it again from the first run kept")
