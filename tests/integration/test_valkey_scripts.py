"""The store's Lua: one script per build, loaded with SCRIPT LOAD and called by EVALSHA.

``upgrade_scripts(url)`` loads it ahead of a deploy (on every primary of a cluster); a
``SCRIPT FLUSH`` at any moment costs one reload, never a lost or repeated run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
import redis
import redis.asyncio

from pyrula.workflows import (
    RunStatus,
    StoreUnavailable,
    ValkeyStore,
    WorkflowContext,
    step,
    workflow,
)
from pyrula.workflows.stores.valkey.functions import SHA, upgrade_scripts
from pyrula.workflows.stores.valkey.router import Router
from tests.integration.valkey_support import (
    LEDGER,
    all_ended,
    keys_on_shards,
    make_worker,
    opened,
    serving,
    touch,
    touch_again,
)
from tests.servers import Cluster, Server

NAME = "vk.two_steps"


def _command_calls(client: redis.Redis, command: str) -> dict[str, int]:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return {k: int(stats.get(k, 0)) for k in ("calls", "failed_calls", "rejected_calls")}


def test_upgrade_scripts_loads_this_builds_script(fresh_valkey_server: Server) -> None:
    with fresh_valkey_server.client() as admin:
        assert admin.script_exists(SHA) == [False]
        assert upgrade_scripts(fresh_valkey_server.url) == SHA
        assert admin.script_exists(SHA) == [True]


def test_upgrade_scripts_loads_the_script_on_every_primary_of_a_cluster(
    valkey_cluster: Cluster,
) -> None:
    primaries = valkey_cluster.primaries()
    assert len(primaries) == 3
    for node in primaries:
        with node.client() as client:
            client.script_flush()
            assert client.script_exists(SHA) == [False]
    assert upgrade_scripts(valkey_cluster.url) == SHA
    for node in primaries:
        with node.client() as client:
            assert client.script_exists(SHA) == [True], node


async def test_noscript_costs_one_reload(fresh_valkey_server: Server) -> None:
    store = ValkeyStore(url=fresh_valkey_server.url, namespace="ns", shard_count=2)
    async with opened(store):
        await store.submit(NAME, {}, now=time.time())  # connected, script loaded
        with fresh_valkey_server.client(decode_responses=True) as admin:
            admin.script_flush()
            admin.config_resetstat()
            handle, created = await store.submit(NAME, {}, now=time.time())
            assert created
            assert _command_calls(admin, "script|load")["calls"] == 1
            # The first EVALSHA met NOSCRIPT, the reload came, the second one ran.
            assert _command_calls(admin, "evalsha") == {
                "calls": 2, "failed_calls": 1, "rejected_calls": 0}
        info = await store.get_run(handle.run_id)
        assert info is not None and info.status is RunStatus.QUEUED


async def test_noscript_again_after_the_reload_raises_store_unavailable(
    fresh_valkey_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only one reload: a flush that lands between it and the retry is reported as the
    store being unavailable (the worker's loops retry that), not looped on, and not a raw
    redis error (which would stop the worker)."""
    store = ValkeyStore(url=fresh_valkey_server.url, namespace="ns", shard_count=2)
    admin = redis.asyncio.Redis.from_url(fresh_valkey_server.url)
    reload = store.connection.load_script
    reloads = 0

    async def reload_then_flush() -> None:
        nonlocal reloads
        reloads += 1
        await reload()
        await admin.script_flush()

    monkeypatch.setattr(store.connection, "load_script", reload_then_flush)
    try:
        async with opened(store):
            with pytest.raises(StoreUnavailable, match="(?i)noscript|no matching script"):
                await store.submit(NAME, {}, now=time.time())
            assert reloads == 1
            # The batched path (one pipeline over many shards) gives up the same way.
            with pytest.raises(StoreUnavailable, match="(?i)noscript|no matching script"):
                await _renew_two(store)
            assert reloads == 2
    finally:
        await admin.aclose()


async def _renew_two(store: ValkeyStore) -> None:
    held = {store.keys.new_run_id(NAME, s): 1 for s in range(2)}
    await store.renew("w", held, now=time.time(), lock_ttl=10)


def _flush_after_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next batch of script calls carries a SCRIPT FLUSH right after its first EVALSHA,
    so the server runs the first call and refuses the rest with NOSCRIPT (as a flush from
    another client that lands between the commands of one pipeline does)."""
    plain = Router.execute
    armed = True

    async def execute(self: Router, commands: Sequence[Any], keys: Sequence[str | None],
                      *, idempotent: bool = False) -> list[Any]:
        nonlocal armed
        if armed and len(commands) > 1 and commands[0][0] == "EVALSHA":
            armed = False
            replies = await plain(self, [commands[0], ("SCRIPT", "FLUSH"), *commands[1:]],
                                  [keys[0], None, *keys[1:]], idempotent=idempotent)
            del replies[1]  # the flush's own answer
            return replies
        return await plain(self, commands, keys, idempotent=idempotent)

    monkeypatch.setattr(Router, "execute", execute)


async def test_a_flush_inside_one_pipeline_re_sends_only_the_refused_calls(
    fresh_valkey_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the batched path used to re-send every call of a pipeline when any of
    them met NOSCRIPT, so the calls that had already run ran twice: a claim took a second
    run and the first one was left locked and unreturned, until the orphan scan."""
    store = ValkeyStore(url=fresh_valkey_server.url, namespace="ns", shard_count=2)
    async with opened(store):
        now = time.time()
        runs = [(await store.submit(NAME, {}, now=now, idempotency_key=key))[0].run_id
                for key in keys_on_shards([0, 1], 2)]
        _flush_after_first_call(monkeypatch)
        claimed = await store.claim("w", [NAME], limit=2, now=now, lock_ttl=30)
        monkeypatch.undo()
        assert sorted(c.run_id for c in claimed) == sorted(runs)
        assert [c.token for c in claimed] == [1, 1]
        for run_id in runs:
            info = await store.get_run(run_id)
            assert info is not None and info.attempt == 1


@step(name="vk.flush_scripts")
def flush_scripts(url: str, tag: str) -> bool:
    """SCRIPT FLUSH from inside a run, while the worker's other runs are in flight."""
    LEDGER.record("vk.flush_scripts", tag)
    with redis.Redis.from_url(url) as client:
        return bool(client.script_flush())


@workflow(name="vk.flushing")
async def flushing(ctx: WorkflowContext, params: dict[str, Any]) -> list[str]:
    first = await touch(params["tag"])
    if params["flush"]:
        await flush_scripts(params["url"], params["tag"])
    return [first, await touch_again(params["tag"])]


async def test_script_flush_during_a_load_of_300_runs_loses_and_repeats_nothing(
    fresh_valkey_server: Server,
) -> None:
    LEDGER.clear()
    url = fresh_valkey_server.url
    tags = [f"flush-{i}" for i in range(300)]
    store = ValkeyStore(url=url, namespace="ns")
    async with opened(store):
        worker = make_worker(store, [flushing], max_concurrent_runs=20)
        async with serving(worker):
            # Run 150 flushes the script cache in the middle of the load, with up to 19
            # other runs in flight. (One flush: two that land on one call back to back,
            # between its reload and its retry, make it fail as the store being
            # unavailable, by design: "one reload on NOSCRIPT".)
            runs = [
                (await worker.client.submit(flushing, {"tag": t, "url": url,
                                                       "flush": i == 150})).run_id
                for i, t in enumerate(tags)
            ]
            await all_ended(store, runs, timeout=30)
        for run_id in runs:
            kinds = [e["type"] for e in await store.read_events(run_id)]
            assert kinds.count("run:started") == 1, kinds
            assert "run:requeued" not in kinds
            assert kinds[-1] == "run:completed"
    with fresh_valkey_server.client(decode_responses=True) as admin:
        assert _command_calls(admin, "script|load")["calls"] >= 2  # the flush was met
        assert admin.script_exists(SHA) == [True]
    flushed = [t for step_name, t in LEDGER.order if step_name == "vk.flush_scripts"]
    assert flushed == ["flush-150"]
    for tag in tags:
        assert LEDGER.count("vk.touch", tag) == 1
        assert LEDGER.count("vk.touch_again", tag) == 1
