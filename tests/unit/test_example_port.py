"""The port ``make run`` serves the example fleet's health port on: the fleet's default
when it is free, so that the README's ``curl localhost:8081/metrics`` reaches it; else
a free one (which its first lines print). Ports here are the OS's, never a fixed one."""

from __future__ import annotations

import socket

from pyrula.examples.__main__ import health_port


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_preferred_port_is_used_when_it_is_free() -> None:
    port = _unused_port()
    assert health_port(port) == port


def test_another_port_is_chosen_when_the_preferred_one_is_taken() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = int(taken.getsockname()[1])
        chosen = health_port(busy)
    assert chosen != busy and 0 < chosen < 65536
