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
