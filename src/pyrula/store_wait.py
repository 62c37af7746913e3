"""Waiting for a store that is not reachable yet when a worker starts.

With compose, systemd or a platform's release, the workers and their Valkey start together,
and the store may answer a few seconds after the workers: that is the same outage a running
worker tolerates (its loops retry; ``/readyz`` says ``store_unreachable``), so a starting
worker waits for it the same way instead of failing: one log line when the wait begins, one
when the store answers, retries with capped exponential backoff in between. A bound
(``WorkerOptions.store_wait``, ``--store-wait``, ``PYRULA_STORE_WAIT``) is for those who would
rather fail: past it the wait raises StoreUnavailable, one line naming the store. A store
that answers and refuses (a TLS certificate it cannot verify) is not waited for.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pyrula.errors import StoreUnavailable

logger = logging.getLogger(__name__)

#: The first retry's delay and the cap of the backoff (seconds).
FIRST_RETRY_S = 0.1
MAX_RETRY_S = 5.0


async def until_reachable(
    attempt: Callable[[], Awaitable[None]], *, where: str, bound: float | None,
    stopping: asyncio.Event, log: dict[str, Any],
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Call ``attempt`` until it does not raise StoreUnavailable; True once it succeeded,
    False if ``stopping`` was set meanwhile. Raises StoreUnavailable once the store has been
    unreachable for ``bound`` seconds (None: wait as long as it takes)."""
    began: float | None = None
    delay = FIRST_RETRY_S
    while True:
        try:
            await attempt()
        except StoreUnavailable as exc:
            if _refused(exc):
                raise
            now = clock()
            if began is None:
                began = now
                limit = "" if bound is None else f" (for at most {bound:g} s)"
                logger.warning("store_unreachable: %s does not answer: %s; waiting for it%s",
                               where, exc, limit,
                               extra={"event": "store_unreachable", "store": where, **log})
            if bound is not None and now - began >= bound:
                raise StoreUnavailable(
                    f"store {where} unreachable for {bound:g} s: {exc}") from None
            wait = delay if bound is None else max(0.0, min(delay, began + bound - now))
            try:
                await asyncio.wait_for(stopping.wait(), wait)
            except TimeoutError:
                delay = min(MAX_RETRY_S, delay * 2)
                continue
            return False
        if began is not None:
            logger.info("store_reachable: %s answers after %.1f s", where, clock() - began,
                        extra={"event": "store_reachable", "store": where, **log})
        return True


def _refused(exc: BaseException) -> bool:
    """Whether the store answered and refused (a TLS certificate it does not trust): a
    configuration to fix, not an outage to wait out."""
    seen: BaseException | None = exc
    for _ in range(10):  # the causes of the error, not an endless chain
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
