"""Fixtures of the process tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.workflows import SQLiteStore, SyncWorkflowClient
from tests.integration.workerprocs import STORE_FILE, Workers


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    """Worker processes over one SQLite file in ``tmp_path``; all reaped at teardown."""
    fleet = Workers(tmp_path)
    try:
        yield fleet
    finally:
        fleet.reap()


@pytest.fixture
def client(tmp_path: Path) -> Iterator[SyncWorkflowClient]:
    """A client in the test process on the workers' SQLite file."""
    store = SQLiteStore(tmp_path / STORE_FILE)
    try:
        yield SyncWorkflowClient(store)
    finally:
        store.close()
