"""Worker unit tests run on the embedded stores; the Valkey store has its conformance suite
(tests/conformance) and its own integration tests (tests/integration/test_valkey_*)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    from pyrula.workflows import MemoryStore, SQLiteStore

    s: Any = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "store.db")
    try:
        yield s
    finally:
        s.close()
