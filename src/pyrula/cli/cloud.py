"""``pyrula cloud serve`` and ``pyrula cloud keys create``: the collector and its keys."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import click

from pyrula.cli.common import InputError
from pyrula.config.cloud import DEFAULT_PORT, ENVIRONMENT_PATTERN

CLOUD_STORE = click.option(
    "--store", default=None, metavar="URL", envvar="PYRULA_CLOUD_STORE",
    help="where the collector keeps what it receives: sqlite:///PATH or a postgresql:// DSN "
         "(default $PYRULA_CLOUD_STORE, else sqlite:///pyrula-cloud.db)",
)


def _database(store: str | None) -> Any:
    from pyrula.cloud.collector.sql import DEFAULT_STORE, database_for

    return database_for(store or DEFAULT_STORE)


@click.group("cloud")
def cloud() -> None:
    """The control plane fleets and workers report to (PYRULA_CLOUD_API_KEY)."""


@cloud.command("serve")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535))
@click.option("--host", default="127.0.0.1", show_default=True)
@CLOUD_STORE
def serve(port: int, host: str, store: str | None) -> None:
    """Collect reports from every fleet and worker; serve the dashboard and the API."""
    try:
        import uvicorn

        from pyrula.cloud.collector.app import build_app
    except ImportError as exc:
        raise InputError(f"pyrula cloud serve needs the http extra ({exc.name} is missing): "
                         "pip install 'pyrula[http]'") from None
    db = _database(store)
    asyncio.run(_check_store(db))
    click.echo(f"pyrula cloud collecting on http://{host}:{port} (store {db.where()})",
               err=True)
    uvicorn.run(build_app(db), host=host, port=port, log_level="warning", access_log=False)


async def _check_store(db: Any) -> None:
    """Open the store once before serving, so a bad one is one line, not a traceback."""
    from pyrula.errors import ConfigurationError

    try:
        await db.open()
    except Exception as exc:
        raise ConfigurationError(f"cannot open the collector's store {db.where()}: {exc}"
                                 ) from None
    finally:
        await db.close()


@cloud.group("keys")
def keys() -> None:
    """API keys: each names the environment its reports and submits belong to."""


@keys.command("create")
@click.argument("environment")
@CLOUD_STORE
def create(environment: str, store: str | None) -> None:
    """Make a key for ENVIRONMENT; it is printed once, alone on the last line."""
    if re.fullmatch(ENVIRONMENT_PATTERN, environment) is None:
        raise InputError(f"ENVIRONMENT must be lowercase letters, digits and '-' (at most 40, "
                         f"starting with a letter or digit), got {environment!r}")
    from pyrula.cloud.collector.records import create_key

    db = _database(store)

    async def make() -> str:
        await _check_store(db)
        await db.open()  # it opened once just now
        try:
            return await create_key(db, environment)
        finally:
            await db.close()

    key = asyncio.run(make())
    click.echo(f"created an API key for environment {environment} in {db.where()} "
               "(only its hash is kept: copy it now)")
    click.echo(key)
