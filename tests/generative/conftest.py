"""Fixtures of the generative tests: a factory of fresh stores for every backend.

Hypothesis runs many examples in one test function, so each example needs a store of
its own, not one per test: ``new_store(shard_count=...)`` makes one (a fresh namespace on
the session's Valkey server or cluster, a fresh SQLite file, a fresh memory store) and
every store it made is closed when the test ends. The servers are the session's.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

BACKENDS = [
    "memory",
    "sqlite",
    pytest.param("valkey", marks=pytest.mark.valkey),
    pytest.param("valkey-cluster", marks=[pytest.mark.valkey, pytest.mark.cluster]),
]

StoreFactory = Callable[..., Any]


def make_factory(backend: str, request: pytest.FixtureRequest,
                 tmp: Path) -> tuple[StoreFactory, list[Any]]:
    """``new_store(shard_count=None)`` for ``backend``, and the list of stores it made."""
    from pyrula.workflows import MemoryStore, SQLiteStore, ValkeyStore

    made: list[Any] = []
    files = itertools.count()
    url = None
    if backend == "valkey":
        url = request.getfixturevalue("valkey_server").url
    elif backend == "valkey-cluster":
        url = request.getfixturevalue("valkey_cluster").url

    def new_store(shard_count: int | None = None) -> Any:
        if backend == "memory":
            store: Any = MemoryStore()
        elif backend == "sqlite":
            store = SQLiteStore(str(tmp / f"store-{next(files)}.db"))
        else:
            assert url is not None
            store = ValkeyStore(url=url, namespace=f"g{uuid.uuid4().hex[:16]}",
                                shard_count=shard_count or 64)
        made.append(store)
        return store

    return new_store, made


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def new_store(backend: str, request: pytest.FixtureRequest,
              tmp_path: Path) -> Iterator[StoreFactory]:
    factory, made = make_factory(backend, request, tmp_path)
    try:
        yield factory
    finally:
        for store in made:
            store.close()
