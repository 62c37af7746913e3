"""``pyrula-fleet status`` and ``pyrula-fleet upgrade``: the commands that talk to a running
fleet through its health port."""

from __future__ import annotations

import json
import os
from urllib.parse import urlsplit

import click

from pyrula.cli.common import InputError, fail
from pyrula.config.fleet import resolve_health_port


def fleet_url(url: str | None) -> str:
    """``--url``, else the health port on this host; a URL that is not http(s) is a
    usage mistake."""
    if url is None:
        return f"http://127.0.0.1:{resolve_health_port(None)}"
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
        raise InputError(f"--url {url!r}: expected the fleet's health URL, such as "
                         "http://127.0.0.1:8081")
    return url


def unreachable(exc: BaseException) -> str:
    """Why a fleet's health URL did not answer, in words (urllib's own is
    ``<urlopen error [Errno 111] Connection refused>``), with what to try."""
    import socket
    import urllib.error

    reason: object = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        words = "connection refused"
    elif isinstance(reason, TimeoutError | socket.timeout):
        words = "no answer within 5 s"
    elif isinstance(reason, socket.gaierror):
        words = "no such host"
    elif isinstance(reason, OSError) and reason.strerror:
        words = reason.strerror[:1].lower() + reason.strerror[1:]
    else:
        words = str(reason)
    return f"{words} (is it running? pass --url)"


@click.command("status")
@click.option("--url", default=None, help="the fleet's health URL (default "
              "http://127.0.0.1:$PORT or :8081)")
@click.option("--json", "as_json", is_flag=True, help="print the raw /status JSON")
def status(url: str | None, as_json: bool) -> None:
    """Show a running fleet: its children, shards, runs and restarts."""
    import urllib.error
    import urllib.request

    base = fleet_url(url)
    try:
        with urllib.request.urlopen(base.rstrip("/") + "/status", timeout=5) as reply:
            body = json.loads(reply.read())
    except (urllib.error.URLError, OSError) as exc:
        fail(f"cannot reach the fleet at {base}: {unreachable(exc)}", 1)
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    sizing = (f"  size {len(body['children'])} desired={body['desired']} "
              f"min={body['min']} max={body['max']}" if "desired" in body else "")
    unleased = ("  no shards leased yet of: " + ", ".join(body["unleased"])
                if body.get("unleased") else "")
    click.echo(f"fleet {body['status']}{sizing}  restarts={body['restarts']}  "
               f"shards={json.dumps(body['shards'])}{unleased}")
    if body.get("store"):
        click.echo(f"store {body['store']}")
    for gen in body.get("generations") or []:
        held = gen.get("open_runs")
        why = ("" if gen["state"] != "retiring" else
               "  open runs only its code can replay: " + ("not counted yet" if held is None
                                                          else str(held)))
        many = "child" if gen["children"] == 1 else "children"
        click.echo(f"generation {gen['id']} {gen['state']}: {gen['children']} {many}, "
                   f"build {gen['build']}{why}")
    click.echo(f"{'SLOT':>4} {'PID':>7} {'STATE':<9} {'IN-FLIGHT':>9} {'DONE':>7} "
               f"{'RESTARTS':>8} {'RSS':>9}  WORKER / SHARDS")
    for child in body["children"]:
        rss = f"{child['rss_bytes'] / 1048576:.1f}MB"
        click.echo(f"{child['slot']:>4} {child['pid']:>7} {child['state']:<9} "
                   f"{child['in_flight']:>9} {child['runs_done']:>7} {child['restarts']:>8} "
                   f"{rss:>9}  {child['worker_id']} {json.dumps(child['shards'])}")


@click.command("upgrade")
@click.option("--url", default=None, help="the fleet's health URL (default "
              "http://127.0.0.1:$PORT or :8081)")
def upgrade(url: str | None) -> None:
    """Start a new generation of children on the code as it is now (same as kill -USR2
    <fleet pid>): runs move to it at their next step where the new code can replay them."""
    import signal
    import urllib.error
    import urllib.request

    base = fleet_url(url)
    try:
        with urllib.request.urlopen(base.rstrip("/") + "/livez", timeout=5) as reply:
            pid = int(json.loads(reply.read())["pid"])
    except (urllib.error.URLError, OSError) as exc:
        fail(f"cannot reach the fleet at {base}: {unreachable(exc)}", 1)
    except (ValueError, KeyError) as exc:
        fail(f"cannot reach the fleet at {base}: {exc}", 1)
    try:
        os.kill(pid, signal.SIGUSR2)
    except OSError as exc:  # another host's fleet, or another user's
        fail(f"cannot signal the fleet (pid {pid}) from here: {exc}; run this on the "
             "fleet's host", 1)
    click.echo(f"upgrade started: fleet pid {pid} loads the code anew; follow it with "
               "pyrula-fleet status")
