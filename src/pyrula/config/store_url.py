"""Store URLs read without opening anything: which schemes there are, the file a SQLite URL
names, and how a URL is shown in a banner or a message.

Apart from the stores so that the supervisor, which never imports the engine or a store
backend, can check a URL and show it.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from pyrula.config.parse import redact_url
from pyrula.config.schemes import SCHEMES
from pyrula.errors import ConfigurationError


def sqlite_file(url: str) -> str | None:
    """The file a ``sqlite://`` URL names, as written (``sqlite:///rel.db`` -> ``rel.db``,
    ``sqlite:////abs.db`` -> ``/abs.db``); None for another scheme. Raises
    ConfigurationError for a SQLite URL that names no file."""
    if not isinstance(url, str) or "://" not in url:
        return None
    parts = urlsplit(url)
    if parts.scheme.lower() != "sqlite":
        return None
    path = unquote(parts.netloc + parts.path)
    if path.startswith("/") and not parts.netloc:
        path = path[1:]
    if not path:
        raise ConfigurationError(f"store URL {url!r} names no SQLite file")
    return path


def shown_url(url: str) -> str:
    """``url`` as a banner or a message shows it: a SQLite file by its absolute path (which
    file a process uses must not depend on where the reader stands), any other URL with
    its password redacted."""
    path = sqlite_file(url)
    if path is None:
        return redact_url(url)
    query = urlsplit(url).query
    return f"sqlite:///{os.path.abspath(path)}" + (f"?{query}" if query else "")


def check_url(url: str, *, directory: bool = True) -> None:
    """Refuse, without opening anything, a URL ``store_from_url`` would refuse: no scheme,
    an unknown one, a SQLite URL naming no file, or (``directory``) a file in a directory
    that does not exist, which opening it would refuse (ConfigurationError)."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"store URL {redact_url(url)!r} has no scheme; use one of: "
            + ", ".join(f"{s}://" for s in SCHEMES)
        )
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"unknown store URL scheme {scheme!r} in {redact_url(url)!r}; use one of: "
            + ", ".join(f"{s}://" for s in SCHEMES)
        )
    path = sqlite_file(url)
    if path is not None and directory:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ConfigurationError(f"SQLite store directory does not exist: {folder}")
