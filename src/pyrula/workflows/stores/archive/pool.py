"""asyncpg connection pools for the archive: one per event loop, errors as pyrula's.

Each event loop (and so each thread) gets its own pool, created lazily, as the Valkey store
does with its clients; a forked child never reuses its parent's sockets. A pool is closed
with its loop (``asyncio.run()`` finalizes the loop's async generators), by ``aclose()`` on
its loop, or by ``close()`` from another thread. asyncpg is imported on first use only.

Errors: an unreachable server, a refused or dropped connection or a timeout raise
ArchiveUnavailable (a StoreUnavailable) and the connection is dropped; a missing table,
column or schema raises ArchiveSchemaMismatch; any other error of the database raises
ArchiveError.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

from pyrula.errors import ArchiveSchemaMismatch, ConfigurationError, PyrulaError, StoreUnavailable

logger = logging.getLogger(__name__)

INSTALL_HINT = 'pip install "pyrula[workflows,postgres]"'


class ArchiveError(PyrulaError):
    """The archive's database refused a statement for a reason other than an outage or a
    schema mismatch (``sqlstate`` says which)."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class ArchiveUnavailable(StoreUnavailable):
    """The Postgres archive could not be reached (a StoreUnavailable, so code that handles
    store outages handles this one; the archiving store tells the two apart)."""


def asyncpg_module() -> Any:
    try:
        import asyncpg
    except ImportError:
        raise ConfigurationError(
            f"the Postgres archive needs asyncpg, which is not installed: {INSTALL_HINT}"
        ) from None
    return asyncpg


def redact(dsn: str) -> str:
    """The DSN without its password, for messages."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparsable dsn>"
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


class LoopPools:
    """The pools of one DSN, one per event loop."""

    def __init__(self, dsn: str, *, schema: str, max_size: int, connect_timeout: float,
                 command_timeout: float) -> None:
        self.dsn = dsn
        self.schema = schema
        self._max_size = max_size
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._lock = threading.Lock()
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._init_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._pid = os.getpid()

    def where(self) -> str:
        parts = urlsplit(self.dsn)
        database = parts.path.lstrip("/") or "postgres"
        return f"{parts.hostname or 'localhost'}:{parts.port or 5432}/{database}"

    def unavailable(self, exc: BaseException) -> ArchiveUnavailable:
        detail = str(exc) or type(exc).__name__
        return ArchiveUnavailable(f"Postgres archive at {self.where()}: {detail}")

    async def pool(self) -> Any:
        """This event loop's pool."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._pid != os.getpid():  # never reuse a parent's sockets after fork
                self._pools = weakref.WeakKeyDictionary()
                self._closers = weakref.WeakKeyDictionary()
                self._init_locks = weakref.WeakKeyDictionary()
                self._pid = os.getpid()
            pool = self._pools.get(loop)
            if pool is not None:
                return pool
            init_lock = self._init_locks.setdefault(loop, asyncio.Lock())
        async with init_lock:  # one task builds it; the others wait for it
            with self._lock:
                pool = self._pools.get(loop)
            if pool is not None:
                return pool
            asyncpg = asyncpg_module()
            try:
                # min_size=0: nothing connects until the first query, so building the pool
                # never fails and a server that comes back is simply used again.
                pool = await asyncpg.create_pool(
                    self.dsn, min_size=0, max_size=self._max_size,
                    timeout=self._connect_timeout, command_timeout=self._command_timeout,
                )
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                raise self.unavailable(exc) from exc
            closer = self._closer(pool)
            await closer.__anext__()
            with self._lock:
                self._pools[loop] = pool
                self._closers[loop] = closer
            return pool

    async def _closer(self, pool: Any) -> AsyncIterator[None]:
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pool.close(), 5.0)

    async def acquire(self) -> tuple[Any, Any]:
        """(pool, connection) from this loop's pool; release with ``pool.release``."""
        pool = await self.pool()
        try:
            return pool, await pool.acquire()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # refused, unknown database, auth, timeout: unavailable
            raise self.unavailable(exc) from exc

    @contextlib.contextmanager
    def translated(self, conn: Any) -> Iterator[None]:
        """Database errors of ``conn`` as pyrula's (see the module docstring)."""
        asyncpg = asyncpg_module()
        try:
            yield
        except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError,
                asyncpg.UndefinedColumnError) as exc:
            raise ArchiveSchemaMismatch(
                f"the archive schema {self.schema!r} in {self.where()} changed under this "
                f"process ({exc}); run `pyrula db check`"
            ) from exc
        except (OSError, TimeoutError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
                asyncpg.exceptions.InternalClientError,
                asyncpg.exceptions.OperatorInterventionError,
                asyncpg.exceptions.InsufficientResourcesError) as exc:
            # E.g. the server ended the connection while it sat in the pool (a restart,
            # pg_terminate_backend): its protocol state is unusable, never hand it out.
            with contextlib.suppress(Exception):
                conn.terminate()
            raise self.unavailable(exc) from exc
        except asyncpg.PostgresError as exc:
            raise ArchiveError(
                f"Postgres archive at {self.where()}: {type(exc).__name__}: {exc}",
                getattr(exc, "sqlstate", None),
            ) from exc

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A pooled connection whose errors are translated."""
        pool, conn = await self.acquire()
        try:
            with self.translated(conn):
                yield conn
        finally:
            with contextlib.suppress(Exception):
                await pool.release(conn)

    async def aclose(self) -> None:
        """Close this event loop's pool."""
        loop = asyncio.get_running_loop()
        with self._lock:
            pool = self._pools.pop(loop, None)
            self._closers.pop(loop, None)
        if pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pool.close(), 5.0)

    def close(self) -> None:
        """Close the pools of every loop still running (a pool whose loop has ended is
        dropped; its loop's shutdown closed it)."""
        with self._lock:
            pools = list(self._pools.items())
            self._pools = weakref.WeakKeyDictionary()
            self._closers = weakref.WeakKeyDictionary()
        for loop, pool in pools:
            if loop.is_closed() or not loop.is_running():
                continue
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                continue  # cannot block on our own loop; aclose() is the async path
            future = asyncio.run_coroutine_threadsafe(pool.close(), loop)
            try:
                future.result(timeout=5.0)
            except Exception:  # closing is best effort
                logger.debug("closing a Postgres pool failed", exc_info=True)
