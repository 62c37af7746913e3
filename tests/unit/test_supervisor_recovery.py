"""The supervisor's recovery of a dead child when the store does not answer: it tries
again until ``retry_for`` has passed, and not at all once the fleet drains.

The store is a real Valkey store pointed at a port nobody listens on: every call fails
with StoreUnavailable (after the client's own connect retries), as during a server
restart."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyrula.supervisor.recovery as recovery_module
from pyrula.errors import StoreUnavailable
from pyrula.logs import FLEET_LOGGER
from pyrula.supervisor.recovery import Recovery
from pyrula.workflows import ValkeyStore
from tests.servers import free_port

RETRYING = "trying again until the store answers"
GAVE_UP = "the orphan scan will"


def _recover(retry_for: float, keep_trying: bool) -> tuple[int, int, int]:
    store = ValkeyStore(f"redis://127.0.0.1:{free_port()}", namespace="downed",
                        socket_timeout=1.0)
    recovery = Recovery(store, 3, 3600.0, retry_for=retry_for)

    async def main() -> tuple[int, int, int]:
        try:
            return await recovery.child_died("vm-1-dead", {"r1": 1}, {"exit": "signal SIGKILL"},
                                             keep_trying=lambda: keep_trying)
        finally:
            await store.aclose()

    return asyncio.run(main())


def test_a_recovery_the_store_refuses_is_tried_again_until_retry_for_passes(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=FLEET_LOGGER):
        outcome = _recover(retry_for=1.5, keep_trying=True)
    assert outcome == (0, 0, 0)
    text = caplog.text
    # Said once, when the first try failed; the release of the shards shares the window,
    # which the requeue's tries used up.
    assert text.count(RETRYING) == 1
    assert "could not requeue the runs of dead child vm-1-dead (" in text and GAVE_UP in text
    assert "could not release shards of vm-1-dead" in text


def test_a_draining_fleet_gives_up_on_the_first_refusal(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=FLEET_LOGGER):
        outcome = _recover(retry_for=60.0, keep_trying=False)  # returns, not in 60 s
    assert outcome == (0, 0, 0)
    assert RETRYING not in caplog.text
    assert GAVE_UP in caplog.text


@settings(max_examples=60, deadline=None)
@given(refusals=st.integers(0, 6), draining_after=st.one_of(st.none(), st.integers(1, 6)))
def test_a_call_is_tried_until_it_answers_or_the_fleet_drains(
        refusals: int, draining_after: int | None) -> None:
    """A call refused ``refusals`` times answers on the next try, unless the fleet began
    to drain after ``draining_after`` tries: then the last refusal is raised, at once."""
    recovery = Recovery(None, 3, 3600.0, retry_for=60.0)
    tries = 0

    async def call() -> str:
        nonlocal tries
        tries += 1
        if tries <= refusals:
            raise StoreUnavailable(f"refusal {tries}")
        return "answered"

    def keep_trying() -> bool:
        return draining_after is None or tries < draining_after

    async def main() -> str:
        return await recovery._until_answered(call, "answer", time.monotonic() + 60.0,
                                              keep_trying)

    with _quick_retries():
        if draining_after is not None and draining_after <= refusals:
            with pytest.raises(StoreUnavailable, match=f"refusal {draining_after}"):
                asyncio.run(main())
            assert tries == draining_after
        else:
            assert asyncio.run(main()) == "answered"
            assert tries == refusals + 1


@contextlib.contextmanager
def _quick_retries() -> Iterator[None]:
    """Retries after a millisecond or two instead of 0.25 s doubling to 2 s."""
    saved = recovery_module.RETRY_MIN, recovery_module.RETRY_MAX
    recovery_module.RETRY_MIN, recovery_module.RETRY_MAX = 0.001, 0.002
    try:
        yield
    finally:
        recovery_module.RETRY_MIN, recovery_module.RETRY_MAX = saved
