"""``durability="replicated"`` against real servers: a primary with one replica, whose
replica is frozen (SIGSTOP) to show that a write returns only once the replica has it and
is reported unavailable when the replica does not answer in time; and a standalone server
with no replica, which a replicated worker refuses at start."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.workflows import (
    ConfigurationError,
    StoreUnavailable,
    SyncWorkflowClient,
    ValkeyStore,
)
from tests.conftest import wait_until
from tests.integration.valkey_support import make_worker, one_step, opened
from tests.servers import Server, start_cluster, start_server

pytestmark = pytest.mark.valkey

NAME = "vk.one_step"


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Server, Server]]:
    """A primary and its one replica, in sync."""
    primary = start_server(tmp_path / "primary")
    replica = start_server(tmp_path / "replica", replicaof=f"{primary.host} {primary.port}")
    try:
        def online() -> bool:
            with primary.client(decode_responses=True) as admin:
                info = admin.info("replication")
            return int(info.get("connected_slaves", 0)) == 1 and \
                info["slave0"]["state"] == "online"
        wait_until(online, 15, what="the replica in sync with its primary")
        with primary.client() as admin:  # its first acknowledgement can take a second
            admin.set("warm", 1)
            assert admin.execute_command("WAIT", 1, 10_000) == 1
            admin.delete("warm")
        yield primary, replica
    finally:
        replica.kill()
        primary.kill()


def _on(server: Server, key_prefix: str) -> list[str]:
    with server.client(decode_responses=True) as admin:
        return sorted(admin.scan_iter(match=key_prefix + "*"))


def _frozen(replica: Server) -> int:
    pid = replica.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    return pid


def test_a_submit_returns_only_once_the_replica_has_the_run(pair: tuple[Server, Server]
                                                            ) -> None:
    primary, replica = pair
    store = ValkeyStore(primary.url, namespace="dur", durability="replicated",
                        replica_timeout=8.0)
    client = SyncWorkflowClient(store)
    try:
        client.submit(NAME, {"tag": "warm"})  # registers the name: only the submit waits below
        returned: list[float] = []
        keys_before = _on(primary, "dur:")
        pid = _frozen(replica)
        submitter = threading.Thread(
            target=lambda: (client.submit(NAME, {"tag": "a"}), returned.append(time.monotonic())))
        submitter.start()
        try:
            # Not back while the replica cannot have it (the primary has it at once).
            submitter.join(0.5)
            assert returned == []
            assert len(_on(primary, "dur:")) > len(keys_before)
        finally:
            resumed = time.monotonic()
            os.kill(pid, signal.SIGCONT)
        submitter.join(10)
        assert returned and returned[0] >= resumed
        assert _on(replica, "dur:") == _on(primary, "dur:")
    finally:
        os.kill(replica.pid or 0, signal.SIGCONT)
        store.close()


def test_a_write_no_replica_took_in_time_is_unavailable_and_its_outcome_unknown(
    pair: tuple[Server, Server]
) -> None:
    primary, replica = pair
    store = ValkeyStore(primary.url, namespace="dur", durability="replicated",
                        replica_timeout=0.3)
    client = SyncWorkflowClient(store)
    try:
        client.submit(NAME, {"tag": "warm"})
        before = len(list(client.list_runs(name=NAME)))
        pid = _frozen(replica)
        try:
            began = time.monotonic()
            with pytest.raises(StoreUnavailable, match="0 of 1 replicas acknowledged"):
                client.submit(NAME, {"tag": "b"})
            assert time.monotonic() - began >= 0.3
        finally:
            os.kill(pid, signal.SIGCONT)
        # The primary took it, and the replica gets it once it answers: "unknown" means
        # the caller cannot tell, not that it did not happen (an idempotency key makes
        # the retry safe).
        assert len(list(client.list_runs(name=NAME))) == before + 1
        retried = client.submit(NAME, {"tag": "c"}, idempotency_key="c")
        again = client.submit(NAME, {"tag": "c"}, idempotency_key="c")
        assert retried.run_id == again.run_id
    finally:
        os.kill(replica.pid or 0, signal.SIGCONT)
        store.close()


def test_an_async_store_does_not_wait_for_a_frozen_replica(pair: tuple[Server, Server]
                                                           ) -> None:
    primary, replica = pair
    store = ValkeyStore(primary.url, namespace="dur")
    client = SyncWorkflowClient(store)
    pid = _frozen(replica)
    try:
        client.submit(NAME, {"tag": "a"})  # at once: nothing waits for the replica
    finally:
        os.kill(pid, signal.SIGCONT)
        store.close()


async def test_a_replicated_worker_refuses_a_server_with_no_replica(
    fresh_valkey_server: Server
) -> None:
    store = ValkeyStore(fresh_valkey_server.url + "?durability=replicated", namespace="ns")
    async with opened(store):
        worker = make_worker(store, [one_step], health_port=0)
        with pytest.raises(ConfigurationError, match="has no replica connected"):
            await worker.run()
        assert worker.state == "starting"
        with fresh_valkey_server.client() as admin:
            assert admin.dbsize() == 0


async def test_a_replicated_worker_starts_with_a_replica(pair: tuple[Server, Server]) -> None:
    primary, _ = pair
    store = ValkeyStore(primary.url + "?durability=replicated", namespace="ns")
    async with opened(store):
        await store.prepare([NAME])
        assert await store.connection.replicas() == [(str(primary.host) + ":" +
                                                      str(primary.port), 1)]


@pytest.mark.cluster
async def test_a_replicated_worker_refuses_a_cluster_whose_primaries_have_no_replica(
    tmp_path: Path
) -> None:
    cluster = start_cluster(tmp_path / "cluster", primaries=3, replicas_per_primary=0)
    try:
        store = ValkeyStore(cluster.url, namespace="ns", durability="replicated")
        async with opened(store):
            worker = make_worker(store, [one_step], health_port=0)
            with pytest.raises(ConfigurationError, match="has no replica connected") as caught:
                await worker.run()
            # Every primary is named, not only the first.
            assert all(f":{node.port}" in str(caught.value) for node in cluster.nodes)
    finally:
        cluster.kill()
