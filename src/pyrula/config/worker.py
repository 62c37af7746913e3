"""WorkerOptions: every option of a worker, its default, its variable and its check.

A value given in code wins over the environment (``PYRULA_<OPTION>``, plus the dedicated names
of ``ENV_NAMES``); the worker resolves them once, when constructed (``worker.options``).
A bad value raises ConfigurationError naming the option.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyrula.config.defaults import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_POISON_MAX_RETRIES,
    DEFAULT_POISON_RETRY_TTL_S,
)
from pyrula.config.parse import parse_bool, parse_bytes, parse_float, parse_int
from pyrula.errors import ConfigurationError


@dataclass(frozen=True)
class WorkerOptions:
    """Options of a ``WorkflowWorker``; see docs/operations.md for what each one does."""

    max_concurrent_runs: int = 50
    claim_poll_interval: float = 0.1
    timer_poll_interval_s: float = 5.0
    timer_max_batch: int = 100
    orphan_scan_interval: float = 60.0
    shutdown_grace: float = 30.0
    cancel_timeout: float = 5.0
    shard_lease_interval: float = 10.0
    event_buffer_size: int = 64
    step_boundary_durability: bool = True
    reconcile_interval: float = 60.0
    projection_interval: float = 60.0
    #: How long after a run's end the projection loop folds it (a finish written late, with
    #: an earlier timestamp than runs already folded, is not skipped within it).
    projection_grace: float = 10.0
    journal_cache_events: int = 50000
    journal_cache_verify: bool = False
    lock_ttl: float = 15.0
    shard_lease_ttl: float = 30.0
    poison_max_retries: int = DEFAULT_POISON_MAX_RETRIES
    poison_retry_ttl_s: float = DEFAULT_POISON_RETRY_TTL_S
    stranded_policy: str = "wait"
    stranded_timeout: float = 86400.0
    schedule_interval: float = 30.0
    #: How often the trigger loop starts runs from due batches of events (BatchTrigger).
    trigger_interval: float = 1.0
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    #: The longest a parent waiting for child workflows sleeps between two looks at them.
    child_recheck: float = 60.0
    health_port: int | None = None
    health_host: str = "127.0.0.1"
    poison_counts_loop_blocked: bool = True
    project: str | None = None
    environment: str | None = None
    #: How long a starting worker waits for a store that does not answer, then fails
    #: (seconds; None: as long as it takes, as a running worker does).
    store_wait: float | None = None

    def __post_init__(self) -> None:
        for name in _fields():
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            object.__setattr__(self, name, _PARSERS[name](name, value))

    @property
    def given(self) -> frozenset[str]:
        """The options set explicitly in code (they win over the environment)."""
        return getattr(self, "_given", frozenset())

    def resolve(self, environ: Mapping[str, str] | None = None) -> WorkerOptions:
        """These options with every option not given in code read from the environment."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in _fields():
            if name in self.given:
                continue
            for variable in ENV_NAMES[name]:
                raw = env.get(variable)
                if raw is not None and raw.strip() != "":
                    values[name] = _from_env(name, variable, raw.strip())
                    break
        resolved = dataclasses.replace(self, **values)
        object.__setattr__(resolved, "_given", self.given)
        return resolved


def _fields() -> list[str]:
    return [f.name for f in dataclasses.fields(WorkerOptions)]


_field_init = WorkerOptions.__init__


def _init_recording_given(self: WorkerOptions, *args: Any, **kwargs: Any) -> None:
    _field_init(self, *args, **kwargs)
    given = set(kwargs) | set(_fields()[: len(args)])
    object.__setattr__(self, "_given", frozenset(given))


# Record which options code gave, so a default never hides an environment value.
setattr(WorkerOptions, "__init__", _init_recording_given)  # noqa: B010


def _seconds(minimum: float = 0.0, strict: bool = True) -> Callable[[str, Any], float]:
    return lambda name, value: parse_float(name, value, minimum=minimum, strict=strict)


def _count(minimum: int) -> Callable[[str, Any], int]:
    return lambda name, value: parse_int(name, value, minimum=minimum)


def _choice(*allowed: str) -> Callable[[str, Any], str]:
    def parse(name: str, value: Any) -> str:
        if value not in allowed:
            raise ConfigurationError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
        return str(value)

    return parse


def _port(name: str, value: Any) -> int:
    port = parse_int(name, value, minimum=0)
    if port > 65535:
        raise ConfigurationError(f"{name} must be a TCP port 0..65535, got {value!r}")
    return port


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"{name} must be a non-empty string, got {value!r}")
    return value.strip()


_PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "max_concurrent_runs": _count(1),
    "claim_poll_interval": _seconds(),
    "timer_poll_interval_s": _seconds(),
    "timer_max_batch": _count(1),
    "orphan_scan_interval": _seconds(),
    "shutdown_grace": _seconds(strict=False),
    "cancel_timeout": _seconds(strict=False),
    "shard_lease_interval": _seconds(),
    "event_buffer_size": _count(1),
    "step_boundary_durability": parse_bool,
    "reconcile_interval": _seconds(),
    "projection_interval": _seconds(),
    "projection_grace": _seconds(strict=False),
    "journal_cache_events": _count(0),
    "journal_cache_verify": parse_bool,
    "lock_ttl": _seconds(),
    "shard_lease_ttl": _seconds(),
    "poison_max_retries": _count(0),
    "poison_retry_ttl_s": _seconds(),
    "stranded_policy": _choice("wait", "fail"),
    "stranded_timeout": _seconds(),
    "schedule_interval": _seconds(),
    "trigger_interval": _seconds(),
    "max_payload_bytes": lambda name, value: parse_bytes(name, value, minimum=1),
    "child_recheck": _seconds(),
    "health_port": _port,
    "health_host": _text,
    "poison_counts_loop_blocked": parse_bool,
    "project": _text,
    "environment": _text,
    "store_wait": _seconds(strict=False),
}
_OPTIONAL = {"health_port", "project", "environment", "store_wait"}

#: Environment variables per option, the first set one wins. The dedicated names
#: (``PYRULA_WORKER_HEALTH_PORT``...) come before the generic ``PYRULA_<OPTION>``.
ENV_NAMES: dict[str, tuple[str, ...]] = {
    name: (f"PYRULA_{name.upper()}",) for name in _PARSERS
}
ENV_NAMES["health_port"] = ("PYRULA_WORKER_HEALTH_PORT", "PYRULA_HEALTH_PORT")
ENV_NAMES["health_host"] = ("PYRULA_WORKER_HEALTH_HOST", "PYRULA_HEALTH_HOST")


def _from_env(name: str, variable: str, raw: str) -> Any:
    try:
        return _PARSERS[name](name, raw)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{variable}: {exc}") from None
