"""Defaults that more than one layer reads: the option's default in ``WorkerOptions`` and
the value the engine or a store falls back to when no option is given. Constants only, so
reading one costs no import of what uses it."""

from __future__ import annotations

from collections.abc import Mapping

#: The largest params, step result or signal payload a run accepts, as JSON bytes, unless
#: ``max_payload_bytes`` says otherwise.
DEFAULT_MAX_PAYLOAD_BYTES = 16 * 1024 * 1024

#: A run is quarantined past this many crashes within ``DEFAULT_POISON_RETRY_TTL_S``
#: seconds, unless the worker's ``poison_*`` options say otherwise.
DEFAULT_POISON_MAX_RETRIES = 3
DEFAULT_POISON_RETRY_TTL_S = 3600.0

#: The variable naming the Postgres archive's DSN: where it is set, every store a CLI, a
#: worker or a fleet child opens from a URL is archived there.
ARCHIVE_DSN_ENV = "PYRULA_POSTGRES_DSN"


def archive_configured(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` names an archive (``ARCHIVE_DSN_ENV`` set and not blank)."""
    return bool((environ.get(ARCHIVE_DSN_ENV) or "").strip())
