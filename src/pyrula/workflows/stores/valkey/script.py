"""This build's Lua: the operations of ``lua/`` (one per file, each opening with its
KEYS/ARGV/returns header) and a dispatch on the operation's name (ARGV[1]), in two forms.

- ``LIBRARY``: a Valkey function library, ``pyrula_<SHA[:16]>``, whose one function of the
  same name dispatches. The store calls it with FCALL: the library's top level (some 40
  operations and their helpers) runs once, when it is loaded, where a script's runs on
  every call (~7 µs of server CPU per call, of ~10). A rolling deploy adds one library;
  a store prunes them (``connection.Connection.load_script``).
- ``SCRIPT`` and its ``SHA``: the same code as one script, for EVALSHA, where the server
  refuses functions (a server before 7.0, a user without the FUNCTION commands)."""

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


def _dispatch_text() -> str:
    return resources.files("pyrula.workflows.stores.valkey").joinpath(
        "lua", _DISPATCH).read_text()


#: The dispatch as a script's last lines (KEYS and ARGV are a script's globals).
_DISPATCH = "zz_dispatch.lua"

SCRIPT = _source()
SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()

#: Every library a pyrula store loads is named with this prefix.
LIBRARY_PREFIX = "pyrula_"
FUNCTION = f"{LIBRARY_PREFIX}{SHA[:16]}"
LIBRARY = (
    f"#!lua name={FUNCTION}\n"
    + SCRIPT.replace(_dispatch_text(), "")
    # The same dispatch as the script's, its KEYS and ARGV the function's arguments.
    + f"\nredis.register_function('{FUNCTION}', function(KEYS, ARGV)\n"
    + _dispatch_text()
    + "end)\n"
)
