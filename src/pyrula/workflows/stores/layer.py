"""StoreLayer: a store built over another one, which changes only the calls it overrides.

A layer (the archiving store; a tracing or metrics layer would be another) holds the store
beneath it in ``inner``. Every operation of the :class:`~pyrula.workflows.stores.base.Store`
protocol it does not define itself goes to ``inner`` unchanged: the forwarding is derived
from the protocol's members, so an operation added to the protocol is forwarded without
anyone writing it again. The optional abilities (``capabilities()``) are the inner store's
unless the layer says otherwise; the inner store's other public attributes read through.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import Capabilities, capabilities_of

logger = logging.getLogger(__name__)


def protocol_members(protocol: type) -> Iterator[str]:
    """The public operations a Protocol class declares, its bases' included."""
    seen: set[str] = set()
    for klass in protocol.__mro__:
        if klass is object or not getattr(klass, "_is_protocol", False):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and callable(value) and name not in seen:
                seen.add(name)
                yield name


def _forward(name: str) -> Callable[..., Any]:
    def forward(self: StoreLayer, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"The inner store's ``{name}``."
    forward.forwarded = True  # type: ignore[attr-defined]
    return forward


class StoreLayer:
    """Forwards every ``Store`` operation to ``inner``; subclasses override what changes."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in protocol_members(Store):
            if not any(name in vars(klass) for klass in cls.__mro__ if klass is not StoreLayer):
                setattr(cls, name, _forward(name))

    def __getattr__(self, name: str) -> Any:
        # Only called for what the layer lacks: the inner store's other public attributes
        # (a ValkeyStore's ``shard_count``, the archive source's ``ended_runs``...).
        if name.startswith("_") or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def capabilities(self) -> Capabilities:
        """The inner store's optional abilities (a layer that adds one overrides this).
        The inner store's outcome read (``wait_outcome``) would go around a ``wait_result``
        the layer defines itself: a result is then waited for through the layer's."""
        inner = capabilities_of(self.inner)
        own_wait = not getattr(getattr(type(self), "wait_result", None), "forwarded", False)
        if inner.outcomes is not None and own_wait:
            return replace(inner, outcomes=None)
        return inner
