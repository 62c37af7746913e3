"""The store's own transport: slot routing, a cluster that moves slots under it, a server
that restarts under it, and synchronous callers that need no event loop.

Real servers and real clusters throughout; the cluster is moved with the same commands an
operator's resharding tool sends (CLUSTER SETSLOT ... MIGRATING / IMPORTING, MIGRATE).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot as reference_slot

from pyrula.workflows import RunStatus, StoreUnavailable, ValkeyStore
from pyrula.workflows.stores.valkey.router import key_slot
from tests.integration.valkey_support import opened
from tests.servers import Cluster, Server, start_cluster

NAME = "vk.transport"
ROOT = Path(__file__).resolve().parents[2]


def test_key_slots_match_the_cluster_spec() -> None:
    keys = ["foo", "bar", "{user1000}.following", "{user1000}.followers", "a{}b", "{}x",
            "x{y}z{w}", "ns:{3f2a9c0b1d2e.17}:run:abc", "ünïcödé", "{", "}{", ""]
    keys += [f"pyrula:{{{i:012x}.{i % 64}}}:q:owner" for i in range(200)]
    for key in keys:
        assert key_slot(key) == reference_slot(key.encode()), key


# --- one server ---------------------------------------------------------------------


async def test_a_restarted_server_is_met_by_reconnecting_not_by_an_error(
    fresh_valkey_server: Server,
) -> None:
    store = ValkeyStore(url=fresh_valkey_server.url, namespace="ns", shard_count=2)
    async with opened(store):
        handle, _ = await store.submit(NAME, {"n": 1}, now=time.time())
        fresh_valkey_server.restart()
        # The old connection is dead; the next calls open a new one (the data is gone: the
        # test server keeps nothing on disk).
        assert await store.get_run(handle.run_id) is None
        again, created = await store.submit(NAME, {"n": 2}, now=time.time())
        assert created
        info = await store.get_run(again.run_id)
        assert info is not None and info.status is RunStatus.QUEUED


async def test_an_unreachable_server_is_store_unavailable(fresh_valkey_server: Server) -> None:
    store = ValkeyStore(url=fresh_valkey_server.url, namespace="ns", shard_count=2)
    async with opened(store):
        await store.submit(NAME, {}, now=time.time())
        fresh_valkey_server.stop()
        with pytest.raises(StoreUnavailable, match=str(fresh_valkey_server.port)):
            await store.submit(NAME, {}, now=time.time())
        with pytest.raises(StoreUnavailable):
            await store.get_run(store.keys.new_run_id(NAME, 0))


# --- synchronous callers ------------------------------------------------------------

_SYNC_SCRIPT = """
import json, sys, threading
from pyrula.workflows import SyncWorkflowClient, ValkeyStore
store = ValkeyStore(url=sys.argv[1], namespace="syncdrive", shard_count=4)
client = SyncWorkflowClient(store)
handles = [client.submit("vk.sync", {"i": i}, idempotency_key=f"k{i % 5}") for i in range(20)]
info = client.get(handles[0].run_id)
listed = list(client.list_runs(name="vk.sync"))
events = client.events(handles[0].run_id)
cancelled = client.cancel(handles[1].run_id)
store.ping()
store.flow_control_set("tenant", max_concurrent=2)
print(json.dumps({
    "distinct": len({h.run_id for h in handles}),
    "status": info.status.value, "listed": len(listed), "events": [e["type"] for e in events],
    "cancelled": cancelled, "flow": store.flow_control_get("tenant").max_concurrent,
    "threads": sorted(t.name for t in threading.enumerate()),
}))
store.close()
"""


def test_a_sync_client_runs_on_the_calling_thread(fresh_valkey_server: Server) -> None:
    """SyncWorkflowClient and the store's sync admin calls run on the caller's thread: no
    background event loop is started for them."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", _SYNC_SCRIPT, fresh_valkey_server.url],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["distinct"] == 5  # idempotency keys held
    assert out["status"] == "queued" and out["listed"] == 5
    assert out["events"] == ["run:submitted"]
    assert out["cancelled"] is True and out["flow"] == 2
    assert out["threads"] == ["MainThread"]


_FORK_SCRIPT = """
import asyncio, os, sys
from pyrula.workflows import SyncWorkflowClient, ValkeyStore
store = ValkeyStore(url=sys.argv[1], namespace="forked", shard_count=2)
client = SyncWorkflowClient(store)

async def on_a_loop(tag):
    for i in range(100):
        handle, _ = await store.submit("vk.fork", {"who": tag, "i": i}, now=0.0)
        assert (await store.get_run(handle.run_id)).params == {"who": tag, "i": i}

def calls(tag):
    for i in range(100):
        handle = client.submit("vk.fork", {"who": tag, "i": i})
        assert client.get(handle.run_id).params == {"who": tag, "i": i}
    asyncio.run(on_a_loop(tag))

calls("before")  # the parent's connections are open when it forks
pid = os.fork()
calls("child" if pid == 0 else "parent")
if pid == 0:
    os._exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
print("ok")
"""


def test_a_store_used_before_a_fork_opens_its_own_connections_in_the_child(
    fresh_valkey_server: Server,
) -> None:
    """Parent and child call the server at once through the store made before the fork:
    each gets its own replies (a socket shared across the fork would mix them)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", _FORK_SCRIPT, fresh_valkey_server.url],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_a_sync_caller_whose_connection_the_server_closed_goes_on(
    fresh_valkey_server: Server,
) -> None:
    """The server closes a synchronous caller's idle connection (``CLIENT KILL``, as a
    server's ``timeout`` or a proxy would): whatever calls come next, reads or writes in
    an order drawn here, each goes through on a new connection, never an error."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from pyrula.workflows import SyncWorkflowClient

    store = ValkeyStore(url=fresh_valkey_server.url, namespace="closed", shard_count=2)
    client = SyncWorkflowClient(store)
    admin = fresh_valkey_server.client()

    @settings(max_examples=12, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(calls=st.lists(st.sampled_from(["read", "write", "kill"]), min_size=1, max_size=6))
    def check(calls: list[str]) -> None:
        handle = client.submit(NAME, {"n": 0})
        for call in calls:
            if call == "kill":
                admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            elif call == "read":
                assert client.get(handle.run_id).status is RunStatus.QUEUED
            else:
                handle = client.submit(NAME, {"n": len(calls)})

    try:
        check()
    finally:
        admin.close()
        store.close()


def test_a_sync_call_to_a_server_that_stopped_answering_times_out(
    fresh_valkey_server: Server,
) -> None:
    """A synchronous caller's socket is blocking with its timeout set in the kernel (one
    send and one receive a round trip): a server that stops answering (SIGSTOP, as a VM
    paused or a host swapping) is StoreUnavailable after about ``socket_timeout``, drawn
    here, not a hang; once it answers again the next call goes through."""
    import signal

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    pid = fresh_valkey_server.pid
    assert pid is not None

    @settings(max_examples=4, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(timeout=st.floats(0.05, 0.6))
    def check(timeout: float) -> None:
        store = ValkeyStore(url=fresh_valkey_server.url, namespace="silent", shard_count=2,
                            socket_timeout=timeout)
        try:
            store.ping()  # connected: a blocking socket with the kernel's timeout
            os.kill(pid, signal.SIGSTOP)
            try:
                began = time.monotonic()
                with pytest.raises(StoreUnavailable):
                    store.ping()
                waited = time.monotonic() - began
            finally:
                os.kill(pid, signal.SIGCONT)
            assert timeout * 0.9 <= waited < timeout * 4 + 2.0, (timeout, waited)
            store.ping()
        finally:
            store.close()

    check()


# --- a cluster moving slots ---------------------------------------------------------


@pytest.fixture
def moving_cluster(tmp_path: Path) -> Cluster:
    cluster = start_cluster(tmp_path, primaries=3, replicas_per_primary=0)
    try:
        yield cluster  # type: ignore[misc]
    finally:
        cluster.kill()


def _node_id(node: Server) -> str:
    with node.client(decode_responses=True) as client:
        return str(client.execute_command("CLUSTER", "MYID"))


def _owner_of(cluster: Cluster, slot: int) -> Server:
    with cluster.nodes[0].client(decode_responses=True) as client:
        for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
            if int(start) <= slot <= int(end):
                return next(n for n in cluster.nodes if n.port == int(primary[1]))
    raise AssertionError(f"no node owns slot {slot}")


def _begin_migration(source: Server, target: Server, slot: int) -> None:
    with target.client() as t:
        t.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", _node_id(source))
    with source.client() as s:
        s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", _node_id(target))


def _migrate_keys(source: Server, target: Server, slot: int) -> int:
    with source.client(decode_responses=True) as s:
        keys = s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
        if keys:
            s.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys)
    return len(keys)


def _finish_migration(cluster: Cluster, target: Server, slot: int) -> None:
    target_id = _node_id(target)
    for node in cluster.nodes:
        with node.client() as client:
            client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)


def _run_slot(store: ValkeyStore, run_id: str) -> int:
    return key_slot(store.keys.run(run_id))


async def test_a_slot_moved_to_another_node_is_followed(moving_cluster: Cluster) -> None:
    """MOVED: the store's slot map is stale after a reshard; it follows the redirect."""
    store = ValkeyStore(url=moving_cluster.url, namespace="mv", shard_count=2)
    async with opened(store):
        handle, _ = await store.submit(NAME, {"n": 1}, now=time.time(), idempotency_key="a")
        slot = _run_slot(store, handle.run_id)
        source = _owner_of(moving_cluster, slot)
        target = next(n for n in moving_cluster.nodes if n is not source)
        _begin_migration(source, target, slot)
        assert _migrate_keys(source, target, slot) >= 2
        _finish_migration(moving_cluster, target, slot)

        info = await store.get_run(handle.run_id)  # asks the old owner first: MOVED
        assert info is not None and info.params == {"n": 1}
        again, created = await store.submit(NAME, {"n": 9}, now=time.time(),
                                            idempotency_key="a")
        assert again.run_id == handle.run_id and not created  # the moved key was found
        claimed = await store.claim("w", [NAME], limit=5, now=time.time(), lock_ttl=30)
        assert handle.run_id in {c.run_id for c in claimed}


async def test_keys_already_migrated_are_reached_through_ask(moving_cluster: Cluster) -> None:
    """ASK: in the middle of a migration the old owner sends us to the new one for keys it
    no longer has; the slot map is not changed by it."""
    store = ValkeyStore(url=moving_cluster.url, namespace="ask", shard_count=2)
    async with opened(store):
        handle, _ = await store.submit(NAME, {"n": 2}, now=time.time(), idempotency_key="b")
        slot = _run_slot(store, handle.run_id)
        source = _owner_of(moving_cluster, slot)
        target = next(n for n in moving_cluster.nodes if n is not source)
        _begin_migration(source, target, slot)
        assert _migrate_keys(source, target, slot) >= 2
        try:
            info = await store.get_run(handle.run_id)
            assert info is not None and info.params == {"n": 2}
            events = await store.read_events(handle.run_id)
            assert [e["type"] for e in events] == ["run:submitted"]
        finally:
            _finish_migration(moving_cluster, target, slot)


def test_a_sync_client_follows_a_cluster(valkey_cluster: Cluster) -> None:
    from pyrula.workflows import SyncWorkflowClient

    store = ValkeyStore(url=valkey_cluster.url, namespace=f"sc{os.getpid()}", shard_count=8)
    client = SyncWorkflowClient(store)
    try:
        runs = [client.submit(NAME, {"i": i}) for i in range(40)]
        slots = {_run_slot(store, r.run_id) for r in runs}
        assert len(slots) > 1  # spread over the cluster's nodes
        assert all(client.get(r.run_id).params == {"i": i} for i, r in enumerate(runs))
    finally:
        store.close()


def test_redis_py_agrees_with_what_the_store_wrote(fresh_valkey_server: Server) -> None:
    """A run written by the store reads back through a plain client (the data model is
    ordinary keys, not something only our transport understands)."""
    from pyrula.workflows import SyncWorkflowClient

    store = ValkeyStore(url=fresh_valkey_server.url, namespace="plain", shard_count=2)
    run = SyncWorkflowClient(store).submit(NAME, {"x": "é"})
    with redis.Redis.from_url(fresh_valkey_server.url, decode_responses=True) as plain:
        fields = plain.hgetall(store.keys.run(run.run_id))
    assert json.loads(fields["params"]) == {"x": "é"}
    store.close()
