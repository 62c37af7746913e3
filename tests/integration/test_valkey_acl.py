"""A ValkeyStore runs under a Valkey ACL fenced to its namespace, with scripts and plain data
commands only: no FUNCTION, no KEYS, no SCAN, not even EVAL. (With every command allowed
it calls its Lua as a function library instead: FCALL, FUNCTION LOAD and LIST. A fenced
user is not granted those, since loading a function is server-wide; its store's first
FCALL is refused, once, and it calls the same code by EVALSHA from then on.)

``STORE_COMMANDS`` is the whole set the store sends, found empirically: ``exercise`` (in
valkey_support.py) drives every kind of call the store makes (submit with an idempotency
key, claim with flow control, steps, sleep and timer wake, signal, cancel of a queued run,
result waits, reads, listing, shard leases, flow-control admin) through a real
``WorkflowWorker``; ``test_the_store_sends_exactly_the_documented_commands`` reads the
server's commandstats after it, and
``test_a_user_fenced_to_the_namespace_runs_workflows_end_to_end`` runs it as a user who
may send nothing else. Commands inside the Lua script are checked against the caller's ACL
too, so they are part of the set. Two things a connection sends are left out on purpose:
``HELLO`` (always allowed) and ``CLIENT SETINFO`` (redis-py ignores its refusal; the ACL log
shows it as the only denial).

A common recipe grants ``+eval +evalsha +script|load``; the store itself only uses
``EVALSHA`` and ``SCRIPT LOAD``, so ``+eval`` is not needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import ValkeyStore
from tests.integration.valkey_support import (
    awaits_signal,
    exercise,
    make_worker,
    opened,
    serving,
    sleeps,
    two_steps,
)
from tests.servers import Server

NAMESPACE = "fenced"

#: How the store calls its Lua: as functions (every command allowed), or as a script.
FUNCTIONS = {"fcall", "function|load", "function|list"}
SCRIPTS = {"evalsha", "script|load"}
#: Sent by the store outside its Lua, besides those.
TOP_LEVEL = {
    "ping", "info", "time",
    "hget", "hgetall", "hsetnx", "hkeys", "hset", "hdel", "del",
    "zadd", "zrem", "zrange", "zcount", "zrevrangebyscore",
    "lrange", "exists", "blmove", "lpush", "ltrim", "blpop", "zcard",
}
#: Called by the Lua script (checked against the caller's ACL as well).
IN_SCRIPTS = {
    "get", "set", "expire",
    "hget", "hgetall", "hmget", "hset", "hsetnx", "hdel", "hexists",
    "llen", "lpop", "lpush", "lrange", "lrem", "ltrim", "rpush", "del",
    "zadd", "zrem", "zrange", "zcard", "zincrby", "zrangebyscore", "zremrangebyscore", "zscore",
}
#: What a user fenced to its namespace is granted.
STORE_COMMANDS = frozenset(TOP_LEVEL | SCRIPTS | IN_SCRIPTS)
NEVER = {"keys", "scan", "eval", "eval_ro", "flushdb", "flushall", "function|flush",
         "function|delete", "script|flush"}

#: What connections send on their own, and the test's own inspection.
HANDSHAKE = {"hello", "client|setinfo", "config|resetstat"}


def acl_user(name: str, password: str, namespace: str, commands: frozenset[str]) -> str:
    grants = " ".join(f"+{c}" for c in sorted(commands))
    return f"{name} on >{password} resetkeys ~{namespace}:* resetchannels -@all {grants}"


async def test_a_user_fenced_to_the_namespace_runs_workflows_end_to_end(
    valkey_server_factory: Any,
) -> None:
    server: Server = valkey_server_factory(user=[
        "default on nopass ~* &* +@all",
        acl_user("pyrula", "s3cret", NAMESPACE, STORE_COMMANDS),
    ])
    store = ValkeyStore(url=f"redis://pyrula:s3cret@127.0.0.1:{server.port}",
                        namespace=NAMESPACE)
    with server.client(decode_responses=True) as admin:
        # The fence holds: the user may not touch keys outside its namespace, nor call
        # FUNCTION or KEYS.
        assert admin.acl_dryrun("pyrula", "get", "other:key") != "OK"
        assert admin.acl_dryrun("pyrula", "get", f"{NAMESPACE}:key") == "OK"
        assert admin.acl_dryrun("pyrula", "function", "list") != "OK"
        assert admin.acl_dryrun("pyrula", "keys", "*") != "OK"
        admin.acl_log_reset()
        async with opened(store):
            worker = make_worker(store, [two_steps, sleeps, awaits_signal],
                                 schedule_interval=0.2)
            async with serving(worker):
                await exercise(store, worker)
        # Nothing the store sent was refused, save the handshake's CLIENT SETINFO and the
        # calls of its first round trip of FCALLs (after which it called its script).
        denied = {(entry["reason"], entry["object"]) for entry in admin.acl_log()}
        assert denied <= {("command", "client|setinfo"), ("command", "fcall")}, denied
        assert store.connection.code.functions is False
        calls = admin.info("commandstats")
        assert calls["cmdstat_evalsha"]["calls"] > 100
        assert calls["cmdstat_fcall"]["calls"] == 0  # every FCALL refused, none ran
        assert calls["cmdstat_fcall"]["rejected_calls"] >= 1


async def test_the_store_sends_exactly_the_documented_commands(
    fresh_valkey_server: Server,
) -> None:
    with fresh_valkey_server.client(decode_responses=True) as admin:
        admin.config_resetstat()
        store = ValkeyStore(url=fresh_valkey_server.url, namespace=NAMESPACE)
        async with opened(store):
            worker = make_worker(store, [two_steps, sleeps, awaits_signal],
                                 schedule_interval=0.2)
            async with serving(worker):
                await exercise(store, worker)
        stats = admin.info("commandstats")
    used = {name.removeprefix("cmdstat_") for name in stats} - HANDSHAKE
    assert not used & NEVER, sorted(used & NEVER)
    # Every command used is in the documented set, and every one of the set was needed;
    # with every command allowed, the Lua is called as functions, never as a script.
    documented = TOP_LEVEL | FUNCTIONS | IN_SCRIPTS
    assert used == documented, (
        f"not documented: {sorted(used - documented)}; "
        f"never used: {sorted(documented - used)}"
    )


async def test_a_glob_in_a_namespace_cannot_widen_the_fence_to_another_namespace(
    valkey_server_factory: Any,
) -> None:
    """The fence is the ACL pattern ``~<namespace>:*``: a namespace with a glob character
    in it (``evid*x``) would make that pattern match other namespaces' keys
    (``evidOTHERx:...``), run records and params included. Such namespaces are refused, so
    the pattern an operator writes from a valid namespace is always a plain prefix."""
    from pyrula.workflows import ConfigurationError

    server: Server = valkey_server_factory(user=[
        "default on nopass ~* &* +@all",
        # The fence an operator would write for a store with namespace "evid*x".
        acl_user("snoop", "s3cret", "evid*x", STORE_COMMANDS),
    ])
    victim = ValkeyStore(url=server.url, namespace="evidOTHERx", shard_count=1)
    async with opened(victim):
        handle = await victim.submit("vk.one_step", {"card": "4111-1111"}, now=0.0)
    run_key = victim.keys.run(handle[0].run_id)
    # The leak the refusal prevents: that pattern lets the user read the other
    # namespace's run record, params included.
    with server.client(decode_responses=True, username="snoop", password="s3cret") as snoop:
        assert "4111-1111" in snoop.hgetall(run_key)["params"]
    for bad in ("evid*x", "evid?x", "evid[O]x", "a]b"):
        with pytest.raises(ConfigurationError, match="namespace") as refused:
            ValkeyStore(url=f"redis://snoop:s3cret@127.0.0.1:{server.port}", namespace=bad)
        assert repr(bad) in str(refused.value)


def test_the_documented_grant_is_exactly_the_set_the_store_sends() -> None:
    """docs/valkey.md lists what an ACL must grant; it is this file's STORE_COMMANDS."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "valkey.md").read_text()
    block = doc.split("a user fenced to the namespace needs", 1)[1].split("```")[1]
    granted = {word.removeprefix("+") for word in block.split()}
    assert granted == STORE_COMMANDS, (
        f"documented but not sent: {sorted(granted - STORE_COMMANDS)}; "
        f"sent but not documented: {sorted(STORE_COMMANDS - granted)}"
    )
