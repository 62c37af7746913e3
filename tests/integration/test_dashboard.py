"""The dashboard in a real browser, against a real fleet on a real SQLite store.

The page loads and shows the fleet's children; a submitted run appears in the runs table
and its page's timeline shows its steps; a parent's page lists its children, each
linked to its own page, which links back to the parent; the read-only badge is shown and an action
answers 403 naming the flag; with ``--dashboard-actions`` the retry button retries a
failed run as ``pyrula runs retry`` does (idempotency key ``retry:<RUN_ID>``). Every page
is photographed under the test's tmp dir, and none logs a console error.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.workflows import SyncWorkflowClient
from tests.conftest import wait_until
from tests.fleet.fleetprocs import QUICK, Fleets, child_env, write_app
from tests.integration.dashboard_browser import browser_page, skip_without_browser

pytestmark = pytest.mark.slow

FLAKY_APP = textwrap.dedent(
    '''
    """A workflow that fails until the test writes ``fixed`` beside it, and a parent of
    three children."""

    from pathlib import Path

    from pyrula.workflows import step, workflow

    HERE = Path(__file__).resolve().parent


    @step
    def check(tag: str) -> str:
        if not (HERE / "fixed").exists():
            raise ValueError(f"{tag} is not fixed yet")
        return f"{tag} fixed"


    @workflow(name="dash_flaky")
    async def flaky(ctx, params):
        return await check(params["tag"])


    @workflow(name="dash_kid")
    async def kid(ctx, params):
        return params * 2


    @workflow(name="dash_parent")
    async def parent(ctx, params):
        return await ctx.gather_children([(kid, i) for i in range(params)])
    '''
)


#: A ``sitecustomize`` that makes Starlette and uvicorn unimportable, as without the extra.
NO_HTTP_EXTRA = textwrap.dedent(
    """
    import sys

    class NoHttpExtra:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("starlette", "uvicorn"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoHttpExtra())
    """
)


@pytest.fixture
def plain_fleets(tmp_path: Path) -> Iterator[Fleets]:
    with Fleets(tmp_path) as started:
        yield started


@pytest.fixture
def fleets(tmp_path: Path) -> Iterator[Fleets]:
    """Fleets as tests/fleet has them, for the browser tests (skipped without chromium);
    ``client`` is the integration suite's, on the same SQLite file."""
    skip_without_browser()
    with Fleets(tmp_path) as started:
        yield started


def test_without_the_http_extra_the_probes_answer_and_slash_says_what_to_install(
    plain_fleets: Fleets, tmp_path: Path
) -> None:
    hooks = tmp_path / "no-http-extra"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(NO_HTTP_EXTRA)
    env = child_env()
    env["PYTHONPATH"] = f"{hooks}{os.pathsep}{env['PYTHONPATH']}"
    fleet = plain_fleets.start("-n", "1", *QUICK, env=env)
    fleet.wait_ready(1)
    assert "no dashboard (pip install 'pyrula[http]')" in fleet.log()
    code, body = fleet.get("/")
    assert code == 200 and "pip install 'pyrula[http]'" in body
    assert fleet.get("/livez")[0] == 200
    assert fleet.get("/dashboard/api/overview")[0] == 404
    code, body = fleet.get("/nope")
    assert code == 404
    assert json.loads(body) == {"status": "not_found", "routes": "/livez,/readyz,/status,/metrics"}
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def test_the_pages_show_the_fleet_a_run_and_its_timeline_read_only(
    fleets: Fleets, client: SyncWorkflowClient, tmp_path: Path
) -> None:
    fleet = fleets.start("-n", "2", *QUICK)
    status = fleet.wait_ready(2)
    run = client.submit("fa_load", {"tag": "t1"}, priority=2)
    assert client.result(run.run_id, timeout=20) == ["a", "b"]
    nobody = client.submit("dash_nobody", {})  # no worker serves it: a stuck run
    shots = tmp_path / "screenshots"
    with browser_page() as watched:
        page = watched.page
        page.goto(fleet.url + "/")
        page.wait_for_selector("#children tbody tr[data-slot='1']")
        rows = page.locator("#children tbody tr[data-slot]")
        assert rows.count() == 2
        text = page.locator("#children").inner_text()
        for child in status["children"]:
            assert str(child["pid"]) in text
        assert page.locator("#mode").inner_text() == "read-only"
        assert page.locator("#shards").inner_text().startswith("not sharded")
        page.wait_for_selector("#chart-throughput polyline")
        watched.shot(shots / "fleet.png")

        page.goto(fleet.url + "/#/runs")
        page.wait_for_selector(f"#runs tr[data-run='{run.run_id}']")
        assert "completed" in page.locator(f"#runs tr[data-run='{run.run_id}']").inner_text()
        watched.shot(shots / "runs.png")

        page.click(f"#runs tr[data-run='{run.run_id}'] a")
        page.wait_for_selector("#timeline li.step >> nth=1")
        steps = page.locator("#timeline li.step").all_inner_texts()
        assert [s.split(" · ")[0] for s in steps] == ["step step_a", "step step_b"]
        assert "attempt 1 on " in page.locator("#timeline li.attempt").inner_text()
        assert page.locator("#run-status").inner_text() == "completed"
        facts = page.locator("#run-facts").inner_text().splitlines()
        assert [f.split() for f in facts if f.startswith("priority")] == [["priority", "2"]]
        assert "read-only" in page.locator("#run-actions").inner_text()
        watched.shot(shots / "run.png")

        page.goto(fleet.url + "/#/stuck")
        page.wait_for_selector(f"#stuck tr[data-run='{nobody.run_id}']")
        assert "no live worker serves" in page.locator("#stuck").inner_text()
        watched.shot(shots / "stuck.png")

        assert watched.errors == []
    request = urllib.request.Request(f"{fleet.url}/dashboard/api/runs/{nobody.run_id}/cancel",
                                     method="POST", data=b"")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 403
    with refused.value as answer:
        assert "--dashboard-actions" in json.loads(answer.read())["error"]["message"]
    assert client.get(nobody.run_id).status.value == "queued"  # the 403 changed nothing
    assert sorted(p.name for p in shots.iterdir()) == ["fleet.png", "run.png", "runs.png",
                                                       "stuck.png"]
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def test_with_dashboard_actions_the_retry_button_retries_a_failed_run(
    fleets: Fleets, client: SyncWorkflowClient, tmp_path: Path
) -> None:
    write_app(tmp_path, FLAKY_APP, module="flakyapp")
    fleet = fleets.start("-n", "1", "--app", "flakyapp", "--dashboard-actions", *QUICK)
    fleet.wait_ready(1)
    failed = client.submit("dash_flaky", {"tag": "f1"})
    wait_until(lambda: client.get(failed.run_id).status.value == "failed", 20,
               what="the flaky run to fail")
    (tmp_path / "fixed").touch()
    family = client.submit("dash_parent", 3)
    assert client.result(family.run_id, timeout=20) == [0, 2, 4]
    journal = client.events(family.run_id)
    kids = [str(item[1]) for e in journal if e["type"] == "child:started"
            for item in e.get("children") or ()]
    assert len(kids) == 3
    with browser_page() as watched:
        page = watched.page
        page.goto(f"{fleet.url}/#/run/{failed.run_id}")
        page.wait_for_selector("#run-status:text('failed')")
        assert page.locator("#mode").inner_text() == "actions enabled"
        outcome = page.locator("#run-outcome").inner_text()
        assert "is not fixed yet" in outcome
        # The step's traceback as lines of text, its own frame in it, nothing escaped.
        lines = outcome.splitlines()
        assert any("flakyapp.py" in line and "in check" in line for line in lines), outcome
        assert any(line.strip() == 'raise ValueError(f"{tag} is not fixed yet")'
                   for line in lines), outcome
        assert "\\n" not in outcome and "pyrula/workflows" not in outcome, outcome
        page.click("#run-actions button:text('Retry')")
        page.wait_for_function(
            "id => location.hash.startsWith('#/run/') && !location.hash.endsWith(id)",
            arg=failed.run_id)
        retry_id = page.evaluate("decodeURIComponent(location.hash.slice(6))")
        page.wait_for_selector("#run-status:text('completed')")
        page.wait_for_selector(f"#run-facts a:has-text('{failed.run_id}')")  # "retries" row
        watched.shot(tmp_path / "screenshots" / "retried.png")

        # A parent's page lists its children; a child's page links back to its parent.
        page.goto(f"{fleet.url}/#/run/{family.run_id}")
        page.wait_for_selector("#run-children tbody tr[data-child] >> nth=2")
        rows = page.locator("#run-children tbody tr[data-child]")
        assert [r.split("\t") for r in rows.all_inner_texts()] == [
            [kid, "dash_kid", "completed"] for kid in kids]
        assert page.locator("#run-more-children").is_hidden()
        assert page.locator("#run-facts tr[data-parent]").count() == 0
        watched.shot(tmp_path / "screenshots" / "parent.png")
        page.click(f"#run-children tr[data-child='{kids[1]}'] a")
        page.wait_for_selector(f"#run-id:text('{kids[1]}')")
        parent_link = page.locator(f"#run-facts tr[data-parent='{family.run_id}'] a")
        parent_link.wait_for()
        assert parent_link.inner_text() == family.run_id
        assert page.locator("#run-family").is_hidden()  # a child with no children
        watched.shot(tmp_path / "screenshots" / "child.png")
        parent_link.click()
        page.wait_for_selector(f"#run-id:text('{family.run_id}')")
        assert watched.errors == []
    retried = client.get(retry_id)
    assert retried.idempotency_key == f"retry:{failed.run_id}"
    assert client.result(retry_id, timeout=5) == "f1 fixed"
    # The same retry as `pyrula runs retry`: retrying again returns the same run.
    again = client.submit("dash_flaky", {"tag": "f1"}, idempotency_key=f"retry:{failed.run_id}")
    assert again.run_id == retry_id
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0
