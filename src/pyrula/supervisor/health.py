"""The fleet's one health port: /livez, /readyz, /status (JSON) and /metrics."""

from __future__ import annotations

import os
from enum import StrEnum
from typing import Any

from pyrula.health_http import Handler, ProbeServer
from pyrula.metrics import render
from pyrula.supervisor.supervisor import Supervisor


class Readiness(StrEnum):
    """The ``status`` of ``/readyz``: ready (200) or why not (503)."""

    READY = "ready"
    STARTING = "starting"
    STORE_UNREACHABLE = "store_unreachable"
    DRAINING = "draining"


def probe_routes(supervisor: Supervisor) -> dict[str, Handler]:
    """The probe routes, path -> handler: what both servers of the port answer with."""

    async def livez() -> tuple[int, Any]:
        # Answered by the supervisor's own loop: if it stops turning, the probe times out.
        return 200, {"status": "ok", "pid": os.getpid()}

    async def readyz() -> tuple[int, Any]:
        if supervisor.draining:
            return 503, {"status": Readiness.DRAINING}
        ready = supervisor.ready_children()
        if ready == 0 and supervisor.store_waiting:
            return 503, {"status": Readiness.STORE_UNREACHABLE, "ready_children": 0}
        if ready == 0:
            return 503, {"status": Readiness.STARTING, "ready_children": 0}
        serving = supervisor.serving_children()
        if serving == 0:
            return 503, {"status": Readiness.STORE_UNREACHABLE, "ready_children": 0}
        return 200, {"status": Readiness.READY, "ready_children": serving,
                     "shards": supervisor.status()["shards"]}

    async def status() -> tuple[int, Any]:
        return 200, supervisor.status()

    async def metrics() -> tuple[int, Any]:
        return 200, render_metrics(supervisor.status(), supervisor, await supervisor.metrics())

    return {"/livez": livez, "/readyz": readyz, "/status": status, "/metrics": metrics}


async def no_dashboard() -> tuple[int, Any]:
    """``/`` without Starlette and uvicorn: where the dashboard would be, how to get it."""
    return 200, ("pyrula-fleet: the dashboard needs Starlette and uvicorn: "
                 "pip install 'pyrula[http]' and restart the fleet. The probes are served "
                 "here: /livez /readyz /status /metrics\n")


def probe_server(supervisor: Supervisor, host: str, port: int) -> ProbeServer:
    """The dependency-free server of the port, for a fleet without ``pyrula[http]``."""
    return ProbeServer(probe_routes(supervisor), host, port, index=no_dashboard)


def render_metrics(status: dict[str, Any], supervisor: Supervisor,
                   families: dict[str, Any]) -> str:
    lines = [
        "# TYPE pyrula_fleet_children gauge",
        f"pyrula_fleet_children {len(status['children'])}",
        "# TYPE pyrula_fleet_children_desired gauge",
        f"pyrula_fleet_children_desired {supervisor.desired}",
        "# TYPE pyrula_fleet_children_ready gauge",
        f"pyrula_fleet_children_ready {supervisor.serving_children()}",
        "# TYPE pyrula_fleet_restarts_total counter",
        f"pyrula_fleet_restarts_total {status['restarts']}",
        "# TYPE pyrula_fleet_draining gauge",
        f"pyrula_fleet_draining {1 if supervisor.draining else 0}",
    ]
    for metric, key, kind in (
        ("pyrula_fleet_child_in_flight", "in_flight", "gauge"),
        ("pyrula_fleet_child_runs_done_total", "runs_done", "counter"),
        ("pyrula_fleet_child_rss_bytes", "rss_bytes", "gauge"),
        ("pyrula_fleet_child_restarts_total", "restarts", "counter"),
    ):
        lines.append(f"# TYPE {metric} {kind}")
        for child in status["children"]:
            lines.append(f'{metric}{{slot="{child["slot"]}"}} {child[key]}')
    lines.append("# TYPE pyrula_fleet_shards gauge")
    for name, count in sorted(status["shards"].items()):
        lines.append(f'pyrula_fleet_shards{{workflow="{name}"}} {count}')
    return "\n".join(lines) + "\n" + render(families)
