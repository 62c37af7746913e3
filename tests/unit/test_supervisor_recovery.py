"""The supervisor's recovery of a dead child when the store does not answer: it tries
again until ``retry_for`` has passed, and not at all once the fleet drains.

The store is a real Valkey store pointed at a port nobody listens on: every call fails
with StoreUnavailable (after the client's own connect retries), as during a server
restart."""

from __future__ import annotations

import asyncio
import logging

import pytest

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
