"""Cloud reporting's settings: the API key, the collector's URL, the drain deadline, the spool.

Read once, when a worker or inline runner starts (``cloud_config``); every value that
cannot be used raises ``ConfigurationError`` naming the variable, whether or not a key is
set, so a typo is found before it matters. The connector needs nothing beyond the
standard library (``urllib`` on a thread), so no client package can be missing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pyrula.config.parse import parse_float
from pyrula.errors import ConfigurationError

KEY_ENV = "PYRULA_CLOUD_API_KEY"
URL_ENV = "PYRULA_CLOUD_URL"
DRAIN_ENV = "PYRULA_CLOUD_DRAIN_DEADLINE_S"
OUTBOX_ENV = "PYRULA_CLOUD_OUTBOX_PATH"
RECONCILE_ENV = "PYRULA_CLOUD_RECONCILE_S"
#: What ``pyrula cloud serve`` listens on by default, and so where a key reports without a URL.
DEFAULT_PORT = 8090
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
DEFAULT_DRAIN_DEADLINE_S = 5.0
#: How often the connectors of an environment look in the store for the critical events
#: of runs whose process died before sending them.
DEFAULT_RECONCILE_S = 30.0
#: A key is ``pyr_<environment>_<32 hex digits>``: its environment is readable from it.
ENVIRONMENT_PATTERN = r"[a-z0-9][a-z0-9-]{0,39}"
_KEY = re.compile(rf"pyr_({ENVIRONMENT_PATTERN})_([0-9a-f]{{32}})")


@dataclass(frozen=True, slots=True)
class CloudConfig:
    """Where and how a connector reports."""

    key: str
    environment: str
    url: str
    drain_deadline_s: float
    #: The spool's directory, or None (``off``).
    outbox: Path | None
    #: How often a connector reconciles the collector with the store's ended runs.
    reconcile_s: float = DEFAULT_RECONCILE_S


def key_environment(key: str) -> str:
    """The environment a key names; ConfigurationError if it is not a pyrula key."""
    match = _KEY.fullmatch(key.strip())
    if match is None:
        raise ConfigurationError(
            f"{KEY_ENV} is not a pyrula Cloud key (expected pyr_<environment>_<32 hex "
            "digits>, as `pyrula cloud keys create ENV` prints)"
        )
    return match.group(1)


def default_outbox(environ: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME/pyrula/outbox``, else ``~/.cache/pyrula/outbox``."""
    cache = environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(cache) if cache else Path.home() / ".cache") / "pyrula" / "outbox"


def _url(environ: Mapping[str, str]) -> str:
    raw = environ.get(URL_ENV, "").strip()
    if not raw:
        return DEFAULT_URL
    parts = urlsplit(raw)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ConfigurationError(f"{URL_ENV} must be an http:// or https:// URL, got {raw!r}")
    return raw.rstrip("/")


def _outbox(environ: Mapping[str, str]) -> Path | None:
    raw = environ.get(OUTBOX_ENV, "").strip()
    if raw.lower() == "off":
        return None
    return Path(raw).expanduser() if raw else default_outbox(environ)


def cloud_config(cloud: bool = True, environ: Mapping[str, str] | None = None
                 ) -> CloudConfig | None:
    """The connector's settings, or None when it is off (``cloud=False`` or no key).

    Raises ConfigurationError for a key that does not parse and for an unusable
    ``PYRULA_CLOUD_*`` value, the latter even without a key.
    """
    env = os.environ if environ is None else environ
    raw_drain = env.get(DRAIN_ENV, "").strip()
    drain = (parse_float(DRAIN_ENV, raw_drain) if raw_drain else DEFAULT_DRAIN_DEADLINE_S)
    url = _url(env)
    raw_reconcile = env.get(RECONCILE_ENV, "").strip()
    reconcile = (parse_float(RECONCILE_ENV, raw_reconcile, strict=True) if raw_reconcile
                 else DEFAULT_RECONCILE_S)
    key = env.get(KEY_ENV, "").strip()
    if not cloud or not key:
        return None
    return CloudConfig(key=key, environment=key_environment(key), url=url,
                       drain_deadline_s=drain, outbox=_outbox(env), reconcile_s=reconcile)


def check_cloud(cloud: bool = True) -> None:
    """Raise ConfigurationError for Cloud settings that cannot be used (see ``cloud_config``)."""
    cloud_config(cloud)
