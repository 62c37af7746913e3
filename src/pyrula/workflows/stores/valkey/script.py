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
import os

logger = logging.getLogger(__name__)


#: The Lua files, beside this module (read as plain files: ``importlib.resources`` would
#: add ~3 ms of imports to every fleet start).
_LUA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lua")


def _read(name: str) -> str:
    with open(os.path.join(_LUA, name), encoding="utf-8") as source:
        return source.read()


def _source() -> str:
    return "\n".join(_read(name) for name in sorted(os.listdir(_LUA))
                     if name.endswith(".lua"))


def _dispatch_text() -> str:
    return _read(_DISPATCH)


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
