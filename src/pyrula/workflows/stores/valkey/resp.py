"""The wire under the Valkey store: RESP connections packed and parsed by hiredis.

A :class:`Link` is one connection to one server. Requests are pipelined: a caller writes
its packed commands and waits for as many replies, and replies come back in the order the
requests were written, so one connection per server carries every concurrent caller of an
event loop. (redis-py builds, checks out and parses a connection per command, which costs
a worker about three times the CPU of the hiredis calls themselves.)

Two kinds of link share one interface, ``await link.request(packed, count)``:

- :class:`AsyncLink`, an ``asyncio.Protocol`` for code on an event loop;
- :class:`SyncLink`, a blocking socket. Its ``request`` is a coroutine that never suspends,
  so the same ``async def`` store operation runs to completion on a plain thread when it is
  driven by ``send(None)`` (see ``pyrula.workflows._sync.drive``): one implementation of
  each operation, with no event loop and no thread hop behind a synchronous call.

Error replies are returned as :class:`ReplyError` values in place, never raised here; a
connection that fails raises :class:`ConnectFailed` (nothing was sent) or
:class:`LinkLost` (the request may or may not have run).

It stays one module over 400 lines: the two links share their parsing, pending-reply
queue and handshake, and split apart they would each import the other's internals.
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis

if TYPE_CHECKING:  # imported only for TLS URLs (ssl costs a process ~20 ms to import)
    import ssl

T = TypeVar("T")

#: Bytes read from a socket at a time.
_CHUNK = 1 << 16


class ReplyError(Exception):
    """An error reply from the server; ``str()`` is its text (``MOVED 3999 host:6379``)."""

    @property
    def code(self) -> str:
        text = str(self)
        return text.split(" ", 1)[0] if text else ""


class ConnectFailed(ConnectionError):
    """No connection could be made: nothing was sent, so a retry cannot run anything twice."""


class LinkLost(ConnectionError):
    """The connection failed after a request was written: it may or may not have run."""


Command = Sequence[str | bytes | int | float]


def pack(commands: Sequence[Command]) -> bytes:
    """The RESP bytes of ``commands``, to be written in one go."""
    pack_command: Callable[[tuple[Any, ...]], bytes] = hiredis.pack_command
    if len(commands) == 1:
        return pack_command(tuple(commands[0]))
    return b"".join(pack_command(tuple(c)) for c in commands)


def _reader() -> hiredis.Reader:
    # Bytes that are not UTF-8 (only ever written behind the store's back) decode to lone
    # surrogates rather than failing the whole reply stream: whoever parses that value as
    # JSON then finds it is not, and says which value it was.
    return hiredis.Reader(replyError=ReplyError, encoding="utf-8", errors="surrogateescape")


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class Durability(StrEnum):
    """When a write counts as done."""

    #: When the primary has it (replicas get it a moment later: a primary that dies in
    #: that moment, its replica promoted, takes the write with it).
    ASYNC = "async"
    #: When one replica has it too (``WAIT 1`` after the write, on its connection).
    REPLICATED = "replicated"


#: How long a write waits for a replica under ``durability=replicated``, by default.
REPLICA_TIMEOUT = 2.0


@dataclass(frozen=True)
class LinkOptions:
    """How to open and talk to every server of one store."""

    username: str | None = None
    password: str | None = None
    db: int = 0
    tls: ssl.SSLContext | None = None
    check_hostname: bool = True
    timeout: float = 10.0
    durability: Durability = Durability.ASYNC
    #: Seconds a write waits for its replica (``replicated``); less than ``timeout``.
    replica_timeout: float = REPLICA_TIMEOUT

    def handshake(self) -> list[Command]:
        """Commands every new connection sends first."""
        commands: list[Command] = []
        if self.password is not None:
            commands.append(("AUTH", self.username, self.password) if self.username
                            else ("AUTH", self.password))
        if self.db:
            commands.append(("SELECT", self.db))
        return commands


#: The query options a store URL may carry.
URL_OPTIONS = frozenset({"db", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs",
                         "ssl_check_hostname", "durability", "replica_timeout"})
_CERT_REQS = ("none", "cert_none", "optional", "cert_optional", "required", "cert_required")


def parse_url(url: str, timeout: float) -> tuple[Endpoint, LinkOptions]:
    """``redis[s]://[user[:password]@]host[:port][/db][?ssl_cert_reqs=..&ssl_ca_certs=..]``,
    with ``durability=async|replicated`` and ``replica_timeout=<seconds>`` among the
    options."""
    parts = urlsplit(url)
    tls = parts.scheme in ("rediss", "valkeys")
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = sorted(set(query) - URL_OPTIONS)
    if unknown:
        raise ValueError(f"unknown query option {unknown[0]!r} (known: "
                         f"{', '.join(sorted(URL_OPTIONS))})")
    if not parts.hostname:
        raise ValueError("no host (redis://host:port)")
    port = parts.port  # raises ValueError for a port that is not 0..65535
    if port == 0:
        raise ValueError("port 0 is not a server's port")
    db_text = (parts.path or "/").lstrip("/") or query.get("db", "0")
    if not db_text.isdigit():
        raise ValueError(f"database {db_text!r} in the URL is not a number")
    check = query.get("ssl_check_hostname", "true").lower()
    if check not in ("true", "false", "1", "0"):
        raise ValueError(f"ssl_check_hostname={check!r} is not true or false")
    context = _tls_context(query) if tls else None
    durability, replica_timeout = parse_durability(
        query.get("durability"), query.get("replica_timeout"), timeout)
    password = unquote(parts.password) if parts.password is not None else None
    username = unquote(parts.username) if parts.username else None
    if password is None and username is not None:  # redis://:secret@ reads as a password
        password, username = username, None
    options = LinkOptions(
        username=username or None, password=password, db=int(db_text), tls=context,
        check_hostname=check in ("true", "1"),
        timeout=timeout, durability=durability, replica_timeout=replica_timeout,
    )
    return Endpoint(parts.hostname, port or 6379), options


def parse_durability(durability: object, replica_timeout: object, timeout: float
                     ) -> tuple[Durability, float]:
    """The durability and replica timeout a URL or a constructor names (None: the
    defaults); ValueError naming the option for a bad value. The replica timeout must be
    shorter than the socket timeout ``timeout``: a write waiting for its replica must
    not look like a server that stopped answering."""
    if durability is None:
        chosen = Durability.ASYNC
    elif isinstance(durability, str) and durability.lower() in tuple(Durability):
        chosen = Durability(durability.lower())
    else:
        raise ValueError(f"durability={durability!r} is not one of "
                         f"{', '.join(Durability)}")
    if replica_timeout is None:
        seconds = min(REPLICA_TIMEOUT, timeout / 2)
    else:
        try:
            seconds = float(replica_timeout)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            seconds = -1.0
        if isinstance(replica_timeout, bool) or not 0 < seconds < timeout:
            raise ValueError(f"replica_timeout={replica_timeout!r} is not a number of "
                             f"seconds above 0 and below the socket timeout ({timeout} s)")
    return chosen, seconds


def _tls_context(query: dict[str, str]) -> ssl.SSLContext:
    import ssl

    reqs = query.get("ssl_cert_reqs", "required").lower()
    if reqs not in _CERT_REQS:
        raise ValueError(f"ssl_cert_reqs={reqs!r} is not one of none, optional, required")
    try:
        context = ssl.create_default_context(cafile=query.get("ssl_ca_certs"))
        if "ssl_certfile" in query:
            context.load_cert_chain(query["ssl_certfile"], query.get("ssl_keyfile"))
    except (OSError, ssl.SSLError) as exc:  # a missing or unreadable file, not PEM
        raise ValueError(f"cannot load the TLS files it names: {exc}") from None
    if reqs in ("none", "cert_none"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif reqs in ("optional", "cert_optional"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_OPTIONAL
    elif query.get("ssl_check_hostname", "true").lower() in ("false", "0"):
        context.check_hostname = False  # verify the chain, not the name
    return context


class Link(Protocol):
    @property
    def alive(self) -> bool:
        """Open, and not found closed by the server (which may cost a system call)."""
        ...

    @property
    def closed(self) -> bool:
        """Closed on our side (after a failure, or by ``close``): free to ask."""
        ...

    async def request(self, packed: bytes, count: int, timeout: float | None = None,
                      wait: Command | None = None) -> list[Any]:
        """The ``count`` replies of ``packed``; with ``wait`` (``WAIT n ms``), WAIT sent
        after it on this connection and its reply appended. Requests written together may
        share one WAIT: it covers every write before it on the connection."""
        ...

    def close(self) -> None: ...


# --- asyncio ------------------------------------------------------------------------


@dataclass(slots=True)
class _Pending:
    #: None for a WAIT shared by ``waiters`` (nobody awaits it itself).
    future: asyncio.Future[list[Any]] | None
    count: int
    deadline: float
    replies: list[Any] = field(default_factory=list)
    #: Its result waits for the WAIT written after it (its replies alone are not enough).
    held: bool = False
    #: The requests this WAIT's reply completes.
    waiters: list[_Pending] = field(default_factory=list)


class AsyncLink(asyncio.Protocol):
    """One pipelined connection on one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, where: Endpoint, timeout: float) -> None:
        self._loop = loop
        self._where = where
        self._timeout = timeout
        self._reader = _reader()
        self._pending: deque[_Pending] = deque()
        self._transport: asyncio.Transport | None = None
        self._lost: BaseException | None = None
        self._watch: asyncio.TimerHandle | None = None
        # Requests written in one turn of the loop go out in one send (see request).
        self._out: list[bytes] = []
        # Requests of this turn that asked for a WAIT, and the WAIT they asked for.
        self._waiters: list[_Pending] = []
        self._wait: Command | None = None

    @classmethod
    async def open(cls, where: Endpoint, options: LinkOptions) -> AsyncLink:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(options.timeout):
                _, link = await loop.create_connection(
                    lambda: cls(loop, where, options.timeout), where.host, where.port,
                    ssl=options.tls,
                    server_hostname=(where.host if options.tls and options.check_hostname
                                     else ("" if options.tls else None)),
                )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            raise ConnectFailed(f"cannot connect to {where}: {exc or type(exc).__name__}"
                                ) from exc
        await _handshake_or_close(link, options, where)
        return link

    # protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass).
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        try:
            reader.feed(data)
            pending = self._pending
            while True:
                reply = reader.gets()
                if reply is False:
                    return
                if not pending:
                    raise hiredis.ProtocolError("a reply came with no request waiting")
                head = pending[0]
                head.replies.append(reply)
                if len(head.replies) == head.count:
                    pending.popleft()
                    if not head.held:
                        _resolve(head, head.replies)
                    for waiter in head.waiters:  # a WAIT: its reply ends each of them
                        _resolve(waiter, [*waiter.replies, reply])
        except hiredis.ProtocolError as exc:
            self._fail(LinkLost(f"{self._where} sent what is not RESP: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(LinkLost(f"connection to {self._where} lost"
                            + (f": {exc}" if exc else " (closed by the server)")))

    # requests

    @property
    def alive(self) -> bool:
        return self._lost is None and self._transport is not None

    @property
    def closed(self) -> bool:
        return not self.alive

    async def request(self, packed: bytes, count: int, timeout: float | None = None,
                      wait: Command | None = None) -> list[Any]:
        if self._lost is not None or self._transport is None:
            raise LinkLost(str(self._lost or f"connection to {self._where} is closed"))
        future: asyncio.Future[list[Any]] = self._loop.create_future()
        seconds = self._timeout if timeout is None else timeout
        request = _Pending(future, count, time.monotonic() + seconds, held=wait is not None)
        self._pending.append(request)
        # Corked until the end of this turn of the loop: the requests of every coroutine
        # that runs in it (a worker finishing many runs at once) share one send and one
        # read on the server. Replies still come back in the order of _pending.
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(packed)
        if wait is not None:
            # One WAIT after every request of this turn that asked for one: the server
            # serves a connection's commands in order and a WAIT blocks the ones behind
            # it, so a WAIT each would cost a replica round trip per request, one after
            # the other; one WAIT covers them all, for one round trip per send.
            self._waiters.append(request)
            self._wait = wait
        if self._watch is None:
            self._arm()
        return await future

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self._waiters and self._wait is not None:
            waiters, self._waiters = self._waiters, []
            self._pending.append(_Pending(None, 1, max(w.deadline for w in waiters),
                                          waiters=waiters))
            out.append(pack([self._wait]))
        if self._transport is not None and self._lost is None and out:
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self._fail(LinkLost(f"connection to {self._where} closed"))

    # failure and timeouts

    def _fail(self, error: BaseException) -> None:
        if self._lost is None:
            self._lost = error
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        # A request whose own replies came is no longer pending, but still waits for
        # its WAIT: it fails with the WAIT.
        failed = [*self._waiters, *self._pending]
        failed += [w for p in self._pending for w in p.waiters]
        self._pending.clear()
        self._waiters = []
        for waiter in failed:
            if waiter.future is not None and not waiter.future.done():
                waiter.future.set_exception(LinkLost(str(self._lost)))
        if self._transport is not None and not self._transport.is_closing():
            self._transport.abort()

    def _arm(self) -> None:
        # One timer a connection, checked every quarter timeout, rather than a timer per
        # request: the oldest request waiting past its deadline ends the connection.
        self._watch = self._loop.call_later(max(self._timeout / 4, 0.05), self._check)

    def _check(self) -> None:
        self._watch = None
        if not self._pending:
            return
        if self._pending[0].deadline < time.monotonic():
            self._fail(LinkLost(f"{self._where} did not answer within the timeout"))
            return
        self._arm()


def _resolve(request: _Pending, replies: list[Any]) -> None:
    if request.future is not None and not request.future.done():
        request.future.set_result(replies)


async def _handshake_or_close(link: Link, options: LinkOptions, where: Endpoint) -> None:
    """``_handshake``, closing the connection if it fails (a server dying just after the
    connect, a refused password): a link nobody holds is closed here, not left to the
    garbage collector, which may reach its socket first and find it open."""
    try:
        await _handshake(link, options, where)
    except BaseException:
        link.close()
        raise


async def _handshake(link: Link, options: LinkOptions, where: Endpoint) -> None:
    hello = options.handshake()
    if not hello:
        return
    try:
        replies = await link.request(pack(hello), len(hello))
    except LinkLost as exc:
        raise ConnectFailed(str(exc)) from exc
    for reply in replies:
        if isinstance(reply, ReplyError):
            link.close()
            raise reply


# --- blocking sockets ---------------------------------------------------------------


def _close_socket(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


class SyncLink:
    """One blocking connection, for a synchronous caller on one thread."""

    def __init__(self, sock: socket.socket, where: Endpoint, timeout: float, *,
                 kernel_timeouts: bool = False) -> None:
        self._sock: socket.socket | None = sock
        self._where = where
        self._timeout = timeout
        self._reader = _reader()
        #: A plain TCP socket is kept blocking, its timeout set in the kernel
        #: (SO_RCVTIMEO, SO_SNDTIMEO) when it changes: a request is then one send and one
        #: receive. Python's own timeouts make a socket non-blocking and poll before every
        #: send and receive, and setting one is a syscall too: five calls for one round
        #: trip instead of two. (TLS keeps Python's timeouts.)
        self._kernel_timeouts = kernel_timeouts
        self._armed: float | None = None
        if kernel_timeouts:
            sock.settimeout(None)
        # A thread's link goes with the thread (its thread-local router is dropped then),
        # sometimes inside a reference cycle (an exception's frames holding it), which the
        # collector frees in no set order: a ``__del__`` here could run after the socket's
        # own finalizer had found it open. A finalizer holds the socket until this link is
        # gone and closes it first.
        self._closer = weakref.finalize(self, _close_socket, sock)

    @classmethod
    def open_now(cls, where: Endpoint, options: LinkOptions) -> SyncLink:
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection((where.host, where.port), timeout=options.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if options.tls is not None:
                sock = options.tls.wrap_socket(
                    sock, server_hostname=where.host if options.check_hostname else None
                )
        except OSError as exc:  # ssl.SSLError is an OSError
            if sock is not None:  # connected, then refused (a server dying, a TLS failure)
                sock.close()
            raise ConnectFailed(f"cannot connect to {where}: {exc or type(exc).__name__}"
                                ) from exc
        return cls(sock, where, options.timeout, kernel_timeouts=options.tls is None)

    @classmethod
    async def open(cls, where: Endpoint, options: LinkOptions) -> SyncLink:
        link = cls.open_now(where, options)
        await _handshake_or_close(link, options, where)
        return link

    @property
    def closed(self) -> bool:
        return self._sock is None

    @property
    def alive(self) -> bool:
        """False once closed, and once the server has closed the idle connection (it
        restarted, or dropped the client): a request is then sent on a new connection
        instead of failing as if the server had been lost under it. (An asyncio link
        learns of that from its loop; a blocking socket only when it reads.)"""
        sock = self._sock
        if sock is None:
            return False
        # Between requests nothing is owed to us: a readable socket is one the server
        # closed (or one holding bytes no request asked for), either way not to be used.
        poll = select.poll()
        try:
            poll.register(sock, select.POLLIN)
            if not poll.poll(0):
                return True
        except (OSError, ValueError):
            pass
        self.close()
        return False

    async def request(self, packed: bytes, count: int, timeout: float | None = None,
                      wait: Command | None = None) -> list[Any]:
        if wait is not None:  # one caller at a time: its own WAIT, in the same send
            return self.request_now(packed + pack([wait]), count + 1, timeout)
        return self.request_now(packed, count, timeout)

    def request_now(self, packed: bytes, count: int, timeout: float | None = None
                    ) -> list[Any]:
        sock = self._sock
        if sock is None:
            raise LinkLost(f"connection to {self._where} is closed")
        reader = self._reader
        replies: list[Any] = []
        try:
            self._arm(sock, self._timeout if timeout is None else timeout)
            sock.sendall(packed)
            while len(replies) < count:
                reply = reader.gets()
                if reply is False:
                    data = sock.recv(_CHUNK)
                    if not data:
                        raise LinkLost(f"connection to {self._where} closed by the server")
                    reader.feed(data)
                    continue
                replies.append(reply)
        except LinkLost:
            self.close()
            raise
        except (OSError, hiredis.ProtocolError) as exc:
            self.close()
            raise LinkLost(f"connection to {self._where} failed: {exc or type(exc).__name__}"
                           ) from exc
        except BaseException:
            # Interrupted (Ctrl-C) between the send and the last reply: the replies still
            # owed would answer the next request, so the connection is not used again.
            self.close()
            raise
        return replies

    def _arm(self, sock: socket.socket, timeout: float | None) -> None:
        """Give ``sock`` this timeout for each send and receive (None: none)."""
        if not self._kernel_timeouts:
            sock.settimeout(timeout)
            return
        if timeout is not None and timeout <= 0:  # Python's own meaning: non-blocking
            sock.settimeout(timeout)
            self._armed = _PYTHON_TIMEOUT
            return
        if timeout == self._armed:
            return
        if self._armed == _PYTHON_TIMEOUT:
            sock.settimeout(None)  # blocking again, the kernel's timeout below
        value = _timeval(timeout)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        self._armed = timeout

    def close(self) -> None:
        self._sock = None
        self._closer()  # closes the socket, once


#: ``SyncLink._armed`` when the socket holds a timeout of Python's (non-blocking) instead.
_PYTHON_TIMEOUT = -1.0


def _timeval(seconds: float | None) -> bytes:
    """A ``struct timeval`` for SO_RCVTIMEO / SO_SNDTIMEO: zero is no timeout."""
    if seconds is None:
        return struct.pack("ll", 0, 0)
    whole = int(seconds)
    micros = round((seconds - whole) * 1_000_000)
    if micros >= 1_000_000:
        whole, micros = whole + 1, 0
    if whole == 0 and micros == 0:
        micros = 1  # a positive timeout stays one (zero would be none)
    return struct.pack("ll", whole, micros)


# --- the I/O a router runs on -------------------------------------------------------


class LinkIO(Protocol):
    """What a router needs of its surroundings: open links, sleep, run calls together."""

    blocking_shares: bool
    """True if a blocking command may use the shared link (a synchronous caller)."""

    async def open(self, where: Endpoint, options: LinkOptions) -> Link: ...

    async def sleep(self, seconds: float) -> None: ...

    async def gather(self, calls: Sequence[Awaitable[T]]) -> list[T]: ...

    async def once(self, key: Any, make: Callable[[], Awaitable[T]]) -> T: ...


class AsyncIO:
    """Links on the running event loop; concurrent callers share one connect."""

    blocking_shares = False

    def __init__(self) -> None:
        self._opening: dict[Any, asyncio.Future[Any]] = {}

    async def open(self, where: Endpoint, options: LinkOptions) -> Link:
        return await AsyncLink.open(where, options)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def gather(self, calls: Sequence[Awaitable[T]]) -> list[T]:
        if len(calls) == 1:
            return [await calls[0]]
        return list(await asyncio.gather(*calls))

    async def once(self, key: Any, make: Callable[[], Awaitable[T]]) -> T:
        running = self._opening.get(key)
        if running is not None:
            result: T = await asyncio.shield(running)
            return result
        future: asyncio.Future[Any] = asyncio.ensure_future(make())
        self._opening[key] = future
        try:
            return await asyncio.shield(future)
        finally:
            if future.done():
                self._opening.pop(key, None)
                if not future.cancelled():
                    future.exception()  # retrieved here: the waiters above re-raise it
            else:
                future.add_done_callback(lambda done: self._forget(key, done))

    def _forget(self, key: Any, done: asyncio.Future[Any]) -> None:
        self._opening.pop(key, None)
        if not done.cancelled():
            done.exception()  # nobody waits any more: the error is not worth a warning


class SyncIO:
    """Blocking links for one thread; nothing here ever suspends."""

    blocking_shares = True

    async def open(self, where: Endpoint, options: LinkOptions) -> Link:
        return await SyncLink.open(where, options)

    async def sleep(self, seconds: float) -> None:
        time.sleep(seconds)  # noqa: ASYNC251 - a synchronous caller's thread, no loop

    async def gather(self, calls: Sequence[Awaitable[T]]) -> list[T]:
        return [await call for call in calls]

    async def once(self, key: Any, make: Callable[[], Awaitable[T]]) -> T:
        return await make()
