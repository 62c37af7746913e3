"""ValkeyStore: the store fleets share. Sharded, scripted, cluster-ready.

Each state change is one EVALSHA of this build's script on one shard (one slot): submit,
claim, append, park, finish, requeue. Lock renewal, timer wakes and orphan reclaims are
one call per shard, batched across shards. See keys.py for the data model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import threading
import time
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
    RunNotActive,
    StaleToken,
    StoreUnavailable,
    WorkflowNotFound,
)
from pyrula.workflows._sync import run_sync
from pyrula.workflows.events import INTERRUPT_SIGNAL, Event, EventType, make_event
from pyrula.workflows.records import (
    AppendResult,
    ClaimedRun,
    FinishResult,
    FlowControl,
    ParkResult,
    PoisonPolicy,
    RenewResult,
    RequeueOutcome,
    RunHandle,
    RunInfo,
    RunStatus,
)
from pyrula.workflows.schedules.schedule import Schedule
from pyrula.workflows.stores.common import (
    NO_OWNER,
    schedule_from_store,
    schedule_to_store,
    submitted_event,
    validate_flow_control,
)
from pyrula.workflows.stores.valkey.functions import SCRIPT, SHA
from pyrula.workflows.stores.valkey.keys import KeySpace, name_hash

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


class ValkeyStore:
    """``ValkeyStore(url, namespace=None, shard_count=64, cluster=None, completed_ttl=86400,
    eviction_policy_check="error")``."""

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

    # --- submit ---------------------------------------------------------------------

    def _shard_for(self, idempotency_key: str | None) -> int:
        if idempotency_key is None:
            return random.randrange(self.shard_count)
        return int(name_hash(idempotency_key), 16) % self.shard_count

    async def submit(
        self,
        name: str,
        params: Any,
        *,
        now: float,
        owner: str | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[RunHandle, bool]:
        await self._register_name(name)
        shard = self._shard_for(idempotency_key)
        base = self.keys.base_of(name, shard)
        run_id = self.keys.new_run_id(name, shard, now)
        event = submitted_event(now, name, params, owner, idempotency_key)
        args = ("submit", run_id, name, owner or NO_OWNER, _dumps(params), now,
                idempotency_key or "", _dumps(event), "")
        if self._is_cluster:
            result = await self._op(base, *args)
            if int(result[1]):
                await self._ring(name, [shard], now)
        else:
            # One round trip: the script and the doorbell in one pipeline.
            client = await self._client()
            result = None
            for attempt in (1, 2):
                pipe = client.pipeline(transaction=False)
                pipe.evalsha(SHA, 1, base, *args)
                pipe.zadd(self.keys.ready(name), self._rung([shard], now), gt=True)
                pipe.lpush(self.keys.bell, "1")
                pipe.ltrim(self.keys.bell, 0, 63)
                try:
                    self.stats["round_trips"] += 1
                    replies = await pipe.execute(raise_on_error=False)
                except _TRANSIENT as exc:
                    raise StoreUnavailable(f"Valkey at {self._where()}: {exc}") from exc
                if isinstance(replies[0], rex.NoScriptError) and attempt == 1:
                    await self.load_script()
                    continue
                if isinstance(replies[0], rex.ResponseError):
                    raise self._translate(replies[0], args)
                result = replies[0]
                break
            assert result is not None
        created = bool(int(result[1]))
        return RunHandle(name, str(result[0])), created

    async def _ring(self, name: str, shards: Sequence[int], now: float) -> None:
        """The doorbell: mark shards that may have queued runs and wake an idle worker."""
        if not shards:
            return
        client = await self._client()
        try:
            if self._is_cluster:
                self.stats["round_trips"] += 2
                await asyncio.gather(
                    client.zadd(self.keys.ready(name), self._rung(shards, now), gt=True),
                    self._push_bell(client),
                )
            else:
                pipe = client.pipeline(transaction=False)
                pipe.zadd(self.keys.ready(name), self._rung(shards, now), gt=True)
                pipe.lpush(self.keys.bell, "1")
                pipe.ltrim(self.keys.bell, 0, 63)
                self.stats["round_trips"] += 1
                await pipe.execute()
        except _TRANSIENT as exc:
            raise StoreUnavailable(f"Valkey at {self._where()}: {exc}") from exc

    @staticmethod
    def _rung(shards: Sequence[int], now: float) -> dict[str, int]:
        ms = int(now * 1000)
        return {str(s): ms for s in shards}

    async def _push_bell(self, client: Any) -> None:
        pipe = client.pipeline(transaction=False)
        pipe.lpush(self.keys.bell, "1")
        pipe.ltrim(self.keys.bell, 0, 63)
        await pipe.execute()

    async def wait_for_work(self, names: Sequence[str], timeout: float) -> bool:
        """Block until something rings the doorbell (or ``timeout``); True if it rang."""
        popped = await self._cmd("blpop", [self.keys.bell], timeout=max(timeout, 0.01))
        return bool(popped)

    # --- attempt writes -------------------------------------------------------------

    def _base(self, run_id: str) -> str:
        base = self.keys.base_of_run(run_id)
        if base is None:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        return base

    async def append(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float, lock_ttl: float
    ) -> AppendResult:
        result = await self._op(
            self._base(run_id), "append", run_id, token, now, now + lock_ttl,
            *(_dumps(e) for e in events),
        )
        return AppendResult(int(result[0]), bool(int(result[1])))

    async def park(
        self,
        run_id: str,
        token: int,
        events: Sequence[Event],
        *,
        now: float,
        wake_at: float | None,
        signals: Sequence[str],
        known_seq: int,
        interrupt: Any = None,
    ) -> ParkResult:
        interrupt_json = _dumps(interrupt) if INTERRUPT_SIGNAL in signals else ""
        result = await self._op(
            self._base(run_id), "park", run_id, token, now,
            "" if wake_at is None else wake_at, known_seq, interrupt_json, len(signals),
            *signals, *(_dumps(e) for e in events),
        )
        parked, last, cancel, tail = int(result[0]), int(result[1]), int(result[2]), result[3]
        if parked:
            await self._flow_done(run_id)
            return ParkResult(True, last)
        return ParkResult(False, last, _events(tail, known_seq + 1), bool(cancel))

    async def finish(
        self,
        run_id: str,
        token: int,
        events: Sequence[Event],
        *,
        now: float,
        status: RunStatus,
        result: Any = None,
        error: dict[str, Any] | None = None,
        successor_params: Any = None,
    ) -> FinishResult:
        status = RunStatus(status)
        batch = [dict(e) for e in events]
        successor_id = ""
        successor_event = ""
        name = None
        if status is RunStatus.CONTINUED:
            info = await self.get_run(run_id)
            if info is None:
                raise WorkflowNotFound(f"no run with id {run_id!r}")
            name = info.name
            shard = int(run_id[12:16], 16)
            successor_id = self.keys.new_run_id(info.name, shard, now)
            event = submitted_event(now, info.name, successor_params, info.owner, None)
            event["predecessor"] = run_id
            successor_event = _dumps(event)
            batch[-1]["successor"] = successor_id
        last = await self._op(
            self._base(run_id), "finish", run_id, token, now, status.value, _dumps(result),
            "" if error is None else _dumps(error), self.completed_ttl, successor_id,
            successor_event, _dumps(successor_params) if successor_id else "",
            *(_dumps(e) for e in batch),
        )
        await self._flow_done(run_id)
        if successor_id and name is not None:
            await self._ring(name, [int(run_id[12:16], 16)], now)
        return FinishResult(int(last), successor_id or None)

    async def requeue(
        self,
        run_id: str,
        token: int,
        *,
        now: float,
        reason: str,
        events: Sequence[Event] = (),
        crash: bool = False,
        poison: PoisonPolicy | None = None,
        crash_detail: Mapping[str, Any] | None = None,
    ) -> RequeueOutcome:
        policy = poison or PoisonPolicy()
        quarantined = await self._op(
            self._base(run_id), "requeue", run_id, token, now, reason, 1 if crash else 0,
            policy.max_retries, policy.retry_ttl_s, _dumps(dict(crash_detail or {})),
            self.completed_ttl, *(_dumps(e) for e in events),
        )
        await self._flow_done(run_id)
        if not int(quarantined):
            await self._ring_run(run_id, now)
        return RequeueOutcome(run_id, bool(int(quarantined)))

    async def _ring_run(self, run_id: str, now: float) -> None:
        info = await self._cmd("hget", self.keys.run(run_id), "name")
        if info:
            await self._ring(str(info), [int(run_id[12:16], 16)], now)

    # --- work queue -----------------------------------------------------------------

    def _held_shards(self, name: str) -> set[int]:
        held: set[int] = set()
        for names in self._leases.values():
            held |= names.get(name, set())
        return held

    async def claim(
        self,
        worker_id: str,
        names: Sequence[str],
        *,
        limit: int,
        now: float,
        lock_ttl: float,
    ) -> list[ClaimedRun]:
        if not names or limit <= 0:
            return []
        client = await self._client()
        try:
            if self._is_cluster:
                rings = await asyncio.gather(
                    *(client.zrange(self.keys.ready(n), 0, -1, withscores=True) for n in names)
                )
            else:
                pipe = client.pipeline(transaction=False)
                for n in names:
                    pipe.zrange(self.keys.ready(n), 0, -1, withscores=True)
                rings = await pipe.execute()
        except (rex.MovedError, rex.AskError) as exc:
            raise self._hidden_cluster(exc) from None
        except _TRANSIENT as exc:
            raise StoreUnavailable(f"Valkey at {self._where()}: {exc}") from exc
        candidates: list[tuple[int, str, int, float]] = []  # (priority, name, shard, rung)
        for name, rung in zip(names, rings, strict=True):
            held = self._held_shards(name)
            for member, score in rung:
                shard = int(member)
                candidates.append((0 if shard in held else 1, name, shard, float(score)))
        # Visit the rung shards, own shards first, each group in turn from where this
        # store's last claim of the name stopped there: every rung shard is visited within
        # about rung / limit claims. (A random pick leaves some shard unvisited for many
        # claims, and with it a small owner whom deficit round robin serves next there.)
        cursor = self._claim_cursor
        for name in names:
            for group in (0, 1):
                cursor.setdefault((name, group), random.randrange(self.shard_count))
        candidates.sort(
            key=lambda c: (c[0], (c[2] - cursor[(c[1], c[0])]) % self.shard_count)
        )
        # Each shard visited gets a share of `limit`: one claim is one pipelined round trip.
        visit = candidates[:limit]
        if not visit:
            return []  # before reserving: a reservation is only given back by the settle
        reserved = await self._flow_reserve(names, limit, now, lock_ttl)
        caps: list[Any] = []
        for owner, (count, _) in reserved.items():
            caps.extend([owner, count])
        shares = [limit // len(visit)] * len(visit)
        for i in range(limit - sum(shares)):
            shares[i] += 1
        claimed: list[ClaimedRun] = []
        empty: dict[str, list[tuple[int, float]]] = {}
        fuller: list[tuple[str, int]] = []

        def took(rows: Sequence[Any], left: Any, name: str, shard: int, rung: float) -> None:
            taken = [self._claimed(row) for row in rows]
            claimed.extend(taken)
            for run in taken:  # flow caps are owner-wide: later shards see what is left
                owner = run.owner or NO_OWNER
                if owner in reserved:
                    at = caps.index(owner)
                    caps[at + 1] = int(caps[at + 1]) - 1
            if int(left):
                fuller.append((name, shard))
            else:
                empty.setdefault(name, []).append((shard, rung))

        async def claim_on(shards: Sequence[tuple[int, str, int, float]],
                           counts: Sequence[int]) -> None:
            for group, name, shard, _ in shards:
                cursor[(name, group)] = (shard + 1) % self.shard_count
            if reserved:
                for (_, name, shard, rung), share in zip(shards, counts, strict=True):
                    rows, left = await self._op(
                        self.keys.base_of(name, shard), "claim", worker_id, now,
                        now + lock_ttl, share, *caps,
                    )
                    took(rows, left, name, shard, rung)
                return
            calls = [
                (self.keys.base_of(name, shard),
                 ("claim", worker_id, now, now + lock_ttl, share))
                for (_, name, shard, _), share in zip(shards, counts, strict=True)
            ]
            for (_, name, shard, rung), result in zip(shards, await self._batch(calls),
                                                      strict=True):
                if isinstance(result, BaseException):
                    raise result
                took(result[0], result[1], name, shard, rung)

        try:
            await claim_on(visit, shares)
            # Shares left unused by shards that ran dry go to those that still have runs.
            for name, shard in list(fuller):
                remaining = limit - len(claimed)
                if remaining <= 0:
                    break
                fuller.remove((name, shard))
                rows, left = await self._op(
                    self.keys.base_of(name, shard), "claim", worker_id, now,
                    now + lock_ttl, remaining, *caps,
                )
                took(rows, left, name, shard, float("inf"))
            # Then any: when the shards visited come back short (dry, or holding only runs
            # that flow control holds back), as many further rung shards, once, other
            # workers' first. Without it a worker whose own shards hold only held-back runs
            # never takes the runs queued on the shards of a worker that is full.
            rest = sorted(candidates[len(visit):], key=lambda c: -c[0])  # stable
            more = rest[:max(0, limit - len(claimed))]
            if more:
                await claim_on(more, [1] * len(more))
        finally:
            await self._flow_settle(reserved, claimed, now + lock_ttl)
        await self._unring(empty, now)
        return claimed

    async def _unring(self, empty: dict[str, list[tuple[int, float]]], now: float) -> None:
        """Take shards found empty out of the doorbell, then look again: a run enqueued
        meanwhile was either seen by the second look (and the shard is rung again) or
        enqueued after it, and its own ring comes after our removal."""
        for name, shards in empty.items():
            members = [str(s) for s, _ in shards]
            await self._cmd("zrem", self.keys.ready(name), *members)
            looks = await self._batch(
                [(self.keys.base_of(name, s), ("pending",)) for s, _ in shards]
            )
            busy = [s for (s, _), p in zip(shards, looks, strict=True)
                    if isinstance(p, BaseException) or int(p[0]) > 0]
            if busy:
                await self._ring(name, busy, now)

    def _claimed(self, row: Sequence[Any]) -> ClaimedRun:
        run_id, name, params, owner, attempt, start_id, created, base_seq, journal = row
        return ClaimedRun(
            run_id=str(run_id),
            name=str(name),
            params=_loads(params),
            owner=str(owner) or None,
            token=int(attempt),
            journal=_events(journal, int(base_seq) + 1),
            base_seq=int(base_seq),
            start_id=str(start_id),
            created_at=float(created),
        )

    async def claim_run(
        self, run_id: str, worker_id: str, *, now: float, lock_ttl: float
    ) -> ClaimedRun | None:
        if self.keys.base_of_run(run_id) is None:
            return None
        row = await self._op(self._base(run_id), "claim_run", run_id, worker_id, now,
                             now + lock_ttl)
        return None if not row else self._claimed(row)

    async def renew(
        self, worker_id: str, held: Mapping[str, int], *, now: float, lock_ttl: float
    ) -> RenewResult:
        by_shard: dict[str, list[Any]] = {}
        for run_id, token in held.items():
            base = self.keys.base_of_run(run_id)
            if base is not None:
                by_shard.setdefault(base, []).extend([run_id, token])
        calls = [(base, ("renew", now, now + lock_ttl, *args)) for base, args in by_shard.items()]
        lost: set[str] = {r for r in held if self.keys.base_of_run(r) is None}
        cancel: set[str] = set()
        flows: dict[str, list[str]] = {}
        for run_id in held:
            owner = self._flow_runs.get(run_id)
            if owner is not None:
                flows.setdefault(owner, []).append(run_id)
        calls += [(self.keys.flow(o), ("flow_renew", now + lock_ttl, *ids))
                  for o, ids in flows.items()]
        for result in await self._batch(calls):
            if isinstance(result, BaseException):
                if isinstance(result, StoreUnavailable | ConfigurationError):
                    raise result
                continue
            if isinstance(result, list):
                lost.update(str(r) for r in result[0])
                cancel.update(str(r) for r in result[1])
        for run_id in lost:
            self._flow_runs.pop(run_id, None)
        return RenewResult(frozenset(lost), frozenset(cancel))

    def _shards_to_scan(self, name: str) -> list[int]:
        held = self._held_shards(name)
        return sorted(held) if held else list(range(self.shard_count))

    async def _due(self, suffix: str, names: Sequence[str], now: float,
                   limit: int) -> list[tuple[str, int, int]]:
        """(name, shard, how many to take) for shards with entries of ``suffix`` due by
        ``now``, allotted in shard order so the total stays within ``limit``."""
        shards = [(n, s) for n in names for s in self._shards_to_scan(n)]
        client = await self._client()
        keys = [f"{self.keys.base_of(n, s)}:{suffix}" for n, s in shards]
        try:
            if self._is_cluster:
                counts = await asyncio.gather(*(client.zcount(k, "-inf", now) for k in keys))
            else:
                pipe = client.pipeline(transaction=False)
                for key in keys:
                    pipe.zcount(key, "-inf", now)
                counts = await pipe.execute()
        except (rex.MovedError, rex.AskError) as exc:
            raise self._hidden_cluster(exc) from None
        except _TRANSIENT as exc:
            raise StoreUnavailable(f"Valkey at {self._where()}: {exc}") from exc
        plan: list[tuple[str, int, int]] = []
        left = limit
        for (name, shard), count in zip(shards, counts, strict=True):
            if left <= 0:
                break
            if int(count):
                take = min(int(count), left)
                plan.append((name, shard, take))
                left -= take
        return plan

    async def wake_due(self, *, now: float, limit: int) -> int:
        plan = await self._due("timers", await self._names(), now, limit)
        calls = [(self.keys.base_of(n, s), ("wake_due", now, take)) for n, s, take in plan]
        woken = 0
        rung: dict[str, list[int]] = {}
        for (name, shard, _), result in zip(plan, await self._batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            if int(result):
                woken += int(result)
                rung.setdefault(name, []).append(shard)
        for name, shards in rung.items():
            await self._ring(name, shards, now)
        return woken

    async def reclaim(
        self,
        names: Sequence[str] | None,
        *,
        now: float,
        limit: int,
        poison: PoisonPolicy,
    ) -> list[RequeueOutcome]:
        chosen = await self._names() if names is None else list(names)
        plan = await self._due("locks", chosen, now, limit)
        calls = [
            (self.keys.base_of(n, s), ("reclaim", now, take, poison.max_retries,
                                      poison.retry_ttl_s, self.completed_ttl))
            for n, s, take in plan
        ]
        outcomes: list[RequeueOutcome] = []
        rung: dict[str, list[int]] = {}
        for (name, shard, _), result in zip(plan, await self._batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            for run_id, quarantined in result:
                outcomes.append(RequeueOutcome(str(run_id), bool(int(quarantined))))
                if not int(quarantined):
                    rung.setdefault(name, []).append(shard)
        for name, shards in rung.items():
            await self._ring(name, shards, now)
        await self._sweep(chosen, now)  # the orphan scan's pace suits the safety net
        return outcomes

    async def reclaim_worker(
        self,
        worker_id: str,
        *,
        now: float,
        poison: PoisonPolicy,
        crash_detail: Mapping[str, Any] | None = None,
    ) -> list[RequeueOutcome]:
        targets = [(n, s) for n in await self._names() for s in range(self.shard_count)]
        detail = _dumps(dict(crash_detail or {}))
        calls = [
            (self.keys.base_of(n, s), ("reclaim_worker", worker_id, now, poison.max_retries,
                                      poison.retry_ttl_s, detail, self.completed_ttl))
            for n, s in targets
        ]
        outcomes: list[RequeueOutcome] = []
        rung: dict[str, list[int]] = {}
        for (name, shard), result in zip(targets, await self._batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            for run_id, quarantined in result:
                outcomes.append(RequeueOutcome(str(run_id), bool(int(quarantined))))
                if not int(quarantined):
                    rung.setdefault(name, []).append(shard)
        for name, shards in rung.items():
            await self._ring(name, shards, now)
        return outcomes

    def recover_pending_runs(self, name: str) -> int:
        async def recover() -> int:
            calls = [
                (self.keys.base_of(name, s), ("reclaim", time.time(), 1 << 30, 3, 3600.0,
                                             self.completed_ttl))
                for s in range(self.shard_count)
            ]
            total = 0
            for result in await self._batch(calls):
                if isinstance(result, BaseException):
                    raise result
                total += len(result)
            await self._ring(name, list(range(self.shard_count)), time.time())
            return total

        return run_sync(recover())

    # --- run control ----------------------------------------------------------------

    async def signal(self, run_id: str, name: str, payload: Any, *, now: float) -> None:
        interrupt = name == INTERRUPT_SIGNAL
        type_ = EventType.INTERRUPT_RESUMED if interrupt else EventType.SIGNAL_RECEIVED
        event = make_event(type_, now, name=name, payload=payload)
        answer = str(await self._op(self._base(run_id), "signal", run_id, now, name,
                                    _dumps(event)))
        if answer == "NOTFOUND":
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        if answer.startswith("ENDED"):
            raise RunNotActive(f"run {run_id} has already ended ({answer.split(' ', 1)[1]})")
        if answer == "QUEUED":
            await self._ring_run(run_id, now)

    async def cancel(self, run_id: str, *, now: float) -> bool:
        answer = str(await self._op(self._base(run_id), "cancel", run_id, now,
                                    self.completed_ttl))
        if answer == "NOTFOUND":
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        return answer in ("CANCELLED", "REQUESTED")

    async def wake_run(self, run_id: str, *, now: float) -> bool:
        answer = str(await self._op(self._base(run_id), "wake_run", run_id, now))
        if answer == "NOTFOUND":
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        if answer == "WOKEN":
            await self._ring_run(run_id, now)
            return True
        return False

    # --- reads ----------------------------------------------------------------------

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

    async def get_run(self, run_id: str) -> RunInfo | None:
        if self.keys.base_of_run(run_id) is None:
            return None
        fields = await self._cmd("hgetall", self.keys.run(run_id))
        return self._info(run_id, fields) if fields else None

    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        if self.keys.base_of_run(run_id) is None:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        raw = await self._cmd("lrange", self.keys.journal(run_id), after_seq, -1)
        if not raw and not await self._cmd("exists", self.keys.run(run_id)):
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        return _events(raw, after_seq + 1)

    async def list_runs(
        self,
        *,
        name: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunInfo]:
        names = [name] if name is not None else await self._names()
        page: list[RunInfo] = []
        # Scatter: each shard's index newest first, in chunks, until enough rows match.
        top = "+inf" if before is None else before[0]
        bases = [self.keys.base_of(n, s) for n in names for s in range(self.shard_count)]
        chunk = max(limit, 50)
        for base in bases:
            offset = 0
            while True:
                ids = await self._cmd("zrevrangebyscore", f"{base}:index", top, "-inf",
                                      start=offset, num=chunk, withscores=True)
                if not ids:
                    break
                offset += len(ids)
                matched = 0
                for run_id, created in ids:
                    if before is not None and (created, run_id) >= before:
                        continue
                    info = await self.get_run(run_id)
                    if info is None:
                        continue
                    if status is not None and info.status != status:
                        continue
                    if owner is not None and (info.owner or "") != owner:
                        continue
                    page.append(info)
                    matched += 1
                if len(ids) < chunk or matched >= limit:
                    break
        page.sort(key=lambda i: (i.created_at, i.run_id), reverse=True)
        return page[:limit]

    async def wait_result(self, run_id: str, timeout: float | None) -> RunInfo:
        if self.keys.base_of_run(run_id) is None:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        done_key = self.keys.done(run_id)
        while True:
            info = await self.get_run(run_id)
            if info is None:
                # An earlier run of a continue_as_new chain may have expired while the chain
                # goes on: its start id's tail record names the chain's latest run.
                tail = await self._cmd("get", f"{self.keys.base_of_run(run_id)}:chain:{run_id}")
                if tail is None or tail == run_id:
                    raise WorkflowNotFound(f"no run with id {run_id!r}")
                run_id, done_key = str(tail), self.keys.done(str(tail))
                continue
            if info.status.terminal:
                return info
            wait = 5.0
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    raise TimeoutError(f"run {run_id} did not end within {timeout} s")
            # Woken by the store, no polling: a blocking rotation of the run's "done" list,
            # which leaves its token (and its TTL) for other waiters. (A pop and a push
            # back emptied the list in between: the key came back without its TTL.)
            await self._cmd("blmove", done_key, done_key, max(wait, 0.01), "LEFT", "RIGHT")

    # --- archiving (ArchivingStore) --------------------------------------------------

    async def _pipelined(self, commands: Sequence[tuple[str, tuple[Any, ...], dict[str, Any]]]
                         ) -> list[Any]:
        """Plain commands in one pipelined round trip (standalone) or concurrently
        (cluster); results in order."""
        if not commands:
            return []
        client = await self._client()
        try:
            self.stats["round_trips"] += 1
            if self._is_cluster:
                return list(await asyncio.gather(
                    *(getattr(client, m)(*args, **kw) for m, args, kw in commands)
                ))
            pipe = client.pipeline(transaction=False)
            for method, args, kwargs in commands:
                getattr(pipe, method)(*args, **kwargs)
            return list(await pipe.execute())
        except (rex.MovedError, rex.AskError) as exc:
            raise self._hidden_cluster(exc) from None
        except _TRANSIENT as exc:
            raise StoreUnavailable(f"Valkey at {self._where()}: {exc}") from exc

    async def ended_runs(
        self, *, after: tuple[float, str] | None, until: float, limit: int
    ) -> list[tuple[float, str]]:
        """(finished_at, run_id) of ended runs after the cursor ``after`` and at or before
        ``until``, oldest first, at most ``limit``: read from each shard's index of ended
        runs (``expiry``), which holds them for ``completed_ttl``."""
        keys = [f"{self.keys.base_of(n, s)}:expiry"
                for n in await self._names() for s in range(self.shard_count)]
        low: Any = "-inf" if after is None else after[0]
        if limit <= 0 or not keys:
            return []
        found: list[tuple[float, str]] = []
        pending = [(key, 0) for key in keys]
        while pending:
            pages = await self._pipelined([
                ("zrangebyscore", (key, low, until), {"start": offset, "num": limit,
                                                      "withscores": True})
                for key, offset in pending
            ])
            again = []
            for (key, offset), page in zip(pending, pages, strict=True):
                fresh = [(float(score), str(member)) for member, score in page
                         if after is None or (float(score), str(member)) > after]
                found.extend(fresh)
                # A full page wholly at or before the cursor (ties on its score): read on.
                if not fresh and len(page) >= limit:
                    again.append((key, offset + len(page)))
            pending = again
        found.sort()
        return found[:limit]

    async def expire_finished(self, run_ids: Sequence[str], ttl: float) -> None:
        """Let these ended runs' live copies (record, journal, done list) expire within
        ``ttl`` seconds; a run still in flight, one with a shorter TTL, and one that
        continued as new (a chain's earlier runs keep ``completed_ttl``) are left alone."""
        by_shard: dict[str, list[str]] = {}
        for run_id in run_ids:
            base = self.keys.base_of_run(run_id)
            if base is not None:
                by_shard.setdefault(base, []).append(run_id)
        seconds = max(0, int(ttl))
        results = await self._batch(
            [(base, ("expire_finished", seconds, *ids)) for base, ids in by_shard.items()]
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def read_finished(
        self, run_ids: Sequence[str]
    ) -> dict[str, tuple[RunInfo, list[Event]]]:
        """Each ended run's record and whole journal, in one round trip; runs that are gone
        or have not ended are left out."""
        wanted = [r for r in run_ids if self.keys.base_of_run(r) is not None]
        commands: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        for run_id in wanted:
            commands.append(("hgetall", (self.keys.run(run_id),), {}))
            commands.append(("lrange", (self.keys.journal(run_id), 0, -1), {}))
        replies = await self._pipelined(commands)
        out: dict[str, tuple[RunInfo, list[Event]]] = {}
        for i, run_id in enumerate(wanted):
            fields, raw = replies[2 * i], replies[2 * i + 1]
            if not fields or not raw:
                continue
            info = self._info(run_id, fields)
            if info.status.terminal:
                out[run_id] = (info, _events(raw, 1))
        return out

    # --- shards ---------------------------------------------------------------------

    def shards_held(self, worker_id: str) -> dict[str, int]:
        return {name: len(s) for name, s in self._leases.get(worker_id, {}).items()}

    async def shard_lease_tick(
        self, *, worker_id: str, names: Sequence[str], now: float, options: Any
    ) -> None:
        ttl = float(getattr(options, "shard_lease_ttl", 30.0))
        calls = [(self.keys.leases(n), ("lease", worker_id, now, ttl, self.shard_count))
                 for n in names]
        held = self._leases.setdefault(worker_id, {})
        for name, result in zip(names, await self._batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            held[name] = {int(s) for s in result}

    async def _sweep(self, names: Sequence[str], now: float) -> None:
        """Safety net for the doorbell (a client that died between its submit and its
        ring): ring every shard we scan that still has queued runs."""
        for name in names:
            shards = self._shards_to_scan(name)
            pending = await self._batch(
                [(self.keys.base_of(name, s), ("pending",)) for s in shards]
            )
            busy = [s for s, p in zip(shards, pending, strict=True)
                    if not isinstance(p, BaseException) and int(p[0]) > 0]
            await self._ring(name, busy, now)

    async def release_shards(self, worker_id: str) -> None:
        """Give back every shard ``worker_id`` leases, and drop it from the live workers.
        Also for a worker that leased through another store object (a fleet's supervisor
        releasing a dead child's shards): then every registered name is released."""
        names = list(self._leases.get(worker_id, {})) or await self._names()
        calls = [(self.keys.leases(n), ("release", worker_id)) for n in names]
        await self._batch(calls)
        self._leases.pop(worker_id, None)

    # --- membership -----------------------------------------------------------------

    async def register_worker(
        self, worker_id: str, names: Sequence[str], *, now: float, ttl: float
    ) -> None:
        await self._cmd("hset", f"{self.keys.ns}:workers", worker_id,
                        _dumps({"names": list(names), "expires": now + ttl}))

    async def unregister_worker(self, worker_id: str) -> None:
        await self._cmd("hdel", f"{self.keys.ns}:workers", worker_id)

    async def stranded(self, *, now: float) -> list[str]:
        workers = await self._cmd("hgetall", f"{self.keys.ns}:workers")
        served: set[str] = set()
        gone = []
        for worker_id, raw in workers.items():
            entry = orjson.loads(raw)
            if float(entry["expires"]) > now:
                served.update(entry["names"])
            else:
                gone.append(worker_id)
        if gone:
            await self._cmd("hdel", f"{self.keys.ns}:workers", *gone)
        found = []
        for name in await self._names():
            if name not in served and await self._cmd("zcard", self.keys.ready(name)):
                found.append(name)
        return found

    async def fail_stranded(
        self, name: str, *, older_than: float, now: float, limit: int, error: dict[str, Any]
    ) -> list[str]:
        failed: list[str] = []
        for shard in range(self.shard_count):
            if len(failed) >= limit:
                break
            ids = await self._op(self.keys.base_of(name, shard), "fail_stranded", older_than,
                                 now, limit - len(failed), _dumps(error), self.completed_ttl)
            failed.extend(str(i) for i in ids)
        return failed

    # --- flow control ---------------------------------------------------------------

    async def _flow_config(self) -> dict[str, FlowControl]:
        """Flow-control settings, cached for a second (local changes refresh at once)."""
        stamp, config = self._flow_cache
        if time.monotonic() - stamp < 1.0:
            return config
        fields = await self._cmd("hgetall", self.keys.meta)
        config = {}
        for field, raw in fields.items():
            if field.startswith("flow:"):
                max_concurrent, rate = orjson.loads(raw)
                config[field[5:]] = FlowControl(field[5:], max_concurrent, rate)
        self._flow_cache = (time.monotonic(), config)
        return config

    async def _flow_reserve(
        self, names: Sequence[str], limit: int, now: float, lock_ttl: float
    ) -> dict[str, tuple[int, str]]:
        """Reserve up to ``limit`` starts for each flow-controlled owner:
        owner -> (reserved, reservation prefix)."""
        config = await self._flow_config()
        if not config:
            return {}
        owners = sorted(config)
        prefixes = {o: f"res:{os.urandom(6).hex()}" for o in owners}
        calls = [
            (self.keys.flow(o), ("flow_acquire", now, limit,
                                 "" if config[o].max_concurrent is None
                                 else config[o].max_concurrent,
                                 "" if config[o].max_starts_per_second is None
                                 else config[o].max_starts_per_second,
                                 prefixes[o], now + lock_ttl))
            for o in owners
        ]
        reserved: dict[str, tuple[int, str]] = {}
        for owner, result in zip(owners, await self._batch(calls), strict=True):
            if isinstance(result, BaseException):
                raise result
            reserved[owner] = (int(result), prefixes[owner])
        return reserved

    async def _flow_settle(
        self, reserved: dict[str, tuple[int, str]], claimed: Sequence[ClaimedRun],
        expiry: float,
    ) -> None:
        if not reserved:
            return
        config = await self._flow_config()
        calls = []
        for owner, (count, prefix) in reserved.items():
            runs = [c.run_id for c in claimed if (c.owner or NO_OWNER) == owner]
            for run_id in runs:
                self._flow_runs[run_id] = owner
            rate = config.get(owner)
            calls.append((self.keys.flow(owner), (
                "flow_settle", prefix, count,
                "" if rate is None or rate.max_starts_per_second is None
                else rate.max_starts_per_second,
                expiry, *runs,
            )))
        await self._batch(calls)

    async def _flow_done(self, run_id: str) -> None:
        owner = self._flow_runs.pop(run_id, None)
        if owner is not None:
            await self._op(self.keys.flow(owner), "flow_done", run_id)

    def flow_control_set(
        self,
        owner: str,
        max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None:
        run_sync(self.aflow_control_set(owner, max_concurrent, max_starts_per_second))

    def flow_control_get(self, owner: str) -> FlowControl | None:
        return run_sync(self.aflow_control_get(owner))

    def flow_control_delete(self, owner: str) -> bool:
        return run_sync(self.aflow_control_delete(owner))

    async def aflow_control_set(
        self,
        owner: str,
        max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None:
        validate_flow_control(owner, max_concurrent, max_starts_per_second)
        await self._cmd("hset", self.keys.meta, f"flow:{owner}",
                        _dumps([max_concurrent, max_starts_per_second]))
        await self._cmd("delete", f"{self.keys.flow(owner)}:bucket")
        self._flow_cache = (-1e9, {})

    async def aflow_control_get(self, owner: str) -> FlowControl | None:
        raw = await self._cmd("hget", self.keys.meta, f"flow:{owner}")
        if raw is None:
            return None
        max_concurrent, rate = orjson.loads(raw)
        return FlowControl(owner, max_concurrent, rate)

    async def aflow_control_delete(self, owner: str) -> bool:
        self._flow_cache = (-1e9, {})
        return bool(await self._cmd("hdel", self.keys.meta, f"flow:{owner}"))

    # --- schedules ------------------------------------------------------------------

    @staticmethod
    def _schedule(row: Sequence[Any]) -> Schedule:
        _, definition, paused, next_run_at, last_run_id, last_run_at = row
        return schedule_from_store(
            definition, paused=paused == "1", next_run_at=float(next_run_at),
            last_run_id=str(last_run_id) or None,
            last_run_at=float(last_run_at) if last_run_at != "" else None,
        )

    def schedule_create(self, schedule: Schedule, *, now: float | None = None) -> Schedule:
        return run_sync(self.aschedule_create(schedule, now=now))

    def schedule_get(self, schedule_id: str) -> Schedule | None:
        return run_sync(self.aschedule_get(schedule_id))

    def schedule_list(self) -> list[Schedule]:
        return run_sync(self.aschedule_list())

    def schedule_delete(self, schedule_id: str) -> bool:
        return run_sync(self.aschedule_delete(schedule_id))

    async def aschedule_create(
        self, schedule: Schedule, *, now: float | None = None
    ) -> Schedule:
        armed, definition = schedule_to_store(schedule, now)
        row = await self._op(self.keys.schedules, "schedule_put", armed.schedule_id,
                             armed.name, definition, _seconds(armed.next_run_at.timestamp()))
        return self._schedule(row)

    async def aschedule_get(self, schedule_id: str) -> Schedule | None:
        rows = await self._op(self.keys.schedules, "schedule_get", schedule_id)
        return self._schedule(rows[0]) if rows else None

    async def aschedule_list(self) -> list[Schedule]:
        rows = await self._op(self.keys.schedules, "schedule_get")
        return [self._schedule(row) for row in rows]

    async def aschedule_delete(self, schedule_id: str) -> bool:
        return bool(int(await self._op(self.keys.schedules, "schedule_delete", schedule_id)))

    async def schedules_due(
        self, names: Sequence[str], *, now: float, limit: int
    ) -> list[Schedule]:
        if not names or limit <= 0:
            return []
        rows = await self._op(self.keys.schedules, "schedule_due", now, limit, *names)
        due = sorted((self._schedule(row) for row in rows),
                     key=lambda sc: (sc.next_run_at, sc.schedule_id))
        return due[:limit]

    async def schedule_advance(
        self,
        schedule_id: str,
        *,
        expected_next_run_at: float | None,
        next_run_at: float | None,
        run_id: str | None = None,
        run_at: float | None = None,
    ) -> bool:
        moved = await self._op(
            self.keys.schedules, "schedule_advance", schedule_id,
            "" if expected_next_run_at is None else _seconds(expected_next_run_at),
            "" if next_run_at is None else _seconds(next_run_at),
            run_id or "", "" if run_id is None or run_at is None else repr(float(run_at)),
        )
        return bool(int(moved))

    async def schedule_set_paused(
        self, schedule_id: str, paused: bool, *, next_run_at: float | None = None
    ) -> bool:
        found = await self._op(
            self.keys.schedules, "schedule_pause", schedule_id, "1" if paused else "0",
            "" if next_run_at is None else _seconds(next_run_at),
        )
        return bool(int(found))

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
