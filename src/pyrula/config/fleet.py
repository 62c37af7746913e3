"""FleetOptions: every option of ``pyrula-fleet start``, its default and its check."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyrula.config.parse import (
    MIB,
    env_value,
    parse_bytes,
    parse_float,
    parse_int,
    parse_namespace,
)
from pyrula.config.worker import WorkerOptions
from pyrula.errors import ConfigurationError

DEFAULT_HEALTH_PORT = 8081
#: The store when neither ``--store`` nor ``PYRULA_STORE_URL`` names one: embedded SQLite.
DEFAULT_STORE_URL = "sqlite:///pyrula.db"


@dataclass(frozen=True)
class FleetOptions:
    """How the supervisor runs its children: how many, when to recycle or kill one, how long
    to drain (docs/deployment.md)."""

    children: int = 2
    apps: tuple[str, ...] = ()
    workflows: tuple[str, ...] = ()
    store_url: str = DEFAULT_STORE_URL
    namespace: str | None = None
    cluster: bool | None = None
    health_port: int = DEFAULT_HEALTH_PORT
    health_host: str = WorkerOptions.health_host
    max_runs_per_child: int | None = None
    max_memory_per_child: int | None = None
    memory_hard_limit: int | None = None
    child_timeout: float = 30.0
    stall_timeout: float = 60.0
    max_boot_failures: int = 5
    #: How long an upgrade's old generation may keep runs the new code cannot replay
    #: (None: until they end).
    drain_deadline: float | None = None
    #: Elastic sizing (``--min``/``--max``): None for a fixed-size fleet of ``children``.
    min_children: int | None = None
    max_children: int | None = None
    scale_up_after: float = 2.0
    scale_down_after: float = 60.0
    #: Whether the dashboard's actions (retry, cancel, signal) are served; read-only
    #: otherwise (``--dashboard-actions``).
    dashboard_actions: bool = False
    # The children drain with these (``child_worker_options``): the worker's own defaults.
    shutdown_grace: float = WorkerOptions.shutdown_grace
    cancel_timeout: float = WorkerOptions.cancel_timeout
    log_format: str = "text"
    log_level: str = "INFO"
    #: WorkerOptions given as flags (name -> raw value); the rest comes from PYRULA_*.
    worker_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.children < 1:
            raise ConfigurationError(f"-n (children) must be >= 1, got {self.children}")
        if not self.apps and not self.workflows:
            raise ConfigurationError("name what to serve: --app MODULE or --workflow MODULE:FN")
        if self.log_format not in ("text", "json"):
            raise ConfigurationError(f"--log-format must be json or text, got {self.log_format!r}")
        if self.namespace is not None:
            parse_namespace("--namespace (or PYRULA_VALKEY_NAMESPACE)", self.namespace)
        check_memory_limits(self.max_memory_per_child, self.memory_hard_limit)
        if self.max_boot_failures < 1:
            raise ConfigurationError(
                f"--max-boot-failures must be >= 1, got {self.max_boot_failures}"
            )
        self._check_bounds()

    def _check_bounds(self) -> None:
        low, high = self.min_children, self.max_children
        if low is None and high is None:
            return
        if low is None or high is None:
            raise ConfigurationError("--min and --max go together (elastic sizing needs both)")
        if low < 1:
            raise ConfigurationError(f"--min must be >= 1, got {low}")
        if high < low:
            raise ConfigurationError(f"--max ({high}) must be >= --min ({low})")
        if not low <= self.children <= high:
            raise ConfigurationError(
                f"-n (the start size, {self.children}) must be within --min {low} .. --max {high}"
            )

    @property
    def elastic(self) -> bool:
        """Whether the fleet sizes itself between ``--min`` and ``--max``."""
        return self.min_children is not None

    @property
    def child_worker_options(self) -> dict[str, Any]:
        """WorkerOptions every child gets in code (so they win over the environment)."""
        options = dict(self.worker_options)
        options["shutdown_grace"] = self.shutdown_grace
        options["cancel_timeout"] = self.cancel_timeout
        return options


def resolve_health_port(flag: Any, flag_name: str = "--health-port") -> int:
    """``--health-port``, else ``$PORT`` (as Procfile platforms set it), else 8081.
    ``flag_name`` is how a refusal names the flag's value (its variable, if it came from
    one)."""
    raw = flag if flag is not None else env_value("PORT")
    if raw is None:
        return DEFAULT_HEALTH_PORT
    name = flag_name if flag is not None else "PORT"
    port = parse_int(name, raw, minimum=0)
    if port > 65535:
        raise ConfigurationError(f"{name} must be a TCP port 0..65535, got {raw!r}")
    return port


def resolve_children(flag: Any, flag_name: str = "-n") -> int:
    """``-n``, else ``WEB_CONCURRENCY``, else 2."""
    raw = flag if flag is not None else env_value("WEB_CONCURRENCY")
    if raw is None:
        return FleetOptions.children
    return parse_int(flag_name if flag is not None else "WEB_CONCURRENCY", raw, minimum=1)


def resolve_bounds(
    children: Any, low: Any, high: Any, up_after: Any, down_after: Any,
    children_name: str = "-n",
) -> dict[str, Any]:
    """The sizing options of ``pyrula-fleet start``: ``children``, and with elastic sizing
    (``--min`` and ``--max``) the bounds and thresholds. The start size is ``-n`` if given,
    else ``--min`` (``WEB_CONCURRENCY`` sizes fixed fleets only). The thresholds without
    ``--min``/``--max`` are refused: they would silently do nothing."""
    low = None if low in (None, "") else parse_int("--min", low, minimum=1)
    high = None if high in (None, "") else parse_int("--max", high, minimum=1)
    if low is None and high is None:
        for name, raw in (("--scale-up-after", up_after), ("--scale-down-after", down_after)):
            if raw not in (None, ""):
                raise ConfigurationError(f"{name} needs --min and --max (elastic sizing)")
        return {"children": resolve_children(children, children_name)}
    start = low if children in (None, "") or low is None else parse_int(children_name, children,
                                                                         minimum=1)
    return {
        "children": start if start is not None else FleetOptions.children,
        "min_children": low,
        "max_children": high,
        "scale_up_after": parse_seconds("--scale-up-after", up_after,
                                        FleetOptions.scale_up_after),
        "scale_down_after": parse_seconds("--scale-down-after", down_after,
                                          FleetOptions.scale_down_after),
    }


def resolve_store_url(flag: str | None) -> str:
    """``--store``, else ``PYRULA_STORE_URL``, else the embedded ``sqlite:///pyrula.db``."""
    return flag or env_value("PYRULA_STORE_URL") or DEFAULT_STORE_URL


def parse_memory(raw: Any, option: str = "--max-memory-per-child") -> int | None:
    if raw is None or raw == "":
        return None
    return parse_bytes(option, raw, minimum=MIB)


def check_memory_limits(soft: int | None, hard: int | None) -> None:
    """A hard limit at or below the soft one would kill every child the soft limit is
    meant to replace gently."""
    if soft is not None and hard is not None and hard <= soft:
        raise ConfigurationError(
            f"--memory-hard-limit ({hard} bytes) must be above --max-memory-per-child "
            f"({soft} bytes): above the soft limit a child is replaced, above the hard one "
            "it is killed")


def parse_seconds(option: str, raw: Any, default: float, strict: bool = True) -> float:
    """Seconds from a flag or variable (empty: ``default``); > 0, or >= 0 if not strict."""
    if raw is None or raw == "":
        return default
    return parse_float(option, raw, minimum=0.0, strict=strict)

