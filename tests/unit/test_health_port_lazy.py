"""The fleet's health port answers its probes without the dashboard's imports.

A fleet's first second is its children's first runs, often under a backlog: the port's
``GET`` probes are answered by a few lines of ASGI (``PortApp``), and the dashboard's
Starlette app is built at the first request for anything else. The probes answer exactly
as the Starlette routes do (same status, headers and bytes), whatever a handler returns or
raises.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyrula.config.fleet import FleetOptions
from pyrula.health_http import Handler
from pyrula.supervisor.supervisor import Supervisor
from pyrula.supervisor.web import HealthPort, PortApp
from pyrula.workflows.stores.memory import MemoryStore

pytest.importorskip("starlette")

PATHS = ("/livez", "/readyz", "/status", "/metrics")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)
#: What a probe handler does: answer (status, JSON body or exposition text), or raise.
answers = st.one_of(
    st.tuples(st.sampled_from([200, 500, 503]), json_values | st.text(max_size=40)),
    st.just("raises"),
)


def handler_of(answer: Any) -> Handler:
    async def handler() -> tuple[int, Any]:
        if answer == "raises":
            raise RuntimeError("the probe broke")
        return answer  # type: ignore[no-any-return]

    return handler


async def asgi_get(app: Any, path: str, method: str = "GET") -> tuple[int, list[Any], bytes]:
    """One request through an ASGI app, as uvicorn makes it: (status, headers, body)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": b"", "headers": [],
             "server": ("127.0.0.1", 1), "client": ("127.0.0.1", 2)}
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], [tuple(h) for h in start["headers"]], body


def port() -> HealthPort:
    options = FleetOptions(apps=("pyrula.examples.bench",), store_url="memory://")
    supervisor = Supervisor(options, None, MemoryStore())  # type: ignore[arg-type]  # never spawns
    return HealthPort(supervisor, "127.0.0.1", 0, with_dashboard=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(answers, min_size=len(PATHS), max_size=len(PATHS)))
def test_a_probe_answers_as_the_dashboards_route_does(drawn: list[Any]) -> None:
    from pyrula.dashboard.series import Sampler

    probes = {path: handler_of(a) for path, a in zip(PATHS, drawn, strict=True)}
    health = port()
    starlette_app = health.app(Sampler(health.supervisor.families), probes)
    built: list[Any] = []

    def build() -> Any:
        built.append(1)
        return starlette_app

    lazy = PortApp(probes, build)

    async def both() -> None:
        for path in PATHS:
            assert await asgi_get(lazy, path) == await asgi_get(starlette_app, path)
        assert built == [], "a probe built the dashboard's app"
        # Anything else is the dashboard's: built once, at the first such request.
        for path, method in (("/nope", "GET"), ("/livez", "POST"), ("/", "GET")):
            assert await asgi_get(lazy, path, method) == \
                await asgi_get(starlette_app, path, method)
        assert built == [1]

    asyncio.run(both())


def test_the_probes_of_a_started_port_do_not_import_the_dashboard() -> None:
    # In a fresh interpreter: a supervisor's port started and probed loads no Starlette and
    # no dashboard; the first request for the page loads them and serves it.
    script = """
import asyncio, json, sys, urllib.request
from pyrula.config.fleet import FleetOptions
from pyrula.supervisor.supervisor import Supervisor
from pyrula.supervisor.web import HealthPort
from pyrula.workflows.stores.memory import MemoryStore

def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()

def loaded():
    return sorted(n for n in ("starlette", "pyrula.dashboard.app") if n in sys.modules)

async def main():
    options = FleetOptions(apps=("pyrula.examples.bench",), store_url="memory://")
    supervisor = Supervisor(options, None, MemoryStore())
    health = HealthPort(supervisor, "127.0.0.1", 0, with_dashboard=True)
    host, port = await health.start()
    base = f"http://{host}:{port}"
    out = {"probes": {}}
    for path in ("/livez", "/readyz", "/status", "/metrics"):
        out["probes"][path] = (await asyncio.to_thread(get, base + path))[0]
    out["after_probes"] = loaded()
    code, page = await asyncio.to_thread(get, base + "/")
    out["page"] = [code, "<html" in page.lower()]
    out["after_page"] = loaded()
    await health.close()
    print(json.dumps(out))

asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["probes"] == {"/livez": 200, "/readyz": 503, "/status": 200, "/metrics": 200}
    assert out["after_probes"] == []
    assert out["page"] == [200, True]
    assert out["after_page"] == ["pyrula.dashboard.app", "starlette"]
