"""StoreClock: the store's server time, carried forward by the monotonic clock, so a worker
whose own wall clock is off or jumps still judges locks, leases and timers on the server's
timeline."""

from __future__ import annotations

import time

from pyrula.workflows.clock import ManualClock, StoreClock, store_clock
from pyrula.workflows.stores.memory import MemoryStore


async def test_it_reads_the_fallback_until_synced_then_the_servers_time_carried_on() -> None:
    server = [1_000_000.0]

    async def read() -> float:
        return server[0]

    clock = StoreClock(read, ManualClock(start=5.0))
    assert clock.now() == 5.0
    await clock.sync()
    first = clock.now()
    assert 1_000_000.0 <= first < 1_000_001.0
    # Between syncs it counts on with the monotonic clock, whatever the server says now.
    server[0] = 0.0
    later = time.monotonic() + 0.01
    while time.monotonic() < later:
        pass
    assert clock.now() >= first + 0.01
    await clock.sync()  # a sync follows the server, should its clock be stepped
    assert clock.now() < 1.0


def test_only_a_store_with_a_clock_of_its_own_gets_one() -> None:
    assert store_clock(MemoryStore()) is None

    class WithTime:
        async def server_time(self) -> float:
            return 1.0

    assert isinstance(store_clock(WithTime()), StoreClock)
