"""The Valkey store's connection: its options, one client per event loop (and per thread
for synchronous callers, per process after a fork), cluster detection, and the calls every
part of the store makes (plain commands, pipelines, blocking reads, the calls of the
store's Lua, loaded where the server lacks it), with the server's error replies turned into
the store's errors."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from pyrula.config.parse import parse_namespace, redact_url
from pyrula.errors import ConfigurationError, StaleToken, StoreUnavailable, WorkflowNotFound
from pyrula.workflows._sync import SYNC_DRIVE
from pyrula.workflows.stores import VALKEY_SCHEMES
from pyrula.workflows.stores.valkey.code import Code, missing
from pyrula.workflows.stores.valkey.codec import parse_info
from pyrula.workflows.stores.valkey.keys import KeySpace
from pyrula.workflows.stores.valkey.resp import (
    AsyncIO,
    Command,
    Durability,
    Endpoint,
    LinkOptions,
    ReplyError,
    SyncIO,
    parse_durability,
    parse_url,
)
from pyrula.workflows.stores.valkey.router import ClusterMode, Router

logger = logging.getLogger(__name__)

#: An ElastiCache Serverless endpoint (``<name>.serverless.<region>.cache.amazonaws.com``):
#: always a cluster, so it gets the cluster client without the INFO probe.
_SERVERLESS_HOST = re.compile(
    r"^(?:[a-z0-9-]+\.)+serverless\.[a-z0-9-]+\.cache\.amazonaws\.com$"
)


def cluster_mode(host: str, cluster: bool | None) -> bool | None:
    """Whether to use the cluster client, decided before connecting: the ``cluster`` flag
    when given (True forces the cluster client, False the plain one); True for an
    ElastiCache Serverless host; otherwise None, read from the server's INFO on the
    first call."""
    if cluster is not None:
        return cluster
    if _SERVERLESS_HOST.match(host.lower().rstrip(".")):
        return True
    return None


class EvictionCheck(StrEnum):
    """What a worker's startup does about a server whose eviction policy can delete runs."""

    ERROR = "error"  # refuse to start
    WARN = "warn"  # log a warning and start
    OFF = "off"  # do not look

#: Error replies that mean the server is busy or changing, not that the call is wrong.
_BUSY = ("LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "OOM")

#: The forks this process descends through, counted in each child as it starts: a
#: connection made in an earlier generation belongs to a parent. Every store call compares
#: it, where ``os.getpid()`` would be a system call each time.
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)

#: One script call: its keys (a shard's base, or a tuple of keys led by it) and its ARGV.
Call = tuple[str | tuple[str, ...], tuple[Any, ...]]


def _url(url: str) -> tuple[str, bool]:
    """Normalise valkey:// and valkeys:// to redis:// and rediss://; say if TLS."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(f"ValkeyStore url {redact_url(url)!r} has no scheme (redis://host:port)")
    scheme = urlsplit(url).scheme.lower()
    if scheme not in VALKEY_SCHEMES:
        raise ConfigurationError(
            f"ValkeyStore url scheme {scheme!r} is not one of {', '.join(VALKEY_SCHEMES)}"
        )
    rest = url.split("://", 1)[1]
    tls = scheme in ("rediss", "valkeys")
    return ("rediss://" if tls else "redis://") + rest, tls


class Connection:
    """The options and connections of one ValkeyStore, and the calls made through them."""

    def __init__(
        self,
        url: str = "redis://localhost:6379",
        namespace: str | None = None,
        shard_count: int = 64,
        cluster: bool | None = None,
        completed_ttl: float = 86400,
        eviction_policy_check: str | None = None,
        *,
        socket_timeout: float = 10.0,
        max_connections: int = 256,
        durability: str | None = None,
        replica_timeout: float | None = None,
    ) -> None:
        self.url, self.tls = _url(url)
        self.namespace = _namespace(namespace)
        self.shard_count = _shard_count(shard_count)
        if cluster not in (None, True, False):
            raise ConfigurationError(f"cluster must be None, True or False, got {cluster!r}")
        self.cluster = cluster
        if isinstance(completed_ttl, bool) or not isinstance(completed_ttl, int | float) or (
            completed_ttl < 0
        ):
            raise ConfigurationError(f"completed_ttl must be seconds >= 0, got {completed_ttl!r}")
        self.completed_ttl = int(completed_ttl)
        self.eviction_policy_check = _eviction_check(eviction_policy_check)
        self.keys = KeySpace(self.namespace)
        self._max_connections = max_connections
        self._seed, self.link_options = _links(url, self.url, socket_timeout, durability,
                                               replica_timeout)
        self.durability: Durability = self.link_options.durability
        self._mode = ClusterMode(cluster_mode(self._seed.host, cluster))
        self._lock = threading.Lock()
        self._routers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Router] = (
            weakref.WeakKeyDictionary()
        )
        self._closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._thread_routers: weakref.WeakSet[Router] = weakref.WeakSet()
        self._local = threading.local()
        self._born = _forks
        #: The router found last: (fork generation, its loop, the router), read without
        #: the lock by the calls that follow on the same loop.
        self._last: tuple[int, weakref.ref[asyncio.AbstractEventLoop], Router] | None = None
        #: Network round trips and script calls made through this object (benchmarks).
        self.stats: dict[str, int] = {"round_trips": 0}
        self.code = Code()

    # --- connections ----------------------------------------------------------------

    def router(self) -> Router:
        """The router of this event loop, or of this thread for a synchronous call."""
        if SYNC_DRIVE.get():
            return self._thread_router()
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0] == _forks and last[1]() is loop:
            return last[2]
        with self._lock:
            if self._born != _forks:  # never reuse a parent's sockets after fork
                self._forget_all()
            router = self._routers.get(loop)
            if router is not None:
                self._last = (_forks, weakref.ref(loop), router)
                return router
            router = Router(AsyncIO(), self._seed, self.link_options, self._mode,
                            max_blocking=self._max_connections)
            self._routers[loop] = router
            self._last = (_forks, weakref.ref(loop), router)
        # Close this loop's connections when the loop shuts down: asyncio.run() finalizes
        # the loop's async generators before closing it, so this one's finally runs. It is
        # started here, without awaiting, so that finding the router stays synchronous.
        closer = _closer(router)
        first: Any = closer.__anext__()
        try:
            first.send(None)
        except StopIteration:
            pass
        with self._lock:
            self._closers[loop] = closer
        return router

    def _thread_router(self) -> Router:
        local = self._local
        router: Router | None = getattr(local, "router", None)
        if router is None or getattr(local, "forks", None) != _forks or router.closed:
            router = Router(SyncIO(), self._seed, self.link_options, self._mode)
            local.router, local.forks = router, _forks
            with self._lock:
                self._thread_routers.add(router)
        return router

    def _forget_all(self) -> None:
        """After a fork: the parent's connections belong to the parent."""
        self._routers = weakref.WeakKeyDictionary()
        self._closers = weakref.WeakKeyDictionary()
        self._thread_routers = weakref.WeakSet()
        self._local = threading.local()
        self._born = _forks
        self._last = None

    @property
    def is_cluster(self) -> bool | None:
        """Whether the server is a cluster, once known (None before the first call)."""
        return self._mode.cluster

    async def clustered(self) -> bool:
        return await self.router().is_cluster()

    def where(self) -> str:
        return str(self._seed)

    async def aclose(self) -> None:
        """Close this event loop's connections."""
        loop = asyncio.get_running_loop()
        with self._lock:
            router = self._routers.pop(loop, None)
            closer = self._closers.pop(loop, None)
            self._last = None
        if router is not None:
            router.close()
        if closer is not None:
            await closer.aclose()

    def close(self) -> None:
        """Close the connections of every loop and thread; each loop's own are closed on
        that loop (a loop that has ended took its connections with it)."""
        with self._lock:
            routers = list(self._routers.items())
            threads = list(self._thread_routers)
            self._routers = weakref.WeakKeyDictionary()
            self._thread_routers = weakref.WeakSet()
            self._last = None
        for router in threads:
            router.close()
        for loop, router in routers:
            if loop.is_closed():
                continue
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop or not loop.is_running():
                router.close()
            else:
                loop.call_soon_threadsafe(router.close)

    # --- calls ----------------------------------------------------------------------

    async def load_script(self) -> None:
        """Load this build's Lua (on every primary of a cluster): its function library,
        or its script where the server refuses functions (``code.py``)."""
        await self.code.load(self.router())

    async def call(self, key: str | None, *command: Any, idempotent: bool = False) -> Any:
        """One plain command; an error reply is raised as the store's error."""
        self.stats["round_trips"] += 1
        reply = await self.router().call(key, *command, idempotent=idempotent)
        if isinstance(reply, ReplyError):
            raise self._plain_error(reply)
        if isinstance(reply, BaseException):  # a cluster's, or a write no replica has
            raise reply
        return reply

    async def read(self, key: str | None, *command: Any) -> Any:
        return await self.call(key, *command, idempotent=True)

    async def pipeline(self, commands: Sequence[tuple[str | None, Command]],
                       *, idempotent: bool = False) -> list[Any]:
        """Plain commands in one round trip (grouped by node on a cluster); replies in
        order, error replies in place as the store's errors."""
        if not commands:
            return []
        self.stats["round_trips"] += 1
        replies = await self.router().execute([c for _, c in commands],
                                              [k for k, _ in commands],
                                              idempotent=idempotent)
        return [self._plain_error(r) if isinstance(r, ReplyError) else r for r in replies]

    async def replicas(self) -> list[tuple[str, int]]:
        """Each primary's address and how many replicas it has connected right now."""
        counts = []
        for where, reply in await self.router().each_primary(("INFO", "replication")):
            if isinstance(reply, ReplyError):
                raise self._plain_error(reply)
            counts.append((str(where), int(parse_info(str(reply)).get("connected_slaves", 0))))
        return counts

    async def blocking(self, key: str, commands: Sequence[Command], block: float) -> list[Any]:
        """Commands led by a blocking one, on a connection of their own for ``block`` s."""
        self.stats["round_trips"] += 1
        replies = await self.router().blocking(key, commands, block)
        return [self._plain_error(r) if isinstance(r, ReplyError) else r for r in replies]

    async def op(self, base: str | tuple[str, ...], *args: Any) -> Any:
        """Call one operation on one shard; load the Lua once if the server lacks it."""
        result = (await self._eval([(base, args)]))[0]
        if isinstance(result, BaseException):
            raise result
        return result

    async def batch(self, calls: Sequence[Call], *, idempotent: bool = False) -> list[Any]:
        """Several operations on several shards in one round trip (grouped by node on a
        cluster). Errors are returned in place, not raised. ``idempotent``: the operations
        only read, so a connection lost under them may send them again."""
        if not calls:
            return []
        return await self._eval(calls, idempotent)

    async def _eval(self, calls: Sequence[Call], idempotent: bool = False) -> list[Any]:
        """Each call (FCALL, or EVALSHA: ``code.py``) in one round trip; the Lua is loaded
        once if the server lacks it. Results in order, errors in place."""
        commands: list[Command] = []
        keys: list[str | None] = []
        names_of = []
        for base, args in calls:
            names = (base,) if isinstance(base, str) else base
            names_of.append(names)
            commands.append(self.code.command(names, args))
            keys.append(names[0])
        router = self.router()
        self.stats["round_trips"] += 1
        results = await router.execute(commands, keys, idempotent=idempotent)
        # A flush can land between the calls of one batch: re-send only the calls refused
        # for want of the code (they did not run); the others must not run twice.
        refused = [i for i in range(len(calls)) if self.code.refused(results[i])]
        if refused:
            await self.load_script()
            self.stats["round_trips"] += 1
            again = await router.execute([self.code.command(names_of[i], calls[i][1])
                                          for i in refused],
                                         [keys[i] for i in refused], idempotent=idempotent)
            for i, result in zip(refused, again, strict=True):
                results[i] = result
        return [self._translate(result, calls[i][1]) if isinstance(result, ReplyError)
                else result for i, result in enumerate(results)]

    # --- errors ---------------------------------------------------------------------

    def _hidden_cluster(self, exc: Exception) -> ConfigurationError:
        return ConfigurationError(
            f"Valkey at {self.where()} redirected a command ({exc}): it is a cluster that "
            "does not report itself as one; pass cluster=True (CLI: --cluster)"
        )

    def _plain_error(self, reply: ReplyError) -> Exception:
        if reply.code in ("MOVED", "ASK", "CROSSSLOT"):
            return self._hidden_cluster(reply)
        if reply.code == "NOPERM":
            return ConfigurationError(
                f"Valkey at {self.where()} refused a command to this store's user: {reply}"
            )
        return StoreUnavailable(f"Valkey at {self.where()}: {reply}")

    def _translate(self, reply: ReplyError, args: Sequence[Any]) -> Exception:
        message = str(reply)
        run_id = str(args[1]) if len(args) > 1 else "?"
        # A script's error of one word (``error_reply('NOTFOUND')``) reaches the client
        # as "ERR NOTFOUND": the server takes a reply without a space for a message
        # without a code. Read as an outage, a worker would retry it for ever.
        said = message[4:] if message.startswith("ERR ") else message
        if said.startswith("STALE"):
            current = said.split(" ", 1)[1] if " " in said else None
            return StaleToken(run_id, int(args[2]) if len(args) > 2 else -1,
                              int(current) if current and current.isdigit() else None)
        if said.startswith("NOTFOUND"):
            return WorkflowNotFound(f"no run with id {run_id!r}")
        if reply.code in ("MOVED", "ASK", "CROSSSLOT") or "CROSSSLOT" in message:
            return self._hidden_cluster(reply)
        if missing(reply):
            return StoreUnavailable(
                f"Valkey at {self.where()}: the store's Lua is missing after loading it "
                f"({message})"
            )
        if reply.code in _BUSY:
            return StoreUnavailable(f"Valkey at {self.where()}: {message}")
        return StoreUnavailable(f"Valkey script error: {message}")


async def _closer(router: Router) -> AsyncIterator[None]:
    try:
        yield
    finally:
        router.close()


def _namespace(given: str | None) -> str:
    """The namespace given, else ``PYRULA_VALKEY_NAMESPACE``, else ``default``; checked."""
    if given is not None:
        return parse_namespace("namespace", given)
    from_env = os.environ.get("PYRULA_VALKEY_NAMESPACE")
    return "default" if not from_env else parse_namespace("PYRULA_VALKEY_NAMESPACE", from_env)


def _shard_count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise ConfigurationError(f"shard_count must be an int in 1..4096, got {value!r}")
    return value


def _eviction_check(given: str | None) -> EvictionCheck:
    """The eviction-policy check given, else ``PYRULA_VALKEY_EVICTION_CHECK``, else error."""
    check = given or os.environ.get("PYRULA_VALKEY_EVICTION_CHECK") or "error"
    if check not in tuple(EvictionCheck):
        raise ConfigurationError(
            f"eviction_policy_check must be one of {', '.join(EvictionCheck)}, got {check!r}"
        )
    return EvictionCheck(check)


def _links(given_url: str, url: str, socket_timeout: float, durability: str | None,
           replica_timeout: float | None) -> tuple[Endpoint, LinkOptions]:
    """The seed node and the link options of ``url``; a durability or replica timeout
    given in code wins over the URL's."""
    try:
        seed, options = parse_url(url, socket_timeout)
    except ValueError as exc:
        raise ConfigurationError(f"ValkeyStore url {redact_url(given_url)!r}: {exc}") from None
    if durability is None and replica_timeout is None:
        return seed, options
    try:
        chosen, seconds = parse_durability(
            durability if durability is not None else options.durability,
            replica_timeout if replica_timeout is not None else options.replica_timeout,
            socket_timeout)
    except ValueError as exc:
        raise ConfigurationError(f"ValkeyStore: {exc}") from None
    return seed, replace(options, durability=chosen, replica_timeout=seconds)
