"""The dashboard's JSON routes and page served by a mounted ``RunRouter(store)``,
in process over ASGI (no fleet: no children, no charts, the store's runs)."""

from __future__ import annotations

from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.routing import Mount

from pyrula.workflows import InlineWorkflowRunner, MemoryStore, WorkflowClient
from pyrula.workflows.http import RunRouter
from pyrula.workflows.stores.base import Store


def _http(store: Store, actions: bool = False) -> httpx.AsyncClient:
    router = RunRouter(store, dashboard_actions=actions)
    app = Starlette(routes=[Mount("/runs", router)])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def test_the_page_points_its_script_at_the_mount_and_the_runs_are_listed() -> None:
    store = MemoryStore()
    first = await WorkflowClient(store).submit("dash_api_a", {"n": 1}, owner="o1")
    second = await WorkflowClient(store).submit("dash_api_b", {"n": 2}, owner="o2")
    async with _http(store) as http:
        assert (await http.get("/runs/dashboard")).status_code == 307
        page = await http.get("/runs/dashboard/")
        assert page.status_code == 200
        assert 'data-base="/runs/dashboard/"' in page.text
        assert 'class="badge read-only"' in page.text
        assert (await http.get("/runs/dashboard/static/dashboard.js")).status_code == 200
        listed = (await http.get("/runs/dashboard/api/runs?limit=1")).json()
        assert [r["run_id"] for r in listed["runs"]] == [second.run_id]  # newest first
        older = (await http.get(f"/runs/dashboard/api/runs?limit=1&cursor={listed['cursor']}"))
        assert [r["run_id"] for r in older.json()["runs"]] == [first.run_id]
        owned = (await http.get("/runs/dashboard/api/runs?owner=o1")).json()["runs"]
        assert [r["run_id"] for r in owned] == [first.run_id]
        bad = await http.get("/runs/dashboard/api/runs?status=nope")
        assert bad.status_code == 422 and "status" in bad.json()["error"]["message"]
        overview = (await http.get("/runs/dashboard/api/overview")).json()
        assert overview["fleet"] is None and overview["actions"] is False
        assert (await http.get("/runs/dashboard/api/series")).json()["available"] is False
        assert (await http.get("/runs/dashboard/api/shards")).json()["sharded"] is False
        queues = (await http.get("/runs/dashboard/api/queues")).json()
        assert {q["workflow"]: q["depth"] for q in queues["queues"]} == {
            "dash_api_a": 1, "dash_api_b": 1}
        refused = await http.post(f"/runs/dashboard/api/runs/{first.run_id}/cancel")
        assert refused.status_code == 403
        assert "--dashboard-actions" in refused.json()["error"]["message"]
        assert (await WorkflowClient(store).get(first.run_id)).status.value == "queued"
        # The router's own routes still answer beside it.
        assert (await http.get(f"/runs/{first.run_id}")).json()["run_id"] == first.run_id


async def test_a_run_page_has_its_timeline_and_a_retry_uses_the_retry_key() -> None:
    store = MemoryStore()
    from pyrula.workflows import WorkflowContext, step, workflow

    @step(name="dash_api_boom")
    def boom() -> None:
        raise ValueError("boom")

    @workflow(name="dash_api_fails")
    async def fails(ctx: WorkflowContext, params: object) -> None:
        await boom()

    runner = InlineWorkflowRunner(store=store)
    run = await runner.client.submit("dash_api_fails", {"x": 1})
    await runner.run(run.name, run.run_id)
    async with _http(store, actions=True) as http:
        shown = (await http.get(f"/runs/dashboard/api/runs/{run.run_id}")).json()
        assert shown["status"] == "failed" and shown["params"] == {"x": 1}
        kinds = [entry["kind"] for entry in shown["timeline"]]
        assert kinds == ["attempt", "step"]
        assert shown["timeline"][1]["name"] == "dash_api_boom"
        assert shown["timeline"][1]["outcome"] == "failed"
        assert shown["timeline"][1]["seconds"] is not None
        retried = await http.post(f"/runs/dashboard/api/runs/{run.run_id}/retry")
        assert retried.status_code == 200
        again = await http.post(f"/runs/dashboard/api/runs/{run.run_id}/retry")
        assert again.json()["run_id"] == retried.json()["run_id"]  # the same retry run
        new = await WorkflowClient(store).get(retried.json()["run_id"])
        assert new.idempotency_key == f"retry:{run.run_id}" and new.params == {"x": 1}
        refused = await http.post(f"/runs/dashboard/api/runs/{new.run_id}/retry")
        assert refused.status_code == 409  # queued, not failed
        missing = await http.get("/runs/dashboard/api/runs/nope")
        assert missing.status_code == 404


async def test_an_api_only_router_serves_no_dashboard() -> None:
    app = Starlette(routes=[Mount("/runs", RunRouter(MemoryStore(), dashboard=False))])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as http:
        assert (await http.get("/runs/dashboard/", follow_redirects=True)).status_code == 404
        assert (await http.get("/runs/")).status_code == 200  # the API itself


async def test_the_projections_page_lists_projections_and_shows_a_state() -> None:
    from pyrula.workflows.stores.capabilities import ProjectionHead

    store = MemoryStore()
    head = ProjectionHead("dash_api.totals", 0, "fp", True, (1_800_000_000.0, "r1"), 3,
                          1_800_000_000.0)
    assert await store.save_projection(head, {"acme": 2, "bolt": 1}, expected=0, reset=False)
    async with _http(store) as http:
        page = (await http.get("/runs/dashboard/")).text
        assert 'href="#/projections"' in page and 'id="view-projection"' in page
        listed = (await http.get("/runs/dashboard/api/projections")).json()["projections"]
        assert [(p["name"], p["folded"], p["keyed"]) for p in listed] == [
            ("dash_api.totals", 3, True)]
        shown = (await http.get("/runs/dashboard/api/projections/dash_api.totals")).json()
        assert shown["state"] == {"acme": 2, "bolt": 1}
        one = await http.get("/runs/dashboard/api/projections/dash_api.totals?key=bolt")
        assert one.json()["state"] == 1
        missing = await http.get("/runs/dashboard/api/projections/nope")
        assert missing.status_code == 404


async def test_a_run_page_names_its_parent_and_its_first_children_and_counts_the_rest(
    tmp_path: Path,
) -> None:
    """On SQLite: a parent that started 53 children answers the first 50 (id, workflow,
    status, in the order started) and counts the other 3; a child names its parent; a
    run with no family answers none."""
    from pyrula.workflows import SQLiteStore, WorkflowContext, workflow

    @workflow(name="dash_api_kid")
    async def kid(ctx: WorkflowContext, params: int) -> int:
        return params

    @workflow(name="dash_api_parent")
    async def parent(ctx: WorkflowContext, params: int) -> list[int]:
        return await ctx.gather_children([(kid, i) for i in range(params)],
                                         max_concurrency=params)

    store = SQLiteStore(str(tmp_path / "store.db"))
    runner = InlineWorkflowRunner(store=store, cloud=False)
    try:
        run = await runner.client.submit("dash_api_parent", 53)
        await runner.run(run.name, run.run_id)  # starts its 53 children, then parks
        journal = await runner.client.events(run.run_id)
        started = [str(item[1]) for e in journal if e["type"] == "child:started"
                   for item in e.get("children") or ()]
        assert len(started) == 53
        await runner.run("dash_api_kid", started[1])  # one child ended, the rest queued
        async with _http(store) as http:
            shown = (await http.get(f"/runs/dashboard/api/runs/{run.run_id}")).json()
            assert shown["parent_id"] is None
            assert [c["run_id"] for c in shown["children"]] == started[:50]
            assert {c["name"] for c in shown["children"]} == {"dash_api_kid"}
            assert [c["status"] for c in shown["children"][:3]] == [
                "queued", "completed", "queued"]
            assert shown["more_children"] == 3
            child = (await http.get(f"/runs/dashboard/api/runs/{started[1]}")).json()
            assert child["parent_id"] == run.run_id
            assert child["children"] == [] and child["more_children"] == 0
    finally:
        await runner.aclose()
