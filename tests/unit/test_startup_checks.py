"""What is checked before a worker or a fleet serves, as pure functions: how many children
the host can hold (``supervisor.capacity``) and the wait for a store that does not answer
yet (``pyrula.store_wait``)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pyrula.config.parse import MIB
from pyrula.errors import StoreUnavailable
from pyrula.store_wait import until_reachable
from pyrula.supervisor.capacity import BYTES_PER_CHILD, HostRoom, refusal


@pytest.mark.parametrize(("children", "room", "says"), [
    (4, HostRoom(tasks=None, memory=None), None),
    (10, HostRoom(tasks=None, memory=10 * BYTES_PER_CHILD), None),
    (11, HostRoom(tasks=None, memory=10 * BYTES_PER_CHILD),
     f"-n 11: this host can hold about 10 children ({10 * BYTES_PER_CHILD // MIB} MiB"),
    (3, HostRoom(tasks=8, memory=None), None),
    (4, HostRoom(tasks=8, memory=None), "-n 4: this host can start about 3 children (the "
     "process limit, ulimit -u, leaves 8 tasks"),
    (1, HostRoom(tasks=0, memory=None), "-n 1: this host can start about 0 children"),
])
def test_a_fleet_the_host_cannot_hold_is_refused_in_one_line(
    children: int, room: HostRoom, says: str | None
) -> None:
    found = refusal("-n", children, room)
    if says is None:
        assert found is None
    else:
        assert found is not None and found.startswith(says), found
        assert "\n" not in found


class Store:
    """Unreachable for the first ``down`` calls."""

    def __init__(self, down: int) -> None:
        self.down = down
        self.calls = 0

    async def ping(self) -> None:
        self.calls += 1
        if self.calls <= self.down:
            raise StoreUnavailable(f"refused #{self.calls}")


async def test_a_store_that_answers_late_is_waited_for_with_one_line_each_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Store(down=4)
    with caplog.at_level(logging.INFO, logger="pyrula.store_wait"):
        assert await until_reachable(store.ping, where="redis://h:1", bound=None,
                                     stopping=asyncio.Event(), log={})
    assert store.calls == 5
    events = [r.getMessage() for r in caplog.records]
    assert len(events) == 2, events
    assert events[0].startswith("store_unreachable: redis://h:1 does not answer: refused #1")
    assert events[1].startswith("store_reachable: redis://h:1 answers after")


async def test_a_bounded_wait_fails_naming_the_store_and_the_bound() -> None:
    with pytest.raises(StoreUnavailable, match=r"^store redis://h:1 unreachable for 0.2 s: "
                       r"refused #\d+$"):
        await until_reachable(Store(down=10**6).ping, where="redis://h:1", bound=0.2,
                              stopping=asyncio.Event(), log={})


async def test_a_stop_during_the_wait_ends_it() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, stop.set)
    assert not await until_reachable(Store(down=10**6).ping, where="x", bound=None,
                                     stopping=stop, log={})
