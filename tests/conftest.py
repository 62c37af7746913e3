"""Shared test plumbing: async tests without a plugin, stores, and polling helpers."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests in a fresh event loop each."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {name: pyfuncitem.funcargs[name] for name in names}

        async def run() -> None:
            try:
                await pyfuncitem.obj(**kwargs)
            finally:
                # Stores keep a client per event loop: close this loop's before it ends.
                for value in kwargs.values():
                    aclose = getattr(value, "aclose", None)
                    if aclose is not None and inspect.iscoroutinefunction(aclose):
                        await aclose()

        asyncio.run(run())
        return True
    return None


def wait_until(
    condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> Any:
    """Poll ``condition`` until it returns something truthy, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(interval)


async def await_until(
    condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> Any:
    """Async twin of ``wait_until``; ``condition`` may return an awaitable."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        await asyncio.sleep(interval)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Every embedded store, one test run each."""
    from pyrula.workflows import MemoryStore, SQLiteStore

    if request.param == "memory":
        s: Any = MemoryStore()
    else:
        s = SQLiteStore(str(tmp_path / "store.db"))
    try:
        yield s
    finally:
        s.close()
