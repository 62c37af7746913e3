"""The connection side of the Valkey store: one client per event loop (and per process
after a fork), cluster detection, the script call with its NOSCRIPT reload, batching
across shards, and the checks a worker runs before it starts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson
import redis.asyncio as aioredis
from redis import exceptions as rex
from redis.asyncio.cluster import RedisCluster

from pyrula.errors import (
    ConfigurationError,
    StaleToken,
    StoreUnavailable,
    WorkflowNotFound,
)
from pyrula.workflows._sync import run_sync
from pyrula.workflows.events import Event
from pyrula.workflows.records import FlowControl, RunInfo, RunStatus
from pyrula.workflows.stores.valkey.functions import SCRIPT, SHA
from pyrula.workflows.stores.valkey.keys import KeySpace

logger = logging.getLogger(__name__)

SCHEMES = ("redis", "rediss", "valkey", "valkeys")
EVICTION_CHECKS = ("error", "warn", "off")
_TRANSIENT = (rex.ConnectionError, rex.TimeoutError, ConnectionError, TimeoutError, OSError)



class _WaitingPool(aioredis.ConnectionPool):
    """A connection pool whose callers wait for a free connection when all are in use.

    redis-py's BlockingConnectionPool does the same with a Condition on every checkout,
    which costs a worker ~15 % of its CPU under load; an uncontended semaphore costs
    next to nothing.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = asyncio.Semaphore(self.max_connections)

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        await self._slots.acquire()
        try:
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        except BaseException:
            self._slots.release()
            raise

    async def release(self, connection: Any) -> None:
        try:
            await super().release(connection)
        finally:
            self._slots.release()


def _dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def _loads(data: Any) -> Any:
    if data is None or data == "":
        return None
    return orjson.loads(data)


def _seconds(value: float) -> str:
    """A schedule time for a script: whole seconds print as integers (exact in Lua)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _events(raw: Sequence[Any], first_seq: int) -> list[Event]:
    out = []
    for offset, item in enumerate(raw):
        event: Event = orjson.loads(item)
        event["seq"] = first_seq + offset
        out.append(event)
    return out


def _url(url: str) -> tuple[str, bool]:
    """Normalise valkey:// and valkeys:// to what redis-py understands; say if TLS."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(f"ValkeyStore url {url!r} has no scheme (redis://host:port)")
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"ValkeyStore url scheme {scheme!r} is not one of {', '.join(SCHEMES)}"
        )
    rest = url.split("://", 1)[1]
    tls = scheme in ("rediss", "valkeys")
    return ("rediss://" if tls else "redis://") + rest, tls


class ValkeyConnection:
    """What every part of ValkeyStore shares: options, clients, the script call."""

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
    ) -> None:
        self.url, self.tls = _url(url)
        ns = namespace if namespace is not None else os.environ.get("PYRULA_VALKEY_NAMESPACE")
        ns = (ns or "default").strip()
        if not ns or any(c in ns for c in "{}: \n\t"):
            raise ConfigurationError(
                f"namespace must be a non-empty string without braces, colons or spaces, "
                f"got {namespace!r}"
            )
        self.namespace = ns
        if isinstance(shard_count, bool) or not isinstance(shard_count, int) or not (
            1 <= shard_count <= 4096
        ):
            raise ConfigurationError(f"shard_count must be an int in 1..4096, got {shard_count!r}")
        self.shard_count = shard_count
        if cluster not in (None, True, False):
            raise ConfigurationError(f"cluster must be None, True or False, got {cluster!r}")
        self.cluster = cluster
        if isinstance(completed_ttl, bool) or not isinstance(completed_ttl, int | float) or (
            completed_ttl < 0
        ):
            raise ConfigurationError(f"completed_ttl must be seconds >= 0, got {completed_ttl!r}")
        self.completed_ttl = int(completed_ttl)
        check = eviction_policy_check or os.environ.get("PYRULA_VALKEY_EVICTION_CHECK") or "error"
        if check not in EVICTION_CHECKS:
            raise ConfigurationError(
                f"eviction_policy_check must be one of {', '.join(EVICTION_CHECKS)}, got {check!r}"
            )
        self.eviction_policy_check = check
        self.keys = KeySpace(ns)
        self._socket_timeout = socket_timeout
        self._max_connections = max_connections
        self._lock = threading.Lock()
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._init_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._is_cluster: bool | None = cluster
        self._pid = os.getpid()
        self._known_names: set[str] = set()
        # Dry shards a claim found, to take out of the doorbell off the claim's path.
        self._deferred_unring: list[tuple[dict[str, list[tuple[int, float]]], float]] = []
        #: Network round trips and script calls made through this object (benchmarks).
        self.stats: dict[str, int] = {"round_trips": 0}
        # Shard leases held through this store object: worker -> name -> shards.
        self._leases: dict[str, dict[str, set[int]]] = {}
        self._flow_cache: tuple[float, dict[str, FlowControl]] = (-1e9, {})
        # Flow-controlled runs claimed through this object: run id -> owner.
        self._flow_runs: dict[str, str] = {}
        # (name, 0 own / 1 other shards) -> the shard the next claim's round starts from.
        self._claim_cursor: dict[tuple[str, int], int] = {}

    # --- connections ----------------------------------------------------------------

    async def _client(self) -> Any:
        """This event loop's client (each loop and thread gets its own connections)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._pid != os.getpid():  # never reuse a parent's sockets after fork
                self._clients = weakref.WeakKeyDictionary()
                self._init_locks = weakref.WeakKeyDictionary()
                self._pid = os.getpid()
            client = self._clients.get(loop)
            if client is not None:
                return client
            init_lock = self._init_locks.setdefault(loop, asyncio.Lock())
        async with init_lock:  # one task builds it; the others wait for it
            with self._lock:
                client = self._clients.get(loop)
            if client is not None:
                return client
            if self._is_cluster is None:
                self._is_cluster = await self._detect_cluster()
            opts: dict[str, Any] = {"decode_responses": True,
                                    "socket_timeout": self._socket_timeout,
                                    "socket_connect_timeout": self._socket_timeout}
            if self._is_cluster:
                client = RedisCluster.from_url(self.url, **opts)
                try:
                    await client.initialize()
                except _TRANSIENT as exc:
                    await client.aclose()
                    raise StoreUnavailable(f"Valkey cluster at {self._where()}: {exc}") from exc
            else:
                # A burst of concurrent calls waits for a connection instead of failing
                # with "Too many connections".
                pool = _WaitingPool.from_url(
                    self.url, max_connections=self._max_connections, **opts
                )
                client = aioredis.Redis.from_pool(pool)  # closing the client closes the pool
            # Close this loop's client when the loop shuts down: asyncio.run() finalizes
            # the loop's async generators before closing it, so this one's finally runs.
            closer = self._closer(client)
            await closer.__anext__()
            with self._lock:
                self._closers[loop] = closer
                self._clients[loop] = client
            return client

    async def _closer(self, client: Any) -> AsyncIterator[None]:
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def _detect_cluster(self) -> bool:
        """Read INFO once: does the server report a cluster?"""
        probe = aioredis.Redis.from_url(
            self.url, decode_responses=True, socket_timeout=self._socket_timeout,
            socket_connect_timeout=self._socket_timeout,
        )
        try:
            last: Exception | None = None
            for attempt in range(3):
                try:
                    info = await probe.info("cluster")
                    return bool(int(info.get("cluster_enabled", 0)))
                except rex.NoPermissionError:
                    return False  # INFO denied: read as standalone (cluster=True overrides)
                except (*_TRANSIENT, rex.ResponseError) as exc:
                    last = exc
                    await asyncio.sleep(0.2 * (attempt + 1))
            raise StoreUnavailable(f"Valkey at {self._where()} does not answer INFO: {last}")
        finally:
            await probe.aclose()

    def _where(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.hostname}:{parts.port or 6379}"

    async def load_script(self) -> None:
        client = await self._client()
        try:
            await client.script_load(SCRIPT)
        except _TRANSIENT as exc:
            raise StoreUnavailable(f"Valkey at {self._where()}: {exc}") from exc

    async def _op(self, base: str, *args: Any) -> Any:
        """EVALSHA one operation on one shard; reload the script once on NOSCRIPT."""
        client = await self._client()
        for attempt in (1, 2):
            try:
                self.stats["round_trips"] += 1
                return await client.evalsha(SHA, 1, base, *args)
            except rex.NoScriptError as exc:
                if attempt == 2:  # flushed again at once: a transient state, not a loop
                    raise StoreUnavailable(
                        f"Valkey at {self._where()}: NOSCRIPT after reloading ({exc})"
                    ) from exc
                await self.load_script()
            except (rex.MovedError, rex.AskError) as exc:
                raise self._hidden_cluster(exc) from None
            except rex.ResponseError as exc:
                raise self._translate(exc, args) from None
            except _TRANSIENT as exc:
                raise StoreUnavailable(f"Valkey at {self._where()}: {exc}") from exc
        raise AssertionError("unreachable")

    async def _cmd(self, method: str, *args: Any, **kwargs: Any) -> Any:
        client = await self._client()
        try:
            self.stats["round_trips"] += 1
            return await getattr(client, method)(*args, **kwargs)
        except (rex.MovedError, rex.AskError) as exc:
            raise self._hidden_cluster(exc) from None
        except _TRANSIENT as exc:
            raise StoreUnavailable(f"Valkey at {self._where()}: {exc}") from exc

    def _hidden_cluster(self, exc: Exception) -> ConfigurationError:
        return ConfigurationError(
            f"Valkey at {self._where()} redirected a command ({exc}): it is a cluster that "
            "does not report itself as one; pass cluster=True (CLI: --cluster)"
        )

    def _translate(self, exc: rex.ResponseError, args: Sequence[Any]) -> Exception:
        if isinstance(exc, rex.MovedError | rex.AskError):  # its text lacks the MOVED
            return self._hidden_cluster(exc)
        message = str(exc)
        run_id = str(args[1]) if len(args) > 1 else "?"
        if message.startswith("STALE"):
            current = message.split(" ", 1)[1] if " " in message else None
            return StaleToken(run_id, int(args[2]) if len(args) > 2 else -1,
                              int(current) if current and current.isdigit() else None)
        if message.startswith("NOTFOUND"):
            return WorkflowNotFound(f"no run with id {run_id!r}")
        if "MOVED" in message or "CROSSSLOT" in message:
            return self._hidden_cluster(exc)
        return StoreUnavailable(f"Valkey script error: {message}")

    async def _batch(self, calls: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """Several operations on several shards in one pipelined round trip (standalone) or
        concurrently (cluster). Errors are returned in place, not raised."""
        if not calls:
            return []
        client = await self._client()
        if self._is_cluster:
            return list(await asyncio.gather(
                *(self._op(base, *args) for base, args in calls), return_exceptions=True
            ))
        results: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        for attempt in (1, 2):
            pipe = client.pipeline(transaction=False)
            for i in pending:
                base, args = calls[i]
                pipe.evalsha(SHA, 1, base, *args)
            try:
                self.stats["round_trips"] += 1
                answers = await pipe.execute(raise_on_error=False)
            except _TRANSIENT as exc:
                raise StoreUnavailable(f"Valkey at {self._where()}: {exc}") from exc
            for i, answer in zip(pending, answers, strict=True):
                results[i] = answer
            # A flush can land between the calls of one pipeline: re-send only the calls
            # refused with NOSCRIPT (they did not run); the others must not run twice.
            pending = [i for i in pending if isinstance(results[i], rex.NoScriptError)]
            if not pending or attempt == 2:
                break
            await self.load_script()
        return [
            self._translate(r, args) if isinstance(r, rex.ResponseError) else r
            for r, (_, args) in zip(results, calls, strict=True)
        ]

    def _info(self, run_id: str, f: Mapping[str, str]) -> RunInfo:
        def num(key: str) -> float | None:
            value = f.get(key)
            return None if value is None or value == "" else float(value)

        waiting = f.get("waiting_for") or ""
        return RunInfo(
            run_id=run_id,
            name=f["name"],
            status=RunStatus(f["status"]),
            attempt=int(f.get("attempt", 0)),
            params=_loads(f.get("params")),
            owner=f.get("owner") or None,
            created_at=float(f["created_at"]),
            updated_at=float(f.get("updated_at") or f["created_at"]),
            started_at=num("started_at"),
            finished_at=num("finished_at"),
            result=_loads(f.get("result")),
            error=_loads(f.get("error")),
            wake_at=num("wake_at"),
            waiting_for=tuple(orjson.loads(waiting)) if waiting else (),
            interrupt=_loads(f.get("interrupt")),
            idempotency_key=f.get("idem") or None,
            start_id=f.get("start_id") or run_id,
            successor_id=f.get("successor_id") or None,
        )

    # --- startup checks -------------------------------------------------------------

    async def prepare(self, names: Sequence[str]) -> None:
        """What a worker checks before any loop starts: cluster mode, eviction policy,
        the recorded shard count of each name; then loads the script."""
        client = await self._client()
        await self._check_eviction(client)
        for name in names:
            await self._register_name(name)
        await self.load_script()

    async def _check_eviction(self, client: Any) -> None:
        if self.eviction_policy_check == "off":
            return
        try:
            if self._is_cluster:
                infos = await client.info("memory", target_nodes=RedisCluster.PRIMARIES)
                memory = next(iter(infos.values())) if isinstance(infos, dict) and all(
                    isinstance(v, dict) for v in infos.values()) else infos
            else:
                memory = await client.info("memory")
        except rex.NoPermissionError:
            logger.warning("cannot read INFO memory to check the eviction policy")
            return
        except _TRANSIENT as exc:
            raise StoreUnavailable(f"Valkey at {self._where()}: {exc}") from exc
        policy = str(memory.get("maxmemory_policy", "noeviction"))
        maxmemory = int(memory.get("maxmemory", 0) or 0)
        if policy.startswith("allkeys-") and maxmemory > 0:
            message = (
                f"Valkey at {self._where()} has maxmemory-policy {policy} with maxmemory "
                f"{maxmemory}: eviction deletes live journals. Use noeviction, or accept the "
                "risk with eviction_policy_check='warn' or 'off' (PYRULA_VALKEY_EVICTION_CHECK)"
            )
            if self.eviction_policy_check == "error":
                raise ConfigurationError(message)
            logger.warning("%s", message, extra={"event": "valkey_eviction_policy"})
        elif policy.startswith("allkeys-") or policy.startswith("volatile-"):
            logger.warning(
                "Valkey at %s has maxmemory-policy %s: finished-run history and short-lived "
                "keys may be evicted", self._where(), policy,
                extra={"event": "valkey_eviction_policy"},
            )

    async def _register_name(self, name: str) -> None:
        if name in self._known_names:
            return
        field = f"shards:{name}"
        await self._cmd("hsetnx", self.keys.meta, field, self.shard_count)
        recorded = int(await self._cmd("hget", self.keys.meta, field))
        if recorded != self.shard_count:
            raise ConfigurationError(
                f"workflow {name!r} was recorded with shard_count={recorded} in namespace "
                f"{self.namespace!r}, this store has shard_count={self.shard_count}; use the "
                "same shard_count on every worker (drain a name before changing its count)"
            )
        self._known_names.add(name)

    async def _names(self) -> list[str]:
        fields = await self._cmd("hkeys", self.keys.meta)
        return sorted(f[len("shards:"):] for f in fields if f.startswith("shards:"))

    # --- lifecycle ------------------------------------------------------------------

    async def bind(
        self, project: str | None, environment: str | None
    ) -> tuple[str | None, str | None]:
        recorded: list[str | None] = []
        for key, value in (("project", project), ("environment", environment)):
            if value is not None:
                await self._cmd("hsetnx", self.keys.meta, f"binding.{key}", value)
            found = await self._cmd("hget", self.keys.meta, f"binding.{key}")
            recorded.append(None if found is None else str(found))
        return recorded[0], recorded[1]

    async def aping(self) -> None:
        await self._cmd("ping")

    def ping(self) -> None:
        run_sync(self.aping())

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.pop(loop, None)
        if client is not None:
            await client.aclose()

    def close(self) -> None:
        """Close the clients of every loop still running (the facade loop included);
        a client whose loop has already ended is dropped."""
        with self._lock:
            clients = list(self._clients.items())
            self._clients = weakref.WeakKeyDictionary()
        for loop, client in clients:
            if loop.is_closed() or not loop.is_running():
                continue
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                continue  # cannot block on our own loop; aclose() is the async path
            future = asyncio.run_coroutine_threadsafe(client.aclose(), loop)
            try:
                future.result(timeout=5.0)
            except Exception:  # closing is best effort
                logger.debug("closing a Valkey client failed", exc_info=True)

    def __repr__(self) -> str:
        return (f"ValkeyStore({self._where()!r}, namespace={self.namespace!r}, "
                f"shard_count={self.shard_count})")

