"""The store URL schemes and the module of each one's backend.

A leaf that imports nothing: a fleet names the backend its fork server preloads before it
has imported anything else (``pyrula.supervisor.prestart``).
"""

#: The URL schemes of the Valkey store (TLS: ``rediss``, ``valkeys``).
VALKEY_SCHEMES = ("redis", "rediss", "valkey", "valkeys")
SCHEMES = ("memory", "sqlite", *VALKEY_SCHEMES)

#: The module of each scheme's backend (imported by ``store_from_url`` on first use).
BACKEND_MODULES = {
    "memory": "pyrula.workflows.stores.memory",
    "sqlite": "pyrula.workflows.stores.sqlite",
    **{scheme: "pyrula.workflows.stores.valkey" for scheme in VALKEY_SCHEMES},
}


def backend_module(url: str) -> str | None:
    """The module of the backend ``url`` names (None for a URL ``store_from_url`` refuses):
    what a fleet's fork server imports once, before it forks the children that open it."""
    if not isinstance(url, str) or "://" not in url:
        return None
    return BACKEND_MODULES.get(url.strip().partition("://")[0].lower())
