"""The SAQ app of the peer comparison: ``saq benchmarks.peer_apps.saq_app.settings
--workers 2`` serves it; the client enqueues ``add_one`` on the same queue.

The queue lives on the benchmark's own Redis server (``$PEERS_REDIS_URL``).
"""

from __future__ import annotations

import os
from typing import Any

from saq import Queue

from benchmarks.peer_apps.harness import URL_ENV

QUEUE_NAME = "peers"
URL = os.environ.get(URL_ENV, "")
if not URL:
    raise RuntimeError(f"${URL_ENV} must name the benchmark's Redis server")


async def add_one(ctx: dict[str, Any], *, x: int) -> int:
    return x + 1


settings: dict[str, Any] = {
    "queue": Queue.from_url(URL, name=QUEUE_NAME),
    "functions": [add_one],
    "concurrency": 10,  # SAQ's default, spelled out
}
