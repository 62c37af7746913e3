"""Fixtures of the fleet tests: fleets over one SQLite file in ``tmp_path``, and a client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.workflows import SQLiteStore, SyncWorkflowClient
from tests.fleet.fleetprocs import STORE_FILE, Fleets


@pytest.fixture
def fleets(tmp_path: Path) -> Iterator[Fleets]:
    """Fleet processes in ``tmp_path``; every process group is killed at teardown."""
    with Fleets(tmp_path) as started:
        yield started


@pytest.fixture
def client(tmp_path: Path) -> Iterator[SyncWorkflowClient]:
    """A client in the test process on the fleets' SQLite file."""
    store = SQLiteStore(tmp_path / STORE_FILE)
    try:
        yield SyncWorkflowClient(store)
    finally:
        store.close()
