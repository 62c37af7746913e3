"""Parsing option values from code, the environment and the command line.

Every parser raises ConfigurationError naming the option and the value it refused.
"""

from __future__ import annotations

import math
import os
import re

from pyrula.errors import ConfigurationError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
MIB = 1024 * 1024
_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2,
          "mib": 1024**2, "g": 1024**3, "gb": 1024**3, "gib": 1024**3}


def env_value(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None or value.strip() == "" else value.strip()


def parse_float(option: str, value: object, *, minimum: float = 0.0, strict: bool = False) -> float:
    if isinstance(value, bool):
        raise ConfigurationError(f"{option} must be a number of seconds, got {value!r}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigurationError(f"{option} must be a number, got {value!r}") from None
    if math.isnan(number) or math.isinf(number):
        raise ConfigurationError(f"{option} must be a finite number, got {value!r}")
    if number < minimum or (strict and number == minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise ConfigurationError(f"{option} must be {bound}, got {value!r}")
    return number


def parse_int(option: str, value: object, *, minimum: int = 0) -> int:
    if isinstance(value, bool):
        raise ConfigurationError(f"{option} must be an integer, got {value!r}")
    if isinstance(value, float):
        if not value.is_integer():
            raise ConfigurationError(f"{option} must be an integer, got {value!r}")
        value = int(value)
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        raise ConfigurationError(f"{option} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ConfigurationError(f"{option} must be >= {minimum}, got {value!r}")
    return number


def parse_bool(option: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigurationError(f"{option} must be true or false, got {value!r}")


def parse_bytes(option: str, value: object, *, minimum: int = 1) -> int:
    """An integer byte count, or a size such as ``512MB`` / ``16MiB``."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ConfigurationError(
                f"{option} must be a byte count such as 16777216 or 512MB, got {value!r}"
            )
        number = int(float(match.group(1)) * _UNITS[unit])
    if number < minimum:
        raise ConfigurationError(f"{option} must be >= {minimum} bytes, got {value!r}")
    return number


#: What a Valkey namespace may be made of. Every key of a store starts with
#: ``<namespace>:`` and the ACL that fences it is ``~<namespace>:*``: a character the
#: ACL's glob reads (``*``, ``?``, ``[``, ``]``, ``\``) would widen that fence to other
#: namespaces, and ``{``, ``}``, ``:`` and whitespace would change what a key means.
NAMESPACE_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,100}")
NAMESPACE_RULE = "1 to 100 of the characters A-Z a-z 0-9 . _ -"


def parse_namespace(option: str, value: object) -> str:
    """A Valkey key namespace, checked against ``NAMESPACE_PATTERN`` (never trimmed: a
    namespace with a stray space is refused rather than quietly made another)."""
    if not isinstance(value, str) or NAMESPACE_PATTERN.fullmatch(value) is None:
        raise ConfigurationError(
            f"{option} {value!r} is not a valid namespace: use {NAMESPACE_RULE} "
            "(no spaces, braces, colons or glob characters * ? [ ])"
        )
    return value


def redact_url(url: object) -> str:
    """``url`` as it may be shown in a message or a log: a password in it reads ``***``
    (a lone name before ``@``, which the Valkey store reads as a password, too)."""
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text
    authority, slash, tail = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not at:
        return text
    user = userinfo.split(":", 1)[0] if ":" in userinfo else ""
    return f"{scheme}://{user}:***@{host}{slash}{tail}"
