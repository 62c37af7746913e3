"""The collector's one HTML page: every fleet that reports, its workers, runs, stuck runs.

Rendered on the server from the database (escaped), refreshed by the browser every 5 s:
no script, nothing fetched from elsewhere.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

from pyrula.cloud.collector import records
from pyrula.cloud.collector.sql import Database
from pyrula.timestamps import iso_utc

_STYLE = ("body{font:14px system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse;"
          "margin-bottom:1.5em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
          "th{background:#f3f3f3}.gone{color:#999}.failed,.stuck{color:#b00}")


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], empty: str) -> str:
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c if c is not None else ''))}</td>"
                         for c in row) + "</tr>" for row in rows)
    if not body:
        return f"<p>{html.escape(empty)}</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    return f"<table><tr>{head}</tr>{body}</table>"


def _run_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    return [[r["environment"], r["workflow"], r["run_id"], r["status"], r["fleet"],
             r["worker_id"], iso_utc(float(r["updated_at"])), r["error"]] for r in rows]


async def render_page(db: Database, workflow: str | None, status: str | None) -> str:
    fleets = await records.fleets(db)
    runs = await records.runs(db, workflow or None, status or None, limit=200)
    stuck = await records.stuck_runs(db)
    run_headers = ["environment", "workflow", "run", "status", "fleet", "worker", "updated",
                   "error"]
    fleet_rows = [[f["environment"], f["fleet"], f"{f['live_workers']}/{len(f['workers'])}",
                   iso_utc(f["last_seen"])] for f in fleets]
    worker_rows = [[w["environment"], w["fleet"], w["worker_id"], w["kind"], w["pid"],
                    w["state"] if w["live"] else "gone", w["in_flight"], w["runs_done"],
                    iso_utc(float(w["last_seen"]))]
                   for f in fleets for w in f["workers"]]
    form = (f'<form>workflow <input name="workflow" value="{html.escape(workflow or "")}"> '
            f'status <input name="status" value="{html.escape(status or "")}"> '
            '<button>filter</button></form>')
    return (
        '<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" '
        'content="5"><link rel="icon" href="data:,">'
        f'<title>pyrula cloud</title><style>{_STYLE}</style></head><body>'
        "<h1>pyrula cloud</h1><h2>Fleets</h2>"
        + _table(["environment", "fleet", "live workers", "last seen"], fleet_rows,
                 "No fleet has reported yet.")
        + "<h2>Workers</h2>"
        + _table(["environment", "fleet", "worker", "kind", "pid", "state", "in flight",
                  "runs done", "last seen"], worker_rows, "No worker has reported yet.")
        + "<h2>Stuck runs</h2>"
        + _table(run_headers, _run_rows(stuck), "No run is stuck.")
        + "<h2>Runs</h2>" + form
        + _table(run_headers, _run_rows(runs), "No run matches.")
        + "</body></html>"
    )


def login_page(*, bad: bool) -> str:
    said = "<p>That key is not known here.</p>" if bad else ""
    return ('<!doctype html><html><head><meta charset="utf-8"><link rel="icon" '
            'href="data:,"><title>pyrula cloud</title>'
            f"</head><body><h1>pyrula cloud</h1>{said}<form>API key "
            '<input name="key" type="password"> <button>open</button></form></body></html>')
