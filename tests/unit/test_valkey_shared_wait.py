"""The WAIT of ``durability="replicated"`` on one pipelined connection: the requests of
one send share one WAIT written after them all, each gets its reply, and a connection
lost before the WAIT answers fails every request it was to complete."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula.workflows.stores.valkey.resp import AsyncLink, Endpoint, LinkLost, pack

WAIT = ("WAIT", 1, 100)


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _link() -> tuple[AsyncLink, Transport]:
    link = AsyncLink(asyncio.get_running_loop(), Endpoint("h", 1), timeout=5.0)
    transport = Transport()
    link.connection_made(transport)
    return link, transport


async def _sent(transport: Transport) -> bytes:
    await asyncio.sleep(0)  # the turn of the loop that flushes the corked requests
    await asyncio.sleep(0)
    return b"".join(transport.written)


async def test_requests_sent_together_share_one_wait_after_them() -> None:
    link, transport = _link()
    first = asyncio.ensure_future(link.request(pack([("SET", "a", 1)]), 1, wait=WAIT))
    plain = asyncio.ensure_future(link.request(pack([("GET", "a")]), 1))
    second = asyncio.ensure_future(link.request(pack([("SET", "b", 2), ("SET", "c", 3)]), 2,
                                                wait=WAIT))
    assert await _sent(transport) == pack([("SET", "a", 1), ("GET", "a"), ("SET", "b", 2),
                                           ("SET", "c", 3), WAIT])
    link.data_received(b"+OK\r\n$1\r\n1\r\n+OK\r\n")
    await asyncio.sleep(0)
    assert plain.done() and plain.result() == ["1"]
    assert not first.done()  # its reply came, the WAIT's not yet
    link.data_received(b"+OK\r\n:1\r\n")
    assert await first == ["OK", 1]
    assert await second == ["OK", "OK", 1]


async def test_each_send_gets_its_own_wait() -> None:
    link, transport = _link()
    first = asyncio.ensure_future(link.request(pack([("SET", "a", 1)]), 1, wait=WAIT))
    await _sent(transport)
    second = asyncio.ensure_future(link.request(pack([("SET", "b", 1)]), 1, wait=WAIT))
    assert await _sent(transport) == pack([("SET", "a", 1), WAIT, ("SET", "b", 1), WAIT])
    link.data_received(b"+OK\r\n:0\r\n+OK\r\n:1\r\n")
    assert await first == ["OK", 0]
    assert await second == ["OK", 1]


async def test_a_connection_lost_before_the_wait_answers_fails_its_requests() -> None:
    link, transport = _link()
    answered = asyncio.ensure_future(link.request(pack([("SET", "a", 1)]), 1, wait=WAIT))
    await _sent(transport)
    link.data_received(b"+OK\r\n")  # the write's reply; its WAIT still blocks
    await asyncio.sleep(0)
    assert not answered.done()
    link.connection_lost(ConnectionResetError("gone"))
    with pytest.raises(LinkLost):
        await answered
