"""The Dramatiq app of the peer comparison, imported by the client and by the workers
(``dramatiq benchmarks.peer_apps.dramatiq_app --processes 2 --threads 8``).

A ``RedisBroker`` and the ``Results`` middleware with a ``RedisBackend``, both on the
benchmark's own Redis server (``$PEERS_REDIS_URL``); one actor that stores its result.
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

from benchmarks.peer_apps.harness import URL_ENV

URL = os.environ.get(URL_ENV, "")
if not URL:
    raise RuntimeError(f"${URL_ENV} must name the benchmark's Redis server")

broker = RedisBroker(url=URL)  # type: ignore[no-untyped-call]
broker.add_middleware(Results(backend=RedisBackend(url=URL)))  # type: ignore[no-untyped-call]
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True)
def add_one(x: int) -> int:
    return x + 1
