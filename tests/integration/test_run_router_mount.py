"""``POST /runs`` without its trailing slash: a RunRouter mounted at ``/runs`` with
``RunRouter(store).mount("/runs")`` answers it as ``POST /runs/`` (a plain ``Mount``
leaves it to Starlette's redirect, an empty 307 a client posting a run does not follow)."""

from __future__ import annotations

import httpx
from starlette.applications import Starlette
from starlette.routing import Mount

from pyrula.workflows import MemoryStore
from pyrula.workflows.http import RunRouter


def _client(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def test_post_runs_with_and_without_the_slash_submits() -> None:
    store = MemoryStore()
    app = Starlette(routes=[RunRouter(store, dashboard=False).mount("/runs")])
    async with _client(app) as http:
        bare = await http.post("/runs", json={"workflow": "mount.a", "params": {"n": 1}})
        slashed = await http.post("/runs/", json={"workflow": "mount.a", "params": {"n": 2}})
        assert (bare.status_code, slashed.status_code) == (201, 201), (bare.text, slashed.text)
        listed = (await http.get("/runs")).json()["runs"]
        assert {r["params"]["n"] for r in listed} == {1, 2}
        assert (await http.get("/runs/")).json()["runs"] == listed
        run_id = bare.json()["run_id"]
        assert (await http.get(f"/runs/{run_id}")).json()["run_id"] == run_id
        assert (await http.get("/runsx")).status_code == 404  # only the mount's own path


async def test_the_mount_works_below_a_prefix_too() -> None:
    store = MemoryStore()
    inner = Starlette(routes=[RunRouter(store, dashboard=False).mount("/runs")])
    app = Starlette(routes=[Mount("/api", inner)])
    async with _client(app) as http:
        made = await http.post("/api/runs", json={"workflow": "mount.b"})
        assert made.status_code == 201, made.text
        assert (await http.get(f"/api/runs/{made.json()['run_id']}")).status_code == 200
