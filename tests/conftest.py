"""Shared test plumbing: async tests without a plugin, stores, polling helpers, real servers.

Real Valkey/Redis servers (see ``tests/servers.py``), one set per xdist worker process:

- ``valkey_url`` + ``valkey_namespace``: the URL of the session's shared standalone server and
  a fresh key namespace for this test; keys containing the namespace are deleted afterwards.
  Put the namespace in every key (or use it as the store's prefix) and never flush, reconfigure
  or stop the shared server: tests that do that take ``fresh_valkey_server`` instead.
- ``valkey_server``: the shared standalone ``Server`` itself (session scope).
- ``fresh_valkey_server``: a server of the test's own, free to kill, restart and reconfigure.
- ``valkey_server_factory``: ``start(**config) -> Server`` for servers with special config
  (``requirepass``, ``maxmemory``, ACL ``user`` lines, ...); all stopped after the test.
- ``valkey_cluster``: a 3 primary + 3 replica ``Cluster`` shared by the session.

Tests using these fixtures are marked ``valkey`` (and ``cluster``) automatically, so
``-m "not valkey"`` / ``-m "not cluster"`` deselect them.

The machine's PostgreSQL (see ``tests/postgres.py``; the tests skip without one), through
databases of the suite's own only, each dropped when its fixture ends:

- ``postgres_archive_dsn``: a migrated archive database shared by the session (per xdist
  worker); scope what a test reads by its store's namespace.
- ``fresh_postgres_dsn``: an empty database of the test's own.
- ``postgres_admin``: creates, drops and closes (``allow_connections``) those databases.

Tests using them are marked ``postgres``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.postgres import PostgresAdmin
from tests.servers import (
    Cluster,
    Server,
    ServerError,
    find_server_binary,
    server_version,
    start_cluster,
    start_server,
)
from tests.tools import area_of, needs_tool, record, summary


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests in a fresh event loop each."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {name: pyfuncitem.funcargs[name] for name in names}

        async def run() -> None:
            try:
                await pyfuncitem.obj(**kwargs)
            finally:
                # Stores keep a client per event loop: close this loop's before it ends.
                for value in kwargs.values():
                    aclose = getattr(value, "aclose", None)
                    if aclose is not None and inspect.iscoroutinefunction(aclose):
                        await aclose()

        asyncio.run(run())
        return True
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.needs_tool(area, missing)``: see ``tests/tools.py``."""
    for mark in item.iter_markers("needs_tool"):
        needs_tool(*mark.args, **mark.kwargs)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line naming every area skipped for a missing tool, and why (or, under
    ``make test``, those areas added to its ``$PYRULA_SKIPPED_AREAS`` for its last line)."""
    areas = []
    for report in terminalreporter.stats.get("skipped", ()):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        found = area_of(reason)
        if found is not None:
            areas.append(found)
    if not record(areas):
        terminalreporter.write_line(summary(areas))


def wait_until(
    condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> Any:
    """Poll ``condition`` until it returns something truthy, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(interval)


async def await_until(
    condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> Any:
    """Async twin of ``wait_until``; ``condition`` may return an awaitable."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        await asyncio.sleep(interval)


STORE_PARAMS = [
    "memory",
    "sqlite",
    pytest.param("valkey", marks=pytest.mark.valkey),
    pytest.param("valkey-cluster", marks=[pytest.mark.valkey, pytest.mark.cluster]),
    pytest.param("archiving", marks=[pytest.mark.valkey, pytest.mark.postgres]),
]


@pytest.fixture(params=STORE_PARAMS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Every store, one test run each: memory, SQLite, Valkey standalone (one shard, so
    ordering is exact), a real Valkey cluster (four shards across its nodes) and an
    ArchivingStore (Valkey standalone, one shard, over the session's Postgres database)."""
    from pyrula.workflows import MemoryStore, SQLiteStore, ValkeyStore

    namespace = f"t{uuid.uuid4().hex[:16]}"
    if request.param == "memory":
        s: Any = MemoryStore()
    elif request.param == "sqlite":
        s = SQLiteStore(str(tmp_path / "store.db"))
    elif request.param == "valkey":
        server = request.getfixturevalue("valkey_server")
        s = ValkeyStore(url=server.url, namespace=namespace, shard_count=1)
    elif request.param == "archiving":
        from pyrula.workflows import ArchivingStore, PostgresArchive

        server = request.getfixturevalue("valkey_server")
        dsn = request.getfixturevalue("postgres_archive_dsn")
        s = ArchivingStore(live=ValkeyStore(url=server.url, namespace=namespace, shard_count=1),
                           archive=PostgresArchive(dsn=dsn))
    else:
        cluster = request.getfixturevalue("valkey_cluster")
        s = ValkeyStore(url=cluster.url, namespace=namespace, shard_count=4)
    try:
        yield s
    finally:
        s.close()


# --------------------------------------------------------------------------------------------
# Real Valkey/Redis servers

VALKEY_FIXTURES = frozenset(
    {"valkey_server", "valkey_url", "fresh_valkey_server", "valkey_server_factory"}
)
CLUSTER_FIXTURES = frozenset({"valkey_cluster"})
POSTGRES_FIXTURES = frozenset({"postgres_admin", "postgres_archive_dsn", "fresh_postgres_dsn"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests by the server fixtures they use (directly or through other fixtures)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & CLUSTER_FIXTURES:
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.valkey)
        elif names & VALKEY_FIXTURES:
            item.add_marker(pytest.mark.valkey)
        if names & POSTGRES_FIXTURES:
            item.add_marker(pytest.mark.postgres)


def pytest_report_header() -> str:
    try:
        binary = find_server_binary()
    except ServerError as exc:
        return f"valkey test server: none ({exc})"
    return f"valkey test server: {binary} ({server_version(binary)})"


@pytest.fixture(scope="session")
def valkey_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One standalone server for the whole session (per xdist worker). Do not reconfigure it."""
    server = start_server(tmp_path_factory.mktemp("valkey"))
    try:
        yield server
    finally:
        server.kill()  # nothing to save, and SIGTERM costs up to 100 ms per server


@pytest.fixture(scope="session")
def valkey_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A 3 primary + 3 replica cluster for the whole session (per xdist worker)."""
    cluster = start_cluster(tmp_path_factory.mktemp("valkey-cluster"))
    try:
        yield cluster
    finally:
        cluster.kill()


@pytest.fixture
def valkey_namespace() -> str:
    """A key namespace no other test uses, e.g. ``t3f9c2a1b0d4e5f67``."""
    return f"t{uuid.uuid4().hex[:16]}"


@pytest.fixture
def valkey_url(valkey_server: Server, valkey_namespace: str) -> Iterator[str]:
    """URL of the shared server; keys containing ``valkey_namespace`` are removed afterwards."""
    if not valkey_server.is_running:
        raise ServerError(
            f"the shared {valkey_server!r} is down: a test stopped it; "
            "tests that kill or reconfigure servers must use fresh_valkey_server"
        )
    yield valkey_server.url
    with valkey_server.client(socket_timeout=5) as client:
        keys = list(client.scan_iter(match=f"*{valkey_namespace}*", count=1000))
        for start in range(0, len(keys), 500):
            client.unlink(*keys[start : start + 500])


@pytest.fixture
def fresh_valkey_server(tmp_path: Path) -> Iterator[Server]:
    """A standalone server of this test's own: kill, restart and reconfigure it freely."""
    server = start_server(tmp_path / "valkey")
    try:
        yield server
    finally:
        server.kill()  # nothing to save, and SIGTERM costs up to 100 ms per server


@pytest.fixture
def valkey_server_factory(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """``start(**config) -> Server``, e.g. ``start(requirepass="pw", maxmemory="2mb")``."""
    servers: list[Server] = []

    def start(**config: Any) -> Server:
        server = start_server(tmp_path / "valkey", **config)
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.kill()


# --------------------------------------------------------------------------------------------
# The machine's PostgreSQL (tests/postgres.py): databases of the suite's own, never others


@pytest.fixture(scope="session")
def postgres_admin() -> PostgresAdmin:
    admin = PostgresAdmin()
    needs_tool("PostgreSQL (archive store tests)", admin.reachable())
    return admin


@pytest.fixture(scope="session")
def postgres_archive_dsn(postgres_admin: PostgresAdmin) -> Iterator[str]:
    """A migrated archive database for the session (per xdist worker), dropped at its end.
    Tests share it: scope what they read by their store's namespace."""
    from pyrula.workflows import PostgresArchive

    name = postgres_admin.create_database()
    try:
        dsn = postgres_admin.dsn(name)
        archive = PostgresArchive(dsn=dsn)

        async def migrate() -> None:
            await archive.migrate()
            await archive.aclose()

        asyncio.run(migrate())
        yield dsn
    finally:
        postgres_admin.drop_database(name)


@pytest.fixture
def fresh_postgres_dsn(postgres_admin: PostgresAdmin) -> Iterator[str]:
    """An empty database of this test's own (no schema), dropped after the test."""
    name = postgres_admin.create_database()
    try:
        yield postgres_admin.dsn(name)
    finally:
        postgres_admin.drop_database(name)
