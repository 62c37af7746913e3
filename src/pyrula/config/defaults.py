"""Defaults that more than one layer reads: the option's default in ``WorkerOptions`` and
the value the engine or a store falls back to when no option is given. Constants only, so
reading one costs no import of what uses it."""

#: The largest params, step result or signal payload a run accepts, as JSON bytes, unless
#: ``max_payload_bytes`` says otherwise.
DEFAULT_MAX_PAYLOAD_BYTES = 16 * 1024 * 1024

#: A run is quarantined past this many crashes within ``DEFAULT_POISON_RETRY_TTL_S``
#: seconds, unless the worker's ``poison_*`` options say otherwise.
DEFAULT_POISON_MAX_RETRIES = 3
DEFAULT_POISON_RETRY_TTL_S = 3600.0
