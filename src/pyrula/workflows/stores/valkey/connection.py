"""The connection side of the Valkey store: one client per event loop (and per process
after a fork), cluster detection, the script call with its NOSCRIPT reload, batching
across shards, and the checks a worker runs before it starts."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson

from pyrula.config.parse import parse_namespace, redact_url
from pyrula.errors import (
    ConfigurationError,
    JournalCorrupt,
    StaleToken,
    StoreUnavailable,
    WorkflowNotFound,
)
from pyrula.workflows._sync import SYNC_DRIVE, drive
from pyrula.workflows.events import Event
from pyrula.workflows.records import FlowControl, RunInfo, RunStatus
from pyrula.workflows.stores.common import journal_entry, started_event, submitted_event
from pyrula.workflows.stores.valkey.functions import SCRIPT, SHA
from pyrula.workflows.stores.valkey.keys import KeySpace
from pyrula.workflows.stores.valkey.resp import AsyncIO, Command, ReplyError, SyncIO, parse_url
from pyrula.workflows.stores.valkey.router import ClusterMode, Router

logger = logging.getLogger(__name__)

SCHEMES = ("redis", "rediss", "valkey", "valkeys")
#: The layout of a namespace's keys (recorded in its meta hash by the first store to use
#: it). 2: run:submitted is held by the run record, not written to the journal.
DATA_FORMAT = 2
EVICTION_CHECKS = ("error", "warn", "off")
#: Error replies that mean the server is busy or changing, not that the call is wrong.
_BUSY = ("LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "OOM")


def _dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def _loads(data: Any) -> Any:
    if data is None or data == "":
        return None
    return orjson.loads(data)


def _seconds(value: float) -> str:
    """A schedule time for a script: whole seconds print as integers (exact in Lua)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _events(run_id: str, raw: Sequence[Any], first_seq: int,
            implied: Callable[[int], Event] | None = None) -> list[Event]:
    """Journal entries of ``run_id`` as events numbered from ``first_seq``. Empty entries
    are the placeholders of events the run record holds (run:submitted at seq 1, a first
    run:started at seq 2): ``implied(seq)`` builds them. Raises JournalCorrupt for an
    entry that is not an event."""
    out = []
    for offset, item in enumerate(raw):
        seq = first_seq + offset
        if item == "" and seq <= 2:
            if implied is None:
                raise AssertionError("a read of the journal's first events needs the record")
            try:
                event = implied(seq)
            except (KeyError, ValueError) as exc:  # a record forged or cut short
                raise JournalCorrupt(run_id, seq, f"(held by the run record) cannot be "
                                     f"built from it: {type(exc).__name__}: {exc}") from None
            event["seq"] = seq
        else:
            event = journal_entry(run_id, seq, item)
        out.append(event)
    return out


def submitted_from(name: str, params: Any, owner: str, created_at: str, idem: str,
                   predecessor: str) -> Event:
    """The run:submitted event of a run, built from what its record holds (the same event
    the submitting client described)."""
    event = submitted_event(float(created_at), name, params, owner or None, idem or None)
    if predecessor:
        event["predecessor"] = predecessor
    return event


def implied_of(fields: Mapping[str, str]) -> Callable[[int], Event]:
    """The events a run record implies: seq 1 run:submitted, seq 2 its first run:started."""

    def build(seq: int) -> Event:
        if seq == 1:
            return submitted_from(fields["name"], _loads(fields.get("params")),
                                  fields.get("owner", ""), fields["created_at"],
                                  fields.get("idem", ""), fields.get("predecessor", ""))
        return started_event(float(fields["started_at"]), 1, fields["w1"])

    return build


def _url(url: str) -> tuple[str, bool]:
    """Normalise valkey:// and valkeys:// to what redis-py understands; say if TLS."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(f"ValkeyStore url {redact_url(url)!r} has no scheme (redis://host:port)")
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"ValkeyStore url scheme {scheme!r} is not one of {', '.join(SCHEMES)}"
        )
    rest = url.split("://", 1)[1]
    tls = scheme in ("rediss", "valkeys")
    return ("rediss://" if tls else "redis://") + rest, tls


class ValkeyConnection:
    """What every part of ValkeyStore shares: options, connections, the script call."""

    #: Every operation runs on the calling thread's blocking connections when driven by
    #: ``pyrula.workflows._sync.drive`` (synchronous callers need no event loop).
    sync_driven = True

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
        if namespace is not None:
            ns = parse_namespace("namespace", namespace)
        else:
            from_env = os.environ.get("PYRULA_VALKEY_NAMESPACE")
            ns = ("default" if not from_env else
                  parse_namespace("PYRULA_VALKEY_NAMESPACE", from_env))
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
        try:
            self._seed, self._link_options = parse_url(self.url, socket_timeout)
        except ValueError as exc:
            raise ConfigurationError(f"ValkeyStore url {redact_url(url)!r}: {exc}") from None
        self._mode = ClusterMode(cluster)
        self._lock = threading.Lock()
        self._routers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Router] = (
            weakref.WeakKeyDictionary()
        )
        self._closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._thread_routers: weakref.WeakSet[Router] = weakref.WeakSet()
        self._local = threading.local()
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
        # (name, shard) -> the doorbell's score for it when a claim of this store last
        # visited it (a higher score since: rung again, visit it first).
        self._claim_seen: dict[tuple[str, int], float] = {}
        # When the next timer of the shards this store scans falls due (from wake_due).
        self._next_wake: float | None = None
        # The shard the last doorbell token named: (name, shard), claimed first next.
        self._hint: tuple[str, int] | None = None
        # names -> (when read, each name's doorbell) for claims in quick succession.
        self._rings_cache: dict[tuple[str, ...], tuple[float, list[list[tuple[str, float]]]]] = {}

    # --- connections ----------------------------------------------------------------

    def _router(self) -> Router:
        """The router of this event loop, or of this thread for a synchronous call."""
        if SYNC_DRIVE.get():
            return self._thread_router()
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._pid != os.getpid():  # never reuse a parent's sockets after fork
                self._forget_all()
            router = self._routers.get(loop)
            if router is not None:
                return router
            router = Router(AsyncIO(), self._seed, self._link_options, self._mode,
                            max_blocking=self._max_connections)
            self._routers[loop] = router
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
        if router is None or getattr(local, "pid", None) != os.getpid() or router.closed:
            router = Router(SyncIO(), self._seed, self._link_options, self._mode)
            local.router, local.pid = router, os.getpid()
            with self._lock:
                self._thread_routers.add(router)
        return router

    def _forget_all(self) -> None:
        """After a fork: the parent's connections belong to the parent."""
        self._routers = weakref.WeakKeyDictionary()
        self._closers = weakref.WeakKeyDictionary()
        self._thread_routers = weakref.WeakSet()
        self._local = threading.local()
        self._pid = os.getpid()

    @property
    def _is_cluster(self) -> bool | None:
        return self._mode.cluster

    async def _cluster(self) -> bool:
        return await self._router().is_cluster()

    def _where(self) -> str:
        return str(self._seed)

    async def load_script(self) -> None:
        """Load this build's script (on every primary of a cluster)."""
        for where, reply in await self._router().each_primary(("SCRIPT", "LOAD", SCRIPT)):
            if isinstance(reply, ReplyError):
                raise StoreUnavailable(f"Valkey at {where} refused SCRIPT LOAD: {reply}")

    async def _call(self, key: str | None, *command: Any, idempotent: bool = False) -> Any:
        """One plain command; an error reply is raised as the store's error."""
        self.stats["round_trips"] += 1
        reply = await self._router().call(key, *command, idempotent=idempotent)
        if isinstance(reply, ReplyError):
            raise self._plain_error(reply)
        return reply

    async def _read(self, key: str | None, *command: Any) -> Any:
        return await self._call(key, *command, idempotent=True)

    async def _pipeline(self, commands: Sequence[tuple[str | None, Command]],
                        *, idempotent: bool = False) -> list[Any]:
        """Plain commands in one round trip (grouped by node on a cluster); replies in
        order, error replies in place as the store's errors."""
        if not commands:
            return []
        self.stats["round_trips"] += 1
        replies = await self._router().execute([c for _, c in commands],
                                               [k for k, _ in commands],
                                               idempotent=idempotent)
        return [self._plain_error(r) if isinstance(r, ReplyError) else r for r in replies]

    async def _blocking(self, key: str, commands: Sequence[Command], block: float) -> list[Any]:
        self.stats["round_trips"] += 1
        replies = await self._router().blocking(key, commands, block)
        return [self._plain_error(r) if isinstance(r, ReplyError) else r for r in replies]

    async def _op(self, base: str | tuple[str, ...], *args: Any) -> Any:
        """EVALSHA one operation on one shard; reload the script once on NOSCRIPT."""
        result = (await self._eval([(base, args)]))[0]
        if isinstance(result, BaseException):
            raise result
        return result

    async def _batch(self, calls: Sequence[tuple[str | tuple[str, ...], tuple[Any, ...]]]
                     ) -> list[Any]:
        """Several operations on several shards in one round trip (grouped by node on a
        cluster). Errors are returned in place, not raised."""
        if not calls:
            return []
        return await self._eval(calls)

    async def _eval(self, calls: Sequence[tuple[str | tuple[str, ...], tuple[Any, ...]]],
                    extra: Sequence[tuple[str | None, Command]] = ()) -> list[Any]:
        """EVALSHA each call (its keys: a shard's base, or a tuple of keys led by it), then
        the plain ``extra`` commands, in one round trip; the script is reloaded once if the
        server lost it. Results in order (``extra``'s last), errors in place."""
        commands: list[Command] = []
        keys: list[str | None] = []
        for base, args in calls:
            names = (base,) if isinstance(base, str) else base
            commands.append(("EVALSHA", SHA, len(names), *names, *args))
            keys.append(names[0])
        commands.extend(c for _, c in extra)
        keys.extend(k for k, _ in extra)
        router = self._router()
        self.stats["round_trips"] += 1
        results = await router.execute(commands, keys)
        # A flush can land between the calls of one batch: re-send only the calls refused
        # with NOSCRIPT (they did not run); the others must not run twice.
        refused = [i for i in range(len(calls)) if _noscript(results[i])]
        if refused:
            await self.load_script()
            self.stats["round_trips"] += 1
            again = await router.execute([commands[i] for i in refused],
                                         [keys[i] for i in refused])
            for i, result in zip(refused, again, strict=True):
                results[i] = result
        out: list[Any] = []
        for i, result in enumerate(results):
            if isinstance(result, ReplyError):
                out.append(self._translate(result, calls[i][1]) if i < len(calls)
                           else self._plain_error(result))
            else:
                out.append(result)
        return out

    def _hidden_cluster(self, exc: Exception) -> ConfigurationError:
        return ConfigurationError(
            f"Valkey at {self._where()} redirected a command ({exc}): it is a cluster that "
            "does not report itself as one; pass cluster=True (CLI: --cluster)"
        )

    def _plain_error(self, reply: ReplyError) -> Exception:
        if reply.code in ("MOVED", "ASK", "CROSSSLOT"):
            return self._hidden_cluster(reply)
        if reply.code == "NOPERM":
            return ConfigurationError(
                f"Valkey at {self._where()} refused a command to this store's user: {reply}"
            )
        return StoreUnavailable(f"Valkey at {self._where()}: {reply}")

    def _translate(self, reply: ReplyError, args: Sequence[Any]) -> Exception:
        message = str(reply)
        run_id = str(args[1]) if len(args) > 1 else "?"
        if message.startswith("STALE"):
            current = message.split(" ", 1)[1] if " " in message else None
            return StaleToken(run_id, int(args[2]) if len(args) > 2 else -1,
                              int(current) if current and current.isdigit() else None)
        if message.startswith("NOTFOUND"):
            return WorkflowNotFound(f"no run with id {run_id!r}")
        if reply.code in ("MOVED", "ASK", "CROSSSLOT") or "CROSSSLOT" in message:
            return self._hidden_cluster(reply)
        if reply.code == "NOSCRIPT":
            return StoreUnavailable(
                f"Valkey at {self._where()}: NOSCRIPT after reloading ({message})"
            )
        if reply.code in _BUSY:
            return StoreUnavailable(f"Valkey at {self._where()}: {message}")
        return StoreUnavailable(f"Valkey script error: {message}")

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
        await self._check_eviction()
        for name in names:
            await self._register_name(name)
        await self.load_script()

    async def _check_eviction(self) -> None:
        if self.eviction_policy_check == "off":
            return
        replies = await self._router().each_primary(("INFO", "memory"))
        where, reply = replies[0]
        if isinstance(reply, ReplyError):
            if reply.code == "NOPERM":
                logger.warning("cannot read INFO memory to check the eviction policy")
                return
            raise StoreUnavailable(f"Valkey at {where}: {reply}")
        memory = parse_info(str(reply))
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
        meta = self.keys.meta
        replies = await self._pipeline([
            (meta, ("HGET", meta, "format")),
            (meta, ("HSETNX", meta, field, self.shard_count)),
            (meta, ("HGET", meta, field)),
        ])
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        found, _, recorded = replies
        if found is None:
            await self._claim_format(name)
        elif int(found) != DATA_FORMAT:
            raise self._wrong_format(int(found))
        if int(recorded) != self.shard_count:
            raise ConfigurationError(
                f"workflow {name!r} was recorded with shard_count={recorded} in namespace "
                f"{self.namespace!r}, this store has shard_count={self.shard_count}; use the "
                "same shard_count on every worker (drain a name before changing its count)"
            )
        self._known_names.add(name)

    async def _claim_format(self, name: str) -> None:
        """A namespace without a recorded data format is new, or was written by a build
        older than the format's record: in that case other names are registered already."""
        meta = self.keys.meta
        fields = await self._read(meta, "HKEYS", meta)
        if any(f.startswith("shards:") and f != f"shards:{name}" for f in fields):
            raise self._wrong_format(1)
        await self._call(meta, "HSETNX", meta, "format", DATA_FORMAT)
        found = await self._read(meta, "HGET", meta, "format")
        if int(found) != DATA_FORMAT:
            raise self._wrong_format(int(found))

    def _wrong_format(self, found: int) -> ConfigurationError:
        return ConfigurationError(
            f"namespace {self.namespace!r} in Valkey at {self._where()} holds runs in data "
            f"format {found}; this build reads and writes format {DATA_FORMAT}. Drain the "
            "namespace with the build that wrote it (or use another namespace) first"
        )

    async def _names(self) -> list[str]:
        fields = await self._read(self.keys.meta, "HKEYS", self.keys.meta)
        return sorted(f[len("shards:"):] for f in fields if f.startswith("shards:"))

    # --- lifecycle ------------------------------------------------------------------

    async def bind(
        self, project: str | None, environment: str | None
    ) -> tuple[str | None, str | None]:
        recorded: list[str | None] = []
        meta = self.keys.meta
        for key, value in (("project", project), ("environment", environment)):
            if value is not None:
                await self._call(meta, "HSETNX", meta, f"binding.{key}", value)
            found = await self._read(meta, "HGET", meta, f"binding.{key}")
            recorded.append(None if found is None else str(found))
        return recorded[0], recorded[1]

    async def aping(self) -> None:
        await self._read(None, "PING")

    async def server_time(self) -> float:
        """The server's clock (``TIME``) in epoch seconds: the clock the locks, shard leases
        and timers of this store are judged by (a worker reads it through ``StoreClock``).
        On a cluster, the clock of whichever node answers."""
        seconds, micros = await self._read(None, "TIME")
        return int(seconds) + int(micros) / 1_000_000

    def ping(self) -> None:
        drive(self.aping())

    async def aclose(self) -> None:
        """Close this event loop's connections."""
        loop = asyncio.get_running_loop()
        with self._lock:
            router = self._routers.pop(loop, None)
            closer = self._closers.pop(loop, None)
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

    def __repr__(self) -> str:
        return (f"ValkeyStore({self._where()!r}, namespace={self.namespace!r}, "
                f"shard_count={self.shard_count})")


async def _closer(router: Router) -> AsyncIterator[None]:
    try:
        yield
    finally:
        router.close()


def _noscript(result: Any) -> bool:
    return isinstance(result, ReplyError) and result.code == "NOSCRIPT"


def parse_info(text: str) -> dict[str, str]:
    """``INFO`` text as a dict of its ``field:value`` lines."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and ":" in line:
            field, _, value = line.partition(":")
            out[field] = value.strip()
    return out


def as_hash(reply: Sequence[Any] | None) -> dict[str, str]:
    """A flat ``HGETALL`` reply as a dict."""
    if not reply:
        return {}
    it = iter(reply)
    return dict(zip(it, it, strict=True))


def as_scored(reply: Sequence[Any] | None) -> list[tuple[str, float]]:
    """A flat ``... WITHSCORES`` reply as (member, score) pairs."""
    if not reply:
        return []
    it = iter(reply)
    return [(str(member), float(score)) for member, score in zip(it, it, strict=True)]
