"""The store's Lua: one function library per build, called by FCALL (or the same code as
a script, by EVALSHA, where the server refuses functions).

``upgrade_scripts(url)`` loads it ahead of a deploy (on every primary of a cluster); a
``FUNCTION FLUSH`` (``SCRIPT FLUSH`` on the script path) at any moment costs one reload,
never a lost or repeated run. The first load of a process prunes other builds' libraries
past ``KEEP``.
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
from pyrula.workflows.stores.valkey.code import KEEP
from pyrula.workflows.stores.valkey.functions import SHA, upgrade_scripts
from pyrula.workflows.stores.valkey.router import Router
from pyrula.workflows.stores.valkey.script import FUNCTION
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


def _libraries(client: redis.Redis) -> list[str]:
    """The names of the function libraries the server holds."""
    names = []
    for entry in client.function_list():
        fields = entry if isinstance(entry, dict) else dict(
            zip(entry[::2], entry[1::2], strict=False))
        name = fields.get(b"library_name", fields.get("library_name"))
        names.append(name.decode() if isinstance(name, bytes) else str(name))
    return sorted(names)


def test_upgrade_scripts_loads_this_builds_library(fresh_valkey_server: Server) -> None:
    with fresh_valkey_server.client() as admin:
        assert _libraries(admin) == []
        assert upgrade_scripts(fresh_valkey_server.url) == SHA
        assert _libraries(admin) == [FUNCTION]


def test_upgrade_scripts_loads_the_library_on_every_primary_of_a_cluster(
    valkey_cluster: Cluster,
) -> None:
    primaries = valkey_cluster.primaries()
    assert len(primaries) == 3
    for node in primaries:
        with node.client() as client:
            client.function_flush()
    assert upgrade_scripts(valkey_cluster.url) == SHA
    for node in primaries:
        with node.client() as client:
            assert _libraries(client) == [FUNCTION], node


#: How each way of calling the Lua is flushed, what loads it, and what calls it.
MODES = {
    "functions": ("function_flush", "function|load", "fcall"),
    "scripts": ("script_flush", "script|load", "evalsha"),
}


def _store(server: Server, mode: str) -> ValkeyStore:
    store = ValkeyStore(url=server.url, namespace="ns", shard_count=2)
    store.connection.code.functions = mode == "functions"
    return store


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_lua_the_server_lost_costs_one_reload(fresh_valkey_server: Server,
                                                     mode: str) -> None:
    flush, load, call = MODES[mode]
    store = _store(fresh_valkey_server, mode)
    async with opened(store):
        await store.submit(NAME, {}, now=time.time())  # connected, code loaded
        with fresh_valkey_server.client(decode_responses=True) as admin:
            getattr(admin, flush)()
            admin.config_resetstat()
            handle, created = await store.submit(NAME, {}, now=time.time())
            assert created
            assert _command_calls(admin, load)["calls"] == 1
            # The first call met the missing code, the reload came, the second one ran.
            assert _command_calls(admin, call) == {
                "calls": 2, "failed_calls": 1, "rejected_calls": 0}
        info = await store.get_run(handle.run_id)
        assert info is not None and info.status is RunStatus.QUEUED


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_lua_lost_again_after_the_reload_raises_store_unavailable(
    fresh_valkey_server: Server, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Only one reload: a flush that lands between it and the retry is reported as the
    store being unavailable (the worker's loops retry that), not looped on, and not a raw
    redis error (which would stop the worker)."""
    store = _store(fresh_valkey_server, mode)
    admin = redis.asyncio.Redis.from_url(fresh_valkey_server.url)
    reload = store.connection.load_script
    reloads = 0

    async def reload_then_flush() -> None:
        nonlocal reloads
        reloads += 1
        await reload()
        await getattr(admin, MODES[mode][0])()

    monkeypatch.setattr(store.connection, "load_script", reload_then_flush)
    try:
        async with opened(store):
            with pytest.raises(StoreUnavailable, match="Lua is missing after loading"):
                await store.submit(NAME, {}, now=time.time())
            assert reloads == 1
            # The batched path (one pipeline over many shards) gives up the same way.
            with pytest.raises(StoreUnavailable, match="Lua is missing after loading"):
                await _renew_two(store)
            assert reloads == 2
    finally:
        await admin.aclose()


def _fake_library(n: int) -> str:
    return (f"#!lua name=pyrula_old{n}\n"
            f"redis.register_function('pyrula_old{n}', function(keys, args) return {n} end)")


@pytest.mark.parametrize("others", [KEEP - 1, KEEP + 3])
async def test_a_first_load_prunes_other_builds_libraries_past_keep(
    fresh_valkey_server: Server, others: int
) -> None:
    with fresh_valkey_server.client() as admin:
        admin.function_load("#!lua name=theirs\n"
                            "redis.register_function('theirs', function() return 1 end)")
        for n in range(others):
            admin.function_load(_fake_library(n))
        store = _store(fresh_valkey_server, "functions")
        async with opened(store):
            await store.submit(NAME, {}, now=time.time())
            kept = _libraries(admin)
            # A reload (another build pruned ours, say) never prunes.
            for n in range(KEEP + 1):
                admin.function_load(_fake_library(100 + n))
            admin.function_delete(FUNCTION)
            await store.submit(NAME, {}, now=time.time())
            after = _libraries(admin)
    pyrula = sorted([FUNCTION, *(f"pyrula_old{n}" for n in range(others))])
    if others + 1 <= KEEP:
        assert kept == sorted([*pyrula, "theirs"])
    else:  # only ours is left of pyrula's, and nothing else is touched
        assert kept == sorted([FUNCTION, "theirs"])
    assert set(kept) | {f"pyrula_old{100 + n}" for n in range(KEEP + 1)} == set(after)


async def _renew_two(store: ValkeyStore) -> None:
    held = {store.keys.new_run_id(NAME, s): 1 for s in range(2)}
    await store.renew("w", held, now=time.time(), lock_ttl=10)


def _flush_after_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next batch of calls of the store's Lua carries a FUNCTION FLUSH right after its
    first FCALL, so the server runs the first call and refuses the rest (as a flush from
    another client that lands between the commands of one pipeline does)."""
    plain = Router.execute
    armed = True

    async def execute(self: Router, commands: Sequence[Any], keys: Sequence[str | None],
                      *, idempotent: bool = False) -> list[Any]:
        nonlocal armed
        if armed and len(commands) > 1 and commands[0][0] == "FCALL":
            armed = False
            replies = await plain(self, [commands[0], ("FUNCTION", "FLUSH"), *commands[1:]],
                                  [keys[0], None, *keys[1:]], idempotent=idempotent)
            del replies[1]  # the flush's own answer
            return replies
        return await plain(self, commands, keys, idempotent=idempotent)

    monkeypatch.setattr(Router, "execute", execute)


async def test_a_flush_inside_one_pipeline_re_sends_only_the_refused_calls(
    fresh_valkey_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the batched path used to re-send every call of a pipeline when any of
    them found the code missing, so the calls that had already run ran twice: a claim took a second
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
    """FUNCTION FLUSH from inside a run, while the worker's other runs are in flight."""
    LEDGER.record("vk.flush_scripts", tag)
    with redis.Redis.from_url(url) as client:
        return bool(client.function_flush())


@workflow(name="vk.flushing")
async def flushing(ctx: WorkflowContext, params: dict[str, Any]) -> list[str]:
    first = await touch(params["tag"])
    if params["flush"]:
        await flush_scripts(params["url"], params["tag"])
    return [first, await touch_again(params["tag"])]


async def test_function_flush_during_a_load_of_300_runs_loses_and_repeats_nothing(
    fresh_valkey_server: Server,
) -> None:
    LEDGER.clear()
    url = fresh_valkey_server.url
    tags = [f"flush-{i}" for i in range(300)]
    store = ValkeyStore(url=url, namespace="ns")
    async with opened(store):
        worker = make_worker(store, [flushing], max_concurrent_runs=20)
        async with serving(worker):
            # Run 150 flushes the functions in the middle of the load, with up to 19
            # other runs in flight. (One flush: two that land on one call back to back,
            # between its reload and its retry, make it fail as the store being
            # unavailable, by design: one reload when the code is missing.)
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
        assert _command_calls(admin, "function|load")["calls"] >= 2  # the flush was met
        assert FUNCTION in _libraries(admin)
    flushed = [t for step_name, t in LEDGER.order if step_name == "vk.flush_scripts"]
    assert flushed == ["flush-150"]
    for tag in tags:
        assert LEDGER.count("vk.touch", tag) == 1
        assert LEDGER.count("vk.touch_again", tag) == 1


def test_the_library_names_are_read_from_either_reply_shape() -> None:
    from pyrula.workflows.stores.valkey.code import library_names

    flat = [["library_name", "pyrula_a", "engine", "LUA", "functions", []],
            ["library_name", "other", "engine", "LUA", "functions", []]]
    mapped = [{"library_name": "pyrula_b", "engine": "LUA"}, {"library_name": "x"}]
    assert library_names(flat) == ["pyrula_a"]
    assert library_names(mapped) == ["pyrula_b"]
    assert library_names(None) == []
