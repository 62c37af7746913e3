"""Fixtures for the engine's unit tests: inline runners over a memory store."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from pyrula.workflows import InlineWorkflowRunner, MemoryStore
from pyrula.workflows.clock import ManualClock


def _closing(runner: InlineWorkflowRunner) -> Iterator[InlineWorkflowRunner]:
    try:
        yield runner
    finally:
        asyncio.run(runner.aclose())


@pytest.fixture
def runner() -> Iterator[InlineWorkflowRunner]:
    """An inline runner over a fresh MemoryStore, on the system clock."""
    yield from _closing(InlineWorkflowRunner(store=MemoryStore(), cloud=False))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def timed_runner(clock: ManualClock) -> Iterator[InlineWorkflowRunner]:
    """An inline runner over a fresh MemoryStore whose time moves only with ``clock``."""
    yield from _closing(InlineWorkflowRunner(store=MemoryStore(), clock=clock, cloud=False))


@pytest.fixture
def store_runner(store: Any) -> Iterator[InlineWorkflowRunner]:
    """An inline runner over each embedded store (see the ``store`` fixture)."""
    yield from _closing(InlineWorkflowRunner(store=store, cloud=False))
