"""The server fixtures start real, working Valkey/Redis servers and clusters."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests import servers
from tests.servers import HOST, Cluster, Server, ServerError


def test_standalone_ping_set_get(valkey_url: str, valkey_namespace: str) -> None:
    with redis.Redis.from_url(valkey_url, decode_responses=True) as client:
        assert client.ping() is True
        key = f"{valkey_namespace}:greeting"
        assert client.get(key) is None
        client.set(key, "hello")
        assert client.get(key) == "hello"


def test_server_is_local_and_not_persistent(valkey_server: Server) -> None:
    assert valkey_server.url == f"redis://127.0.0.1:{valkey_server.port}"
    with valkey_server.client(decode_responses=True) as client:
        config = client.config_get("*")
    assert config["bind"] == "127.0.0.1"
    assert config["save"] == ""
    assert config["appendonly"] == "no"
    assert config["daemonize"] == "no"
    assert config["dir"] == str(valkey_server.dir)


def test_evalsha_after_script_load(valkey_url: str, valkey_namespace: str) -> None:
    script = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('INCRBY', KEYS[2], ARGV[2])"
    with redis.Redis.from_url(valkey_url, decode_responses=True) as client:
        sha = client.script_load(script)
        keys = [f"{valkey_namespace}:a", f"{valkey_namespace}:n"]
        assert client.evalsha(sha, 2, *keys, "x", 5) == 5
        assert client.evalsha(sha, 2, *keys, "y", 2) == 7
        assert client.get(keys[0]) == "y"


async def test_async_client_against_the_shared_server(
    valkey_url: str, valkey_namespace: str
) -> None:
    client = redis.asyncio.Redis.from_url(valkey_url)
    try:
        await client.set(f"{valkey_namespace}:k", b"v")
        assert await client.get(f"{valkey_namespace}:k") == b"v"
    finally:
        await client.aclose()


def test_namespaces_are_unique(valkey_namespace: str) -> None:
    assert valkey_namespace.startswith("t")
    assert len(valkey_namespace) == 17


def test_standalone_reports_cluster_disabled(valkey_server: Server) -> None:
    with valkey_server.client() as client:
        assert client.info("cluster")["cluster_enabled"] == 0


def test_fixtures_mark_tests(request: pytest.FixtureRequest, valkey_cluster: Cluster) -> None:
    assert request.node.get_closest_marker("valkey") is not None
    assert request.node.get_closest_marker("cluster") is not None


# -- cluster ----------------------------------------------------------------------------------


def test_cluster_is_healthy_with_three_primaries_and_three_replicas(
    valkey_cluster: Cluster,
) -> None:
    assert len(valkey_cluster.nodes) == 6
    assert len(valkey_cluster.primaries()) == 3
    assert len(valkey_cluster.replicas()) == 3
    for node in valkey_cluster.nodes:
        with node.client() as client:
            assert client.info("cluster")["cluster_enabled"] == 1
            info = client.execute_command("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info)
        assert "cluster_state:ok" in text
        assert "cluster_slots_assigned:16384" in text


def test_cluster_client_writes_keys_landing_on_every_primary(
    valkey_cluster: Cluster, valkey_namespace: str
) -> None:
    keys = [f"{valkey_namespace}:{i}" for i in range(60)]
    with redis.cluster.RedisCluster.from_url(valkey_cluster.url, decode_responses=True) as rc:
        for key in keys:
            rc.set(key, key)
        assert all(rc.get(key) == key for key in keys)
        owners = {rc.get_node_from_key(key).port for key in keys}
    assert len(owners) == 3

    # Each primary holds a share of the keys, read directly from the node itself.
    found: dict[int, set[str]] = {}
    for node in valkey_cluster.primaries():
        with node.client(decode_responses=True) as client:
            found[node.port] = set(client.scan_iter(match=f"{valkey_namespace}:*"))
    assert all(found.values()), found
    assert set().union(*found.values()) == set(keys)
    assert sum(len(v) for v in found.values()) == len(keys)


def test_cluster_hash_tags_keep_keys_together_for_scripts(
    valkey_cluster: Cluster, valkey_namespace: str
) -> None:
    script = "return redis.call('MSET', KEYS[1], ARGV[1], KEYS[2], ARGV[1])"
    keys = [f"{{{valkey_namespace}}}:a", f"{{{valkey_namespace}}}:b"]
    with valkey_cluster.client(decode_responses=True) as rc:
        sha = rc.script_load(script)
        rc.evalsha(sha, 2, *keys, "v")
        assert rc.mget_nonatomic(keys) == ["v", "v"]


# -- servers of a test's own ------------------------------------------------------------------


def test_kill_then_restart_a_fresh_server(fresh_valkey_server: Server) -> None:
    server = fresh_valkey_server
    url, pid = server.url, server.pid
    with server.client() as client:
        client.set("k", "v")

    server.kill()
    assert not server.is_running
    with (
        redis.Redis.from_url(url, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)) as client,
        pytest.raises(redis.ConnectionError),
    ):
        client.ping()

    server.restart()
    assert server.is_running
    assert server.url == url
    assert server.pid != pid
    with server.client() as client:
        assert client.ping() is True
        assert client.get("k") is None  # nothing was persisted


def test_restart_can_change_config(fresh_valkey_server: Server) -> None:
    fresh_valkey_server.restart(maxmemory="5mb", maxmemory_policy="allkeys-lru")
    with fresh_valkey_server.client(decode_responses=True) as client:
        assert client.config_get("maxmemory")["maxmemory"] == str(5 * 1024 * 1024)
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "allkeys-lru"


def test_maxmemory_config(valkey_server_factory: Callable[..., Server]) -> None:
    server = valkey_server_factory(maxmemory="1mb", maxmemory_policy="noeviction")
    with server.client() as client, pytest.raises(redis.exceptions.OutOfMemoryError):
        for i in range(100):
            client.set(f"big:{i}", b"x" * 100_000)


def test_requirepass_and_acl_users(valkey_server_factory: Callable[..., Server]) -> None:
    server = valkey_server_factory(
        requirepass="s3cret", user=["alice on >alicepw ~app:* +@all", "bob off"]
    )
    no_retries = Retry(NoBackoff(), 0)  # redis-py would back off and retry for seconds
    with (
        redis.Redis(host=HOST, port=server.port, retry=no_retries) as anonymous,
        pytest.raises(redis.AuthenticationError),
    ):
        anonymous.ping()
    with server.client() as admin:  # uses requirepass
        assert admin.ping() is True
    with redis.Redis(host=HOST, port=server.port, username="alice", password="alicepw") as alice:
        alice.set("app:x", 1)
        with pytest.raises(redis.exceptions.NoPermissionError):
            alice.set("other:x", 1)


# -- robustness ---------------------------------------------------------------------------------


def test_a_lost_port_race_is_retried_on_another_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind((HOST, 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        real_free_port = servers.free_port
        handed_out: list[int] = []

        def racy_free_port(avoid: tuple[int, ...] = ()) -> int:
            port = taken if not handed_out else real_free_port(avoid)
            handed_out.append(port)
            return port

        monkeypatch.setattr(servers, "free_port", racy_free_port)
        with servers.start_server(tmp_path) as server:
            assert server.port != taken
            assert handed_out[0] == taken
            assert "Address already in use" in server.log_path.read_text()
            with server.client() as client:
                assert client.ping() is True


def test_a_pinned_port_that_is_taken_fails_clearly(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind((HOST, 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        with pytest.raises(ServerError, match=f"lost port {taken}") as failure:
            servers.start_server(tmp_path, port=taken)
    assert "Address already in use" in str(failure.value)  # the log tail is in the message


def test_a_bad_config_fails_with_the_log_tail(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="exited with status") as failure:
        servers.start_server(tmp_path, no_such_directive="1")
    assert "no-such-directive" in str(failure.value)


def test_a_server_that_never_answers_times_out_clearly(tmp_path: Path) -> None:
    mute = tmp_path / "mute-server"
    mute.write_text("#!/bin/sh\necho 'pretending to boot'\nexec sleep 60\n")
    mute.chmod(0o755)
    with pytest.raises(ServerError, match="did not answer PING within 0.3 s") as failure:
        servers.start_server(tmp_path, binary=mute, startup_timeout=0.3)
    assert "pretending to boot" in str(failure.value)
    assert not [s for s in servers._LIVE if s.binary == mute]  # killed, not left behind
