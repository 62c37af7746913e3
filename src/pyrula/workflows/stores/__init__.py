"""Stores: the Store protocol and its backends, chosen by URL with ``store_from_url``."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pyrula.config.parse import redact_url
from pyrula.config.schemes import BACKEND_MODULES, SCHEMES, VALKEY_SCHEMES, backend_module
from pyrula.config.store_url import check_url, shown_url, sqlite_file
from pyrula.workflows.errors import ConfigurationError
from pyrula.workflows.stores.base import Store


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


__all__ = ["BACKEND_MODULES", "SCHEMES", "VALKEY_SCHEMES", "Store", "backend_module",
           "check_url", "shown_url", "sqlite_file", "store_from_url"]
