"""The Valkey store: sharded, scripted, cluster-ready (see keys.py for the data model)."""

from pyrula.workflows.stores.valkey.store import ValkeyStore

__all__ = ["ValkeyStore"]
