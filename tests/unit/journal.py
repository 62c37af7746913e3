"""Small readers of a run's journal, shared by the engine tests."""

from __future__ import annotations

from typing import Any

Event = dict[str, Any]


def types(events: list[Event]) -> list[str]:
    return [e["type"] for e in events]


def of_type(events: list[Event], type_: str) -> list[Event]:
    return [e for e in events if e["type"] == type_]


def last(events: list[Event], type_: str) -> Event:
    found = of_type(events, type_)
    assert found, f"no {type_} event in {types(events)}"
    return found[-1]


def step_names(events: list[Event]) -> list[str]:
    """The steps the journal records as completed, in order (values like now() included)."""
    return [e["step"] for e in of_type(events, "step:completed")]
