"""What ``worker.run()`` checks against the server before any loop starts: the eviction
policy, the shard count recorded for each name, and that the server answers at all."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pyrula.workflows import ConfigurationError, StoreUnavailable, ValkeyStore
from pyrula.workflows.stores.valkey.functions import SHA
from tests.integration.valkey_support import (
    captured_logs,
    make_worker,
    one_step,
    opened,
    serving,
)
from tests.servers import Server

NAME = "vk.one_step"


def _set_policy(server: Server, maxmemory: str, policy: str) -> None:
    with server.client() as admin:
        admin.config_set("maxmemory", maxmemory)
        admin.config_set("maxmemory-policy", policy)


async def _refused_before_any_loop(store: ValkeyStore, error: type[Exception], match: str,
                                   server: Server | None = None, **options: Any) -> None:
    """run() raises ``error`` and nothing started: no probe, no loop, nothing written."""
    worker = make_worker(store, [one_step], health_port=0, **options)
    with pytest.raises(error, match=match):
        await worker.run()
    assert worker.health_address is None
    assert worker.state == "starting"
    assert worker.in_flight == 0
    if server is not None:
        with server.client() as admin:
            assert admin.dbsize() == 0
            assert admin.script_exists(SHA) == [False]
            assert admin.function_list() == []


# --- eviction policy --------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
async def test_an_allkeys_policy_with_maxmemory_stops_run_before_any_loop(
    fresh_valkey_server: Server, policy: str
) -> None:
    _set_policy(fresh_valkey_server, "100mb", policy)
    store = ValkeyStore(url=fresh_valkey_server.url, namespace="ns")
    async with opened(store):
        with captured_logs() as logs:
            await _refused_before_any_loop(
                store, ConfigurationError, f"maxmemory-policy {policy}.*eviction_policy_check",
                fresh_valkey_server,
            )
        assert not logs.events("worker_started")


@pytest.mark.parametrize("how", ["argument", "environment"])
async def test_eviction_policy_check_warn_starts_with_a_warning(
    fresh_valkey_server: Server, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _set_policy(fresh_valkey_server, "100mb", "allkeys-lru")
    if how == "environment":
        monkeypatch.setenv("PYRULA_VALKEY_EVICTION_CHECK", "warn")
        store = ValkeyStore(url=fresh_valkey_server.url, namespace="ns")
    else:
        store = ValkeyStore(url=fresh_valkey_server.url, namespace="ns",
                            eviction_policy_check="warn")
    assert store.eviction_policy_check == "warn"
    await _runs_with_one_eviction_warning(store, "allkeys-lru")


async def test_a_volatile_policy_only_warns(fresh_valkey_server: Server) -> None:
    _set_policy(fresh_valkey_server, "100mb", "volatile-lru")
    store = ValkeyStore(url=fresh_valkey_server.url, namespace="ns")
    assert store.eviction_policy_check == "error"
    await _runs_with_one_eviction_warning(store, "volatile-lru")


async def test_noeviction_starts_without_a_warning(fresh_valkey_server: Server) -> None:
    _set_policy(fresh_valkey_server, "100mb", "noeviction")
    store = ValkeyStore(url=fresh_valkey_server.url, namespace="ns")
    async with opened(store):
        with captured_logs() as logs:
            worker = make_worker(store, [one_step])
            async with serving(worker):
                run = await worker.client.submit(one_step, {"tag": "noeviction"})
                assert await worker.client.result(run.run_id, timeout=10) == "noeviction"
        assert logs.events("valkey_eviction_policy") == []


async def _runs_with_one_eviction_warning(store: ValkeyStore, policy: str) -> None:
    async with opened(store):
        with captured_logs() as logs:
            worker = make_worker(store, [one_step])
            async with serving(worker):
                run = await worker.client.submit(one_step, {"tag": policy})
                assert await worker.client.result(run.run_id, timeout=10) == policy
        [warning] = logs.events("valkey_eviction_policy")
        assert warning.levelname == "WARNING"
        assert policy in warning.getMessage()
        # Logged while preparing, before the worker started its loops.
        started = logs.events("worker_started")
        assert started and logs.records.index(warning) < logs.records.index(started[0])


# --- shard count ------------------------------------------------------------------------


async def test_a_different_shard_count_for_a_recorded_name_is_refused(
    valkey_url: str, valkey_namespace: str
) -> None:
    recorded = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=64)
    other = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=16)
    async with opened(recorded, other):
        await recorded.submit(NAME, {"tag": "x"}, now=time.time())
        match = r"shard_count=64.*shard_count=16"
        await _refused_before_any_loop(other, ConfigurationError, match)
        with pytest.raises(ConfigurationError, match=match):
            await make_worker(other, [one_step]).client.submit(one_step, {"tag": "y"})
        # The count is per name: another name takes this store's count.
        handle, created = await other.submit("vk.another_name", {}, now=time.time())
        assert created
        # And the recorded count still serves.
        worker = make_worker(recorded, [one_step])
        async with serving(worker):
            run = await worker.client.submit(one_step, {"tag": "z"})
            assert await worker.client.result(run.run_id, timeout=10) == "z"


# --- a server that does not answer ------------------------------------------------------


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections (the kernel completes them) and never replies."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_server_that_never_answers_info_raises_store_unavailable(
    silent_port: int, closed_port: int
) -> None:
    stores = [ValkeyStore(url=f"redis://127.0.0.1:{port}", namespace="ns", socket_timeout=0.2)
              for port in (silent_port, silent_port, closed_port, closed_port)]
    async with opened(*stores):

        async def submit(store: ValkeyStore) -> None:
            with pytest.raises(StoreUnavailable, match="INFO"):
                await make_worker(store, [one_step]).client.submit(one_step, {"tag": "x"})

        # A starting worker waits for its store as a running one does; --store-wait
        # bounds the wait for those who would rather fail.
        await asyncio.gather(
            _refused_before_any_loop(stores[0], StoreUnavailable,
                                     "unreachable for 0.3 s: .*does not answer INFO",
                                     store_wait=0.3),
            submit(stores[1]),
            _refused_before_any_loop(stores[2], StoreUnavailable,
                                     "unreachable for 0.3 s: .*does not answer INFO",
                                     store_wait=0.3),
            submit(stores[3]),
        )


async def test_a_namespace_written_in_another_data_format_is_refused(
    fresh_valkey_server: Server,
) -> None:
    """Data written by a build with another key layout is not misread: the worker (and a
    client) refuse the namespace, naming both formats and what to do."""
    with fresh_valkey_server.client() as admin:
        admin.hset("older:meta", mapping={"shards:vk.other": 64})  # no format: format 1
        admin.hset("newer:meta", mapping={"format": 99, "shards:vk.one_step": 64})
    for namespace, found in (("older", 1), ("newer", 99)):
        store = ValkeyStore(url=fresh_valkey_server.url, namespace=namespace)
        async with opened(store):
            await _refused_before_any_loop(store, ConfigurationError,
                                           f"data format {found};.*format 2.*Drain")
            with pytest.raises(ConfigurationError, match=f"data format {found}"):
                await store.submit(NAME, {}, now=time.time())
    fresh = ValkeyStore(url=fresh_valkey_server.url, namespace="fresh")
    async with opened(fresh):
        await fresh.submit(NAME, {}, now=time.time())
    with fresh_valkey_server.client(decode_responses=True) as admin:
        assert admin.hget("fresh:meta", "format") == "2"


# --- a server that is not there yet -----------------------------------------------------


def _readyz(address: tuple[str, int]) -> tuple[int, str]:
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/readyz",
                                    timeout=2) as reply:
            return reply.status, json.loads(reply.read())["status"]
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())["status"]


async def test_a_worker_started_before_its_server_waits_for_it_then_serves(
    tmp_path: Any,
) -> None:
    from tests.servers import free_port, start_server

    port = free_port()
    store = ValkeyStore(url=f"redis://127.0.0.1:{port}", namespace="late", socket_timeout=0.5)
    worker = make_worker(store, [one_step], health_port=0)
    with captured_logs("pyrula.store_wait") as logs:
        async with opened(store):
            task = asyncio.create_task(worker.run())
            try:
                deadline = time.monotonic() + 30
                while not logs.events("store_unreachable"):
                    assert time.monotonic() < deadline and not task.done()
                    await asyncio.sleep(0.05)
                assert worker.health_address is not None
                assert await asyncio.to_thread(_readyz, worker.health_address) == (
                    503, "store_unreachable")
                server = await asyncio.to_thread(start_server, tmp_path, port=port)
                try:
                    while worker.state != "ready":
                        assert time.monotonic() < deadline + 30 and not task.done()
                        await asyncio.sleep(0.05)
                    handle = await worker.client.submit(one_step, {"tag": "late"})
                    assert await worker.client.result(handle.run_id, timeout=30) is not None
                finally:
                    worker.stop()
                    await task
                    await asyncio.to_thread(server.stop)
            finally:
                if not task.done():
                    task.cancel()
    assert len(logs.events("store_unreachable")) == 1  # one line for the whole outage
    assert len(logs.events("store_reachable")) == 1


# --- the way to the first claim ------------------------------------------------------


async def test_a_worker_start_reads_and_writes_the_namespace_in_few_round_trips(
    fresh_valkey_server: Server,
) -> None:
    # A fleet child's start is on the way to its first run: every workflow name is
    # registered in one round trip, the binding written and read (with the meta hash the
    # first claim's flow control needs) in one more, and the script is loaded only when the
    # server answers NOSCRIPT, not ahead of every start.
    store = ValkeyStore(url=fresh_valkey_server.url, namespace="ns")
    names = [f"vk.name{i}" for i in range(7)]
    async with opened(store):
        conn = store.connection
        with fresh_valkey_server.client() as admin:
            admin.hset("ns:meta", "flow:acme", "[2, null]")  # flow control set before
        before = conn.stats["round_trips"]
        await store.prepare(names)
        # One batch, plus the script's load and the batch again on this fresh server.
        assert conn.stats["round_trips"] - before == 2
        assert sorted(await store.registry.names()) == names
        again = ValkeyStore(url=fresh_valkey_server.url, namespace="ns")
        async with opened(again):
            before = again.connection.stats["round_trips"]
            await again.prepare(names)
            assert again.connection.stats["round_trips"] - before == 1
            assert await again.bind("billing", "prod") == ("billing", "prod")
            assert again.connection.stats["round_trips"] - before == 2
            assert set(await again.flow._config()) == {"acme"}  # no round trip: primed
            assert again.connection.stats["round_trips"] - before == 2
        assert await store.bind("other", None) == ("billing", "prod")  # the first wins
