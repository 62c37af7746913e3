"""Photograph each page of the dashboard against the example app (``make run``'s).

``PYTHONPATH=src .venv/bin/python -m tests.integration.dashboard_screenshots docs/img``
starts ``python -m pyrula.examples`` on a fresh SQLite file, reads the dashboard's URL
from the first line it prints, waits until some orders have completed, and writes
``dashboard-fleet.png``, ``dashboard-runs.png``, ``dashboard-run.png`` and
``dashboard-stuck.png`` (1280x800) into the directory given. docs/operations.md shows
them. Fails if a page logs a console error.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.conftest import wait_until
from tests.integration.dashboard_browser import browser_page, why_no_browser

SRC = Path(__file__).resolve().parents[2] / "src"


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def main(out: Path) -> int:
    reason = why_no_browser()
    if reason is not None:
        print(f"cannot take the screenshots: {reason}", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="pyrula-shots-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYRULA_")}
    env["PYTHONPATH"] = str(SRC)
    example = subprocess.Popen(
        [sys.executable, "-u", "-m", "pyrula.examples", "--db", str(work / "demo.db"),
         "--runs", "40"], cwd=work, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert example.stdout is not None
        first = example.stdout.readline()
        match = re.match(r"dashboard: (http://\S+/) ", first)
        assert match, f"the example's first line names no dashboard: {first!r}"
        url = match.group(1)
        wait_until(lambda: len(_runs(url)) >= 8, 60, interval=0.5, what="8 runs listed")
        time.sleep(6)  # a few seconds of throughput on the charts (a picture, not a check)
        out.mkdir(parents=True, exist_ok=True)
        with browser_page() as watched:
            page = watched.page
            page.goto(url)
            page.wait_for_selector("#children tbody tr[data-slot='1']")
            page.wait_for_selector("#chart-throughput polyline")
            watched.shot(out / "dashboard-fleet.png")
            page.goto(url + "#/runs")
            page.wait_for_selector("#runs tr[data-run]")
            watched.shot(out / "dashboard-runs.png")
            order = next(r for r in _runs(url) if r["workflow"] == "process_order"
                         and r["status"] == "completed")
            page.goto(url + f"#/run/{order['run_id']}")
            page.wait_for_selector("#timeline li.step")
            watched.shot(out / "dashboard-run.png")
            page.goto(url + "#/stuck")
            page.wait_for_selector("#stuck tbody tr")
            watched.shot(out / "dashboard-stuck.png")
            if watched.errors:
                print("\n".join(watched.errors), file=sys.stderr)
                return 1
        print(f"wrote 4 screenshots to {out}")
        return 0
    finally:
        example.send_signal(signal.SIGTERM)  # it drains its fleet, then exits
        try:
            example.wait(60)
        except subprocess.TimeoutExpired:
            example.kill()


def _runs(url: str) -> list[dict[str, object]]:
    """The newest runs the dashboard lists; none while the fleet does not answer yet."""
    try:
        body = _get(url + "dashboard/api/runs?limit=50")
    except OSError:
        return []
    assert isinstance(body, dict)
    runs: list[dict[str, object]] = body["runs"]
    return runs


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img")))
