"""This build's one Lua script: the operations of ``lua/`` (one per file, each opening with
its KEYS/ARGV/returns header) joined with a dispatch table, and its SHA-1, so a rolling
deploy adds exactly one entry to the server's script cache."""

from __future__ import annotations

import hashlib
import logging
from importlib import resources

logger = logging.getLogger(__name__)


def _source() -> str:
    files = sorted(
        (f for f in resources.files("pyrula.workflows.stores.valkey").joinpath("lua").iterdir()
         if f.name.endswith(".lua")),
        key=lambda f: f.name,
    )
    return "\n".join(f.read_text() for f in files)


SCRIPT = _source()
SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()
