"""A synchronous link's socket: blocking, its timeout kept by the kernel (SO_RCVTIMEO and
SO_SNDTIMEO), whatever timeouts its requests ask for in turn."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyrula.workflows.stores.valkey.resp import Endpoint, SyncLink, _timeval

TIMEOUTS = st.one_of(st.none(), st.floats(0.000_000_1, 3600.0), st.just(0.0))


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    try:
        yield ours, theirs
    finally:
        ours.close()
        theirs.close()


def _kernel_timeout(sock: socket.socket) -> float:
    sec, usec = struct.unpack("ll", sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16))
    return sec + usec / 1_000_000


@given(seconds=st.floats(0.000_000_1, 10_000.0))
def test_a_timeval_is_the_timeout_to_the_microsecond_and_never_none(seconds: float) -> None:
    sec, usec = struct.unpack("ll", _timeval(seconds))
    assert 0 <= usec < 1_000_000
    assert (sec, usec) != (0, 0)  # zero would be no timeout at all
    assert abs(sec + usec / 1_000_000 - seconds) <= 1e-6 or (sec, usec) == (0, 1)


def test_no_timeout_is_a_zero_timeval() -> None:
    assert struct.unpack("ll", _timeval(None)) == (0, 0)


@settings(max_examples=50)
@given(timeouts=st.lists(TIMEOUTS, min_size=1, max_size=8))
def test_any_run_of_request_timeouts_leaves_the_socket_as_the_last_one_asks(
    timeouts: list[float | None],
) -> None:
    ours, theirs = socket.socketpair()
    try:
        link = SyncLink(ours, Endpoint("test", 0), 10.0, kernel_timeouts=True)
        for timeout in timeouts:
            link._arm(ours, timeout)
        last = timeouts[-1]
        if last is not None and last <= 0:
            assert ours.gettimeout() == last  # Python's meaning: non-blocking
        else:
            assert ours.gettimeout() is None  # blocking: one syscall a send or receive
            got = _kernel_timeout(ours)
            if last is None:
                assert got == 0.0  # no timeout
            else:  # the kernel keeps it in its own ticks (a few ms at most), never zero
                assert got > 0 and abs(got - last) <= 0.011, (last, got)
        link.close()
    finally:
        theirs.close()


def test_a_reply_that_never_comes_fails_after_the_kernel_timeout(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, _theirs = pair
    link = SyncLink(ours, Endpoint("test", 0), 0.05, kernel_timeouts=True)
    with pytest.raises(Exception, match="connection to test:0 failed"):
        link.request_now(b"*1\r\n$4\r\nPING\r\n", 1)


def test_a_request_interrupted_before_its_reply_closes_the_link(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """Ctrl-C while a reply is owed: the reply would answer the next request instead, so
    the link is closed and a new one is opened for the next request."""
    import signal

    ours, _theirs = pair
    link = SyncLink(ours, Endpoint("test", 0), 10.0, kernel_timeouts=True)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(KeyboardInterrupt):
            link.request_now(b"*1\r\n$4\r\nPING\r\n", 1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert link.closed and not link.alive
    with pytest.raises(Exception, match="is closed"):
        link.request_now(b"*1\r\n$4\r\nPING\r\n", 1)
