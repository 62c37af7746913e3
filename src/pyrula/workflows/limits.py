"""Per-key concurrency limits and start rates of a workflow: ``@workflow(concurrency=Limit(
key=..., max=N), rate=Rate(key=..., per_second=R))``.

A run's keys are computed from its params, by the submitting client when that process
has the workflow's definition, else by the worker at the run's first claim
(:func:`compute_keys`). The store keeps them with the run and enforces the limits in the
claim's own atomic step:

- concurrency: at most ``max`` runs of one key of the workflow hold a slot. A run holds
  its key's slot from its claim until its attempt ends the run, parks it (sleeping or
  waiting for a signal: a parked run holds no slot, and competes again once woken), or
  its lock is lost and it is requeued (a dead worker's runs free their slots when the
  orphan scan requeues them).
- rate: at most ``per_second`` runs of one key start per second, a token bucket (one
  second of starts at most) kept in the store.

Runs over their limit stay queued: a queued run of a limited workflow waits in its
key's waiting line (FIFO), out of its owner's queue, and is admitted to that queue when a
slot (and a token) is free, in the claim that then takes it. A claim never returns a run
over its limit. The one exception: a run whose keys were not computed at submit (the
CLI submitted it) is claimed once without them; the worker computes them and, if the key
is over its limit, hands the run back to its key's waiting line (``assign_limit_keys``).

Every built-in store enforces them (the ``KeyedLimits`` ability), across every worker and
fleet on it: memory (stores/memory/limits.py, the reference), SQLite
(stores/sqlite/limits.py), Valkey standalone and cluster (stores/valkey/limits.py), and an
archiving store over any of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The longest key, in characters.
MAX_KEY_LENGTH = 500


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``max`` runs per key (``key(params)``) of the workflow run at once."""

    key: Callable[[Any], Any]
    max: int

    def __post_init__(self) -> None:
        _check_key("Limit", self.key)
        if isinstance(self.max, bool) or not isinstance(self.max, int) or self.max < 1:
            raise ValueError(f"Limit(max=...) must be an int >= 1, got {self.max!r}")


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``per_second`` runs per key (``key(params)``) of the workflow start a
    second (a token bucket holding one second of starts, at least one)."""

    key: Callable[[Any], Any]
    per_second: float

    def __post_init__(self) -> None:
        _check_key("Rate", self.key)
        value = self.per_second
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"Rate(per_second=...) must be a number > 0, got {value!r}")


def _check_key(what: str, key: Any) -> None:
    if not callable(key):
        raise TypeError(
            f"{what}(key=...) must be callable (params -> key), got {type(key).__name__}"
        )


@dataclass(frozen=True, slots=True)
class LimitKeys:
    """A run's keys: its concurrency key and its rate key (None: that limit is absent)."""

    concurrency: str | None = None
    rate: str | None = None


@dataclass(frozen=True, slots=True)
class WorkflowLimits:
    """The limits of one workflow as a store enforces them (no key functions)."""

    max: int | None = None
    per_second: float | None = None


class LimitKeyFailed(ValueError):
    """A workflow's key function raised or returned no usable key for a run's params."""


def limits_of(concurrency: Limit | None, rate: Rate | None) -> WorkflowLimits | None:
    """What a store needs to enforce these limits; None when there are none."""
    if concurrency is None and rate is None:
        return None
    return WorkflowLimits(
        max=concurrency.max if concurrency is not None else None,
        per_second=float(rate.per_second) if rate is not None else None,
    )


def compute_keys(
    name: str, concurrency: Limit | None, rate: Rate | None, params: Any
) -> LimitKeys:
    """The keys of a run of workflow ``name`` with ``params``; LimitKeyFailed naming the
    workflow and the limit if a key function raises or returns neither a str nor an int."""
    return LimitKeys(
        concurrency=_key(name, "concurrency", concurrency, params),
        rate=_key(name, "rate", rate, params),
    )


def _key(name: str, what: str, limit: Limit | Rate | None, params: Any) -> str | None:
    if limit is None:
        return None
    try:
        value = limit.key(params)
    except Exception as exc:
        raise LimitKeyFailed(
            f"the {what} key of workflow {name!r} failed for these params: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise LimitKeyFailed(
            f"the {what} key of workflow {name!r} must return a str or an int, "
            f"got {type(value).__name__}"
        )
    key = str(value)
    if len(key) > MAX_KEY_LENGTH:
        raise LimitKeyFailed(
            f"the {what} key of workflow {name!r} is {len(key)} characters, above "
            f"the limit of {MAX_KEY_LENGTH}"
        )
    return key
