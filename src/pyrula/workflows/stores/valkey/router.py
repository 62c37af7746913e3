"""Which server a command goes to: one server, or the node of a cluster that owns its slot.

:class:`Router` sends batches of commands over pipelined links (``resp.py``) and returns
one reply per command, in order, error replies in place. On a cluster it groups a batch by
node, sends the groups together, and follows the cluster through a failover or a reshard:

- ``MOVED`` updates the slot's owner and sends the command again (it did not run);
- ``ASK`` sends it once to the named node behind ``ASKING`` (it did not run);
- ``TRYAGAIN``, ``CLUSTERDOWN``, ``LOADING``, ``MASTERDOWN``, ``READONLY`` and a blocking
  call ``UNBLOCKED`` by a role change did not run either: the slot map is read again and
  the command re-sent with a short backoff, for up to the store's timeout;
- a node that refuses connections (nothing was sent) is handled the same way;
- a connection lost after a write was sent leaves its outcome unknown: a read is sent
  again, a write is reported as the store being unavailable, never sent twice.

Under ``durability=replicated`` every request that may write is followed by ``WAIT 1
<ms>`` on the connection that carried it (one server's, or one node's group; requests
sent together share one, see ``resp.AsyncLink.request``): WAIT counts the writes of its
own connection, so it covers every write before it. A write it finds no replica
acknowledged is reported as the store being unavailable, its outcome unknown (see
:func:`_replicated`).

Every failure of the transport reaches the caller as ``StoreUnavailable`` (or, for bad
credentials, ``ConfigurationError``), never as an error of the client library.

It stays one module over 400 lines: the slot map, the redirects and the retries are one
state machine over one set of links, which reads best in one place.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pyrula.errors import ConfigurationError, StoreUnavailable
from pyrula.workflows.stores.valkey.resp import (
    Command,
    ConnectFailed,
    Durability,
    Endpoint,
    Link,
    LinkIO,
    LinkLost,
    LinkOptions,
    ReplyError,
    pack,
)

SLOTS = 16384

#: Error replies of commands that did not run because the cluster is changing.
_SETTLING = frozenset({"TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN", "READONLY",
                       "UNBLOCKED"})
_CREDENTIALS = ("WRONGPASS", "NOAUTH", "NOPERM", "ERR AUTH", "ERR invalid password")
#: Rounds of redirects and retries one batch may take before it gives up.
_MAX_ROUNDS = 64
#: Idle blocking connections kept per node (more are closed when they come back).
_IDLE_BLOCKING = 32


def _crc16_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


_CRC16 = _crc16_table()


def key_slot(key: str) -> int:
    """The cluster slot of ``key``: CRC16 of its hash tag (``{...}``) or of the whole key."""
    data = key.encode()
    start = data.find(b"{")
    if start != -1:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1:end]
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[((crc >> 8) ^ byte) & 0xFF]
    return crc % SLOTS


class ClusterMode:
    """Whether the server is a cluster: given, or read once from INFO and shared by every
    router of one store."""

    def __init__(self, cluster: bool | None) -> None:
        self.cluster = cluster


class Router:
    """Routes commands of one store on one event loop (or one thread, with SyncIO)."""

    def __init__(self, io: LinkIO, seed: Endpoint, options: LinkOptions, mode: ClusterMode,
                 *, max_blocking: int = 256) -> None:
        self._io = io
        self._seed = seed
        self._options = options
        self._mode = mode
        self._links: dict[Endpoint, Link] = {}
        self._slots: list[Endpoint] | None = None
        self._slot_of: dict[str, int] = {}
        self._idle: dict[Endpoint, list[Link]] = {}
        self._max_blocking = max_blocking
        self._blocking_slots: asyncio.Semaphore | None = None
        #: What ends a request that may write: ``WAIT 1 <ms>`` (replicated), or nothing.
        self._wait: Command | None = (
            ("WAIT", 1, max(1, round(options.replica_timeout * 1000)))
            if options.durability is Durability.REPLICATED else None)
        self.closed = False

    async def is_cluster(self) -> bool:
        """Whether the server is a cluster (read from INFO on the first call, if not given)."""
        if self._mode.cluster is None:
            await self._detect()
        return bool(self._mode.cluster)

    def where(self) -> str:
        return str(self._seed)

    # --- sending ----------------------------------------------------------------------

    async def execute(self, commands: Sequence[Command], keys: Sequence[str | None],
                      *, idempotent: bool = False) -> list[Any]:
        """One reply per command, in order; error replies (ReplyError) in place.

        ``keys[i]`` routes command ``i`` on a cluster (None: any node). Raises
        StoreUnavailable when the server cannot be reached or a write's outcome is unknown.
        """
        if self._mode.cluster is None:
            await self._detect()
        wait = None if idempotent else self._wait
        if not self._mode.cluster:
            return await self._standalone(commands, idempotent, wait)
        return await self._clustered(commands, keys, idempotent, wait)

    async def call(self, key: str | None, *command: str | bytes | int | float,
                   idempotent: bool = False) -> Any:
        """One command; its reply (an error reply is returned, not raised)."""
        return (await self.execute([command], [key], idempotent=idempotent))[0]

    async def blocking(self, key: str, commands: Sequence[Command], block: float) -> list[Any]:
        """A blocking command (``commands[0]``, blocking up to ``block`` seconds) and the
        commands that follow it on the same connection, on a connection of its own."""
        if self._mode.cluster is None:
            await self._detect()
        packed = pack(commands)
        deadline = time.monotonic() + self._options.timeout
        delay = 0.025
        while True:
            where = self._seed if not self._mode.cluster else await self._node(key)
            try:
                replies = await self._blocking_on(where, packed, len(commands),
                                                  block + self._options.timeout)
            except ConnectFailed as exc:
                if not self._mode.cluster or time.monotonic() > deadline:
                    raise self._unavailable(where, exc) from exc
                replies = None
            except LinkLost as exc:  # a blocking read sent again pops at most a wake token
                if time.monotonic() > deadline:
                    raise self._unavailable(where, exc) from exc
                replies = None
            if replies is not None:
                first = replies[0]
                if not (self._mode.cluster and isinstance(first, ReplyError)
                        and (first.code in _SETTLING or first.code in ("MOVED", "ASK"))):
                    return replies
                if first.code == "MOVED":
                    self._moved(first)
                    continue
                if time.monotonic() > deadline:
                    return replies
            if self._mode.cluster:
                await self._refresh()
            await self._io.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def each_primary(self, command: Command) -> list[tuple[Endpoint, Any]]:
        """``command`` on the server, or on every primary of a cluster."""
        if self._mode.cluster is None:
            await self._detect()
        if not self._mode.cluster:
            return [(self._seed, (await self._standalone([command], True))[0])]
        if self._slots is None:
            await self._refresh()
        assert self._slots is not None
        primaries = sorted(set(self._slots), key=str)

        async def one(where: Endpoint) -> tuple[Endpoint, Any]:
            try:
                link = await self._link(where)
                return where, (await link.request(pack([command]), 1))[0]
            except (ConnectFailed, LinkLost) as exc:
                raise self._unavailable(where, exc) from exc

        return await self._io.gather([one(p) for p in primaries])

    # --- one server -------------------------------------------------------------------

    async def _standalone(self, commands: Sequence[Command], idempotent: bool,
                          wait: Command | None = None) -> list[Any]:
        packed = pack(commands)
        for attempt in (1, 2):
            try:
                # A read is sent again on a new connection if this one turns out dead, so
                # only a write asks first whether the server closed it while idle.
                link = await self._link(self._seed, checked=not idempotent)
                replies = await link.request(packed, len(commands), wait=wait)
                return _replicated(replies, wait, self._seed) if wait else replies
            except ConnectFailed as exc:
                raise self._unavailable(self._seed, exc) from exc
            except LinkLost as exc:
                # A connection found dead before the write is re-made once for a read.
                if not idempotent or attempt == 2:
                    raise self._unavailable(self._seed, exc) from exc
        raise AssertionError("unreachable")

    # --- a cluster --------------------------------------------------------------------

    async def _clustered(self, commands: Sequence[Command], keys: Sequence[str | None],
                         idempotent: bool, wait: Command | None = None) -> list[Any]:
        results: list[Any] = [None] * len(commands)
        todo = list(range(len(commands)))
        asking: dict[int, Endpoint] = {}
        settling = _Settling()
        for _ in range(_MAX_ROUNDS):
            if not todo:
                break
            groups = await self._groups(todo, keys, asking)
            sent = await self._io.gather([
                self._send_group(where, [commands[i] for i in idx], [i in asking for i in idx],
                                 wait)
                for where, idx in groups.items()
            ])
            again, last = self._sort_replies(groups, sent, results, asking, idempotent)
            if not again:
                break
            if last is not None and not await self._settle(settling):
                for i in again:  # the cluster did not settle within the timeout
                    results[i] = (last if isinstance(last, ReplyError)
                                  else self._unavailable(self._seed, last))
                break
            todo = again
        else:
            for i in todo:  # redirected in circles: a cluster that disagrees with itself
                results[i] = StoreUnavailable(
                    f"Valkey cluster at {self._seed} kept redirecting a command")
        return results

    async def _groups(self, todo: Sequence[int], keys: Sequence[str | None],
                      asking: Mapping[int, Endpoint]) -> dict[Endpoint, list[int]]:
        """The commands ``todo`` by the node each goes to: its key's, the one an ASK named,
        or the seed for a command without a key."""
        groups: dict[Endpoint, list[int]] = {}
        for i in todo:
            where = asking.get(i)
            if where is None:
                key = keys[i]
                where = await self._node(key) if key is not None else self._seed
            groups.setdefault(where, []).append(i)
        return groups

    def _sort_replies(self, groups: Mapping[Endpoint, list[int]], sent: Sequence[Any],
                      results: list[Any], asking: dict[int, Endpoint], idempotent: bool,
                      ) -> tuple[list[int], BaseException | ReplyError | None]:
        """Put each final reply in ``results``; the commands to send again (redirected, or
        caught while the cluster moves or a node is down), and the last reason to wait for
        it to settle (None: only redirects, send again at once)."""
        again: list[int] = []
        last: BaseException | ReplyError | None = None
        for (where, idx), replies in zip(groups.items(), sent, strict=True):
            for i, reply in zip(idx, replies, strict=True):
                asking.pop(i, None)
                if isinstance(reply, ReplyError) and reply.code == "MOVED":
                    self._moved(reply)
                    again.append(i)
                elif isinstance(reply, ReplyError) and reply.code == "ASK":
                    asking[i] = _address(reply)
                    again.append(i)
                elif (isinstance(reply, ReplyError) and reply.code in _SETTLING) or isinstance(
                        reply, ConnectFailed) or (isinstance(reply, LinkLost) and idempotent):
                    last = reply
                    again.append(i)
                elif isinstance(reply, LinkLost):
                    results[i] = self._unavailable(where, reply)
                else:
                    results[i] = reply
        return again, last

    async def _settle(self, settling: _Settling) -> bool:
        """Wait (backing off) for the cluster to settle and read its slots again; False
        once ``timeout`` has passed since the first wait of this call."""
        now = time.monotonic()
        if settling.deadline is None:
            settling.deadline = now + self._options.timeout
        if now > settling.deadline:
            return False
        await self._io.sleep(settling.delay)
        settling.delay = min(settling.delay * 2, 0.5)
        try:
            await self._refresh()
        except StoreUnavailable:
            pass  # no node answers yet: the deadline decides
        return True

    async def _send_group(self, where: Endpoint, commands: Sequence[Command],
                          asking: Sequence[bool], wait: Command | None = None) -> list[Any]:
        """One pipelined request to one node, ended by ``wait`` if given; a connection
        failure fills every place."""
        wire: list[Command] = []
        for command, ask in zip(commands, asking, strict=True):
            if ask:
                wire.append(("ASKING",))
            wire.append(command)
        try:
            link = await self._link(where)
            replies = await link.request(pack(wire), len(wire), wait=wait)
        except (ConnectFailed, LinkLost) as exc:
            return [exc] * len(commands)
        if wait:
            replies = _replicated(replies, wait, where)
        if not any(asking):
            return replies
        out, at = [], 0
        for ask in asking:
            at += 1 if ask else 0  # skip ASKING's +OK
            out.append(replies[at])
            at += 1
        return out

    async def _node(self, key: str) -> Endpoint:
        if self._slots is None:
            await self._refresh()
            assert self._slots is not None
        slot = self._slot_of.get(key)
        if slot is None:
            slot = key_slot(key)
            if len(self._slot_of) < 100_000:
                self._slot_of[key] = slot
        return self._slots[slot]

    def _moved(self, reply: ReplyError) -> None:
        parts = str(reply).split()
        if self._slots is not None and len(parts) >= 3 and parts[1].isdigit():
            self._slots[int(parts[1])] = _address(reply)

    async def _refresh(self) -> None:
        await self._io.once("slots", self._read_slots)

    async def _read_slots(self) -> None:
        known = [self._seed] + sorted(set(self._slots or ()) - {self._seed}, key=str)
        last: BaseException | None = None
        for where in known:
            try:
                link = await self._link(where)
                reply = (await link.request(pack([("CLUSTER", "SLOTS")]), 1))[0]
            except (ConnectFailed, LinkLost) as exc:
                last = exc
                continue
            if isinstance(reply, ReplyError) or not reply:
                last = reply if isinstance(reply, ReplyError) else None
                continue
            table: list[Endpoint | None] = [None] * SLOTS
            for entry in reply:
                start, end, primary = int(entry[0]), int(entry[1]), entry[2]
                host = str(primary[0]) if primary[0] not in ("", "?", None) else where.host
                node = Endpoint(host, int(primary[1]))
                for slot in range(start, end + 1):
                    table[slot] = node
            if any(node is None for node in table):
                # Slots nobody serves (the cluster is down or still forming): keep asking.
                fallback = next(node for node in table if node is not None)
                self._slots = [node or fallback for node in table]
            else:
                self._slots = [node for node in table if node is not None]
            return
        raise StoreUnavailable(
            f"no node of the Valkey cluster at {self._seed} answers CLUSTER SLOTS"
            + (f" ({last})" if last else "")
        )

    # --- connections ------------------------------------------------------------------

    async def _link(self, where: Endpoint, *, checked: bool = True) -> Link:
        """The connection to ``where``, opened if there is none. ``checked``: one the
        server closed while it sat idle is replaced first (on a blocking socket that asks
        the kernel, a system call: a caller that will retry on a lost link skips it)."""
        link = self._links.get(where)
        if link is not None and (link.alive if checked else not link.closed):
            return link
        return await self._io.once(where, lambda: self._open(where))

    async def _open(self, where: Endpoint) -> Link:
        if self.closed:
            raise ConnectFailed(f"the store's connections to {where} were closed")
        try:
            link = await self._io.open(where, self._options)
        except ReplyError as exc:
            raise self._refused(where, exc) from None
        old = self._links.get(where)
        if old is not None and old is not link:
            old.close()
        self._links[where] = link
        return link

    async def _blocking_on(self, where: Endpoint, packed: bytes, count: int,
                           timeout: float) -> list[Any]:
        if self._io.blocking_shares:
            shared = await self._link(where)
            return await shared.request(packed, count, timeout)
        if self._blocking_slots is None:
            self._blocking_slots = asyncio.Semaphore(self._max_blocking)
        async with self._blocking_slots:
            idle = self._idle.setdefault(where, [])
            link: Link | None = None
            while idle and link is None:
                candidate = idle.pop()
                link = candidate if candidate.alive else None
            if link is None:
                try:
                    link = await self._io.open(where, self._options)
                except ReplyError as exc:
                    raise self._refused(where, exc) from None
            done = False
            try:
                replies = await link.request(packed, count, timeout)
                done = True
                return replies
            finally:
                # A call cancelled mid-block leaves its reply owed: that link is not reused.
                if done and link.alive and len(idle) < _IDLE_BLOCKING and not self.closed:
                    idle.append(link)
                else:
                    link.close()

    def close(self) -> None:
        """Close every connection (from the router's own loop or thread)."""
        self.closed = True
        for link in self._links.values():
            link.close()
        self._links.clear()
        for idle in self._idle.values():
            for link in idle:
                link.close()
        self._idle.clear()

    # --- detection and errors ---------------------------------------------------------

    async def _detect(self) -> None:
        """Read INFO once: does the server report a cluster?"""
        last: BaseException | None = None
        for attempt in range(3):
            try:
                link = await self._link(self._seed)
                reply = (await link.request(pack([("INFO", "cluster")]), 1))[0]
            except (ConnectFailed, LinkLost) as exc:
                last = exc
            else:
                if isinstance(reply, ReplyError):
                    if reply.code == "NOPERM":  # INFO denied: standalone (cluster=True wins)
                        self._mode.cluster = False
                        return
                    last = reply
                else:
                    self._mode.cluster = "cluster_enabled:1" in str(reply)
                    return
            await self._io.sleep(0.2 * (attempt + 1))
        # Chained to the last failure: whoever waits for the store can tell an outage from
        # a refusal (a TLS certificate it cannot verify).
        raise StoreUnavailable(f"Valkey at {self._seed} does not answer INFO: {last}") from (
            last if isinstance(last, BaseException) else None)

    def _unavailable(self, where: Endpoint, exc: BaseException | None) -> StoreUnavailable:
        return StoreUnavailable(f"Valkey at {where}: {exc}")

    def _refused(self, where: Endpoint, exc: ReplyError) -> Exception:
        text = str(exc)
        if text.startswith(_CREDENTIALS):
            return ConfigurationError(f"Valkey at {where} refused the connection's "
                                      f"credentials: {text}")
        return StoreUnavailable(f"Valkey at {where} refused the connection: {text}")


def _replicated(replies: list[Any], wait: Command, where: Endpoint) -> list[Any]:
    """The replies of a request ended by ``wait`` (``WAIT n ms``), without WAIT's own:
    when fewer than ``n`` replicas acknowledged the request's writes, each reply that is
    not an error becomes StoreUnavailable. Such a write is on the primary and may reach a
    replica later, or vanish in a failover: its outcome is unknown, as for a connection
    lost under it, so the caller must not act on it as done. (An error reply wrote
    nothing the caller is told of, and stays as it is.)"""
    *replies, acked = replies
    wanted, ms = int(wait[1]), int(wait[2])
    if isinstance(acked, int) and acked >= wanted:
        return replies
    why = (f"WAIT refused: {acked}" if isinstance(acked, ReplyError)
           else f"{acked} of {wanted} replicas acknowledged it within {ms} ms")
    unknown = StoreUnavailable(f"Valkey at {where}: a write is not known to be on a replica "
                               f"({why}); its outcome is unknown")
    return [r if isinstance(r, ReplyError) else unknown for r in replies]


def _address(reply: ReplyError) -> Endpoint:
    """The node a MOVED/ASK reply names (``MOVED 3999 127.0.0.1:6381``)."""
    target = str(reply).split()[-1]
    host, _, port = target.rpartition(":")
    return Endpoint(host.strip("[]") or "127.0.0.1", int(port))


class _Settling:
    """One call's wait for a cluster to settle: its deadline, once it started, and the
    next pause (doubling from 25 ms to 0.5 s)."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.delay = 0.025
