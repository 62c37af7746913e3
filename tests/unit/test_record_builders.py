"""The records built for every run, built fast (``records.build_run_info`` and
``build_claimed_run``) and read from a Valkey run record (``codec.run_info``), must be
exactly what their plain constructors give, whatever the values: a field added to a record
and not to its builder, or two fields swapped, fails here."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyrula.workflows.records import (
    ClaimedRun,
    RunInfo,
    RunOutcome,
    RunStatus,
    build_claimed_run,
    build_run_info,
)
from pyrula.workflows.stores.valkey.codec import OUTCOME_FIELDS, run_info, run_outcome

ANY = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.floats(allow_nan=False),
                st.lists(st.integers(), max_size=2))


def drawn_kwargs(cls: type, data: st.DataObject, every: bool) -> dict[str, Any]:
    """Every required field, and each defaulted one or not (unless ``every``), with a
    drawn value."""
    out = {}
    for f in dataclasses.fields(cls):
        if (every or f.default is dataclasses.MISSING
                or data.draw(st.booleans(), label=f"{f.name}?")):
            out[f.name] = data.draw(ANY, label=f.name)
    return out


@settings(max_examples=200, deadline=None)
@given(st.data(), st.sampled_from([(RunInfo, build_run_info, True),
                                   (ClaimedRun, build_claimed_run, False)]))
def test_a_built_record_is_the_constructors_own(data: st.DataObject, case: Any) -> None:
    cls, build, every = case  # build_run_info takes every field, as run_info gives them
    kwargs = drawn_kwargs(cls, data, every)
    order = [f.name for f in dataclasses.fields(cls)]
    given_in_order = next((i for i, name in enumerate(order) if name not in kwargs), len(order))
    # The leading fields given may go by position, as to the constructor.
    by_position = data.draw(st.integers(0, given_in_order), label="positional")
    positional = [kwargs[name] for name in order[:by_position]]
    rest = {name: kwargs[name] for name in order[by_position:] if name in kwargs}
    built, made = build(*positional, **rest), cls(**kwargs)
    assert type(built) is cls
    assert built == made
    assert repr(built) == repr(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.run_id = "other"


def test_a_builder_asks_for_what_the_constructor_asks_for() -> None:
    with pytest.raises(TypeError, match="missing"):
        build_run_info("r", "w")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="missing"):
        build_claimed_run("r", "w")  # type: ignore[call-arg]


NUMBER = st.one_of(st.just(""), st.floats(0, 2e9).map(repr), st.integers(0, 10**9).map(str))
JSON = st.one_of(st.just(""), st.sampled_from(["null", "1", '"x"', '{"a": [1, 2]}', "[]"]))


@st.composite
def records(draw: Any) -> dict[str, str]:
    """A run record's hash as the store may hold it: a field absent, empty or set."""
    record = {"name": draw(st.text(min_size=1, max_size=8)),
              "status": draw(st.sampled_from([s.value for s in RunStatus])),
              "created_at": draw(st.floats(0, 2e9).map(repr))}
    optional = {
        "attempt": st.integers(0, 9).map(str), "params": JSON, "owner": st.text(max_size=3),
        "updated_at": NUMBER, "started_at": NUMBER, "finished_at": NUMBER, "result": JSON,
        "error": st.sampled_from(["", '{"code": "x", "message": "m"}']), "wake_at": NUMBER,
        "waiting_for": st.sampled_from(["", "[]", '["a", "b"]']), "interrupt": JSON,
        "idem": st.text(max_size=3), "start_id": st.text(max_size=3),
        "successor_id": st.text(max_size=3), "prio": st.sampled_from(["", "0", "7"]),
    }
    for name, values in optional.items():
        if draw(st.booleans()):
            record[name] = draw(values)
    return record


def model(run_id: str, f: dict[str, str]) -> RunInfo:
    """What each field of a record means, written field by field."""
    def num(key: str) -> float | None:
        value = f.get(key)
        return None if value is None or value == "" else float(value)

    def loads(key: str) -> Any:
        value = f.get(key)
        return None if value is None or value == "" else orjson.loads(value)

    waiting = f.get("waiting_for") or ""
    return RunInfo(
        run_id=run_id, name=f["name"], status=RunStatus(f["status"]),
        attempt=int(f.get("attempt", 0)), params=loads("params"),
        owner=f.get("owner") or None, created_at=float(f["created_at"]),
        updated_at=float(f.get("updated_at") or f["created_at"]),
        started_at=num("started_at"), finished_at=num("finished_at"),
        result=loads("result"), error=loads("error"), wake_at=num("wake_at"),
        waiting_for=tuple(orjson.loads(waiting)) if waiting else (),
        interrupt=loads("interrupt"), idempotency_key=f.get("idem") or None,
        start_id=f.get("start_id") or run_id, successor_id=f.get("successor_id") or None,
        priority=int(f.get("prio") or 0),
    )


@settings(max_examples=300, deadline=None)
@given(records())
def test_a_run_record_reads_as_its_fields_say(record: dict[str, str]) -> None:
    assert run_info("r" * 40, record) == model("r" * 40, record)


@settings(max_examples=50, deadline=None)
@given(records(), st.text(max_size=10).filter(lambda s: s not in set(RunStatus)))
def test_a_record_with_an_unknown_status_is_refused(record: dict[str, str],
                                                    status: str) -> None:
    with pytest.raises(ValueError, match="not a valid RunStatus"):
        run_info("r", {**record, "status": status})


@settings(max_examples=300, deadline=None)
@given(records())
def test_a_run_records_outcome_fields_read_as_its_whole_record_says(
        record: dict[str, str]) -> None:
    """``client.result()`` reads only OUTCOME_FIELDS of a record (``HMGET``, a field the
    record lacks comes back None): they must say what the whole record says."""
    values = [record.get(name) for name in OUTCOME_FIELDS]
    assert run_outcome(values) == RunOutcome.of(run_info("r" * 40, record))


def test_a_missing_record_has_no_outcome() -> None:
    assert run_outcome([None] * len(OUTCOME_FIELDS)) is None
