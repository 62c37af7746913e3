"""Stores: the Store protocol and its backends, chosen by URL with ``store_from_url``."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pyrula.config.parse import redact_url
from pyrula.config.store_url import SCHEMES, VALKEY_SCHEMES, check_url, shown_url, sqlite_file
from pyrula.workflows.errors import ConfigurationError
from pyrula.workflows.stores.base import Store

#: The module of each scheme's backend (imported by ``store_from_url`` on first use).
BACKEND_MODULES = {
    "memory": "pyrula.workflows.stores.memory",
    "sqlite": "pyrula.workflows.stores.sqlite",
    **{scheme: "pyrula.workflows.stores.valkey" for scheme in VALKEY_SCHEMES},
}


def backend_module(url: str) -> str | None:
    """The module of the backend ``url`` names (None for a URL ``store_from_url`` refuses):
    what a fleet's fork server imports once, before it forks the children that open it."""
    scheme = urlsplit(url).scheme.lower() if isinstance(url, str) and "://" in url else ""
    return BACKEND_MODULES.get(scheme)


def store_from_url(url: str, **options: Any) -> Store:
    """Open the store a URL names: ``memory://``, ``sqlite:///path``, ``redis://``,
    ``rediss://``, ``valkey://`` or ``valkeys://``. Backends are imported lazily.

    Raises ConfigurationError for any other scheme.
    """
    check_url(url, directory=False)  # a missing directory is refused when the file opens
    scheme = urlsplit(url).scheme.lower()
    if scheme == "memory":
        from pyrula.workflows.stores.memory import MemoryStore

        return MemoryStore(**options)
    if scheme == "sqlite":
        from pyrula.workflows.stores.sqlite import SQLiteStore

        return SQLiteStore.from_url(url, **options)
    if scheme in VALKEY_SCHEMES:
        from pyrula.workflows.stores.valkey import ValkeyStore

        return ValkeyStore(url=url, **options)
    raise ConfigurationError(
        f"unknown store URL scheme {scheme!r} in {redact_url(url)!r}; use one of: "
        + ", ".join(f"{s}://" for s in SCHEMES)
    )


__all__ = ["SCHEMES", "VALKEY_SCHEMES", "Store", "check_url", "shown_url", "sqlite_file",
           "store_from_url"]
