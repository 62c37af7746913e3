"""@projection as a user writes it: arguments checked with messages naming what is wrong,
the fingerprint following the code, the pure fold of a batch; the CLI and the RunRouter
reading and rebuilding a projection kept in a SQLite file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from pyrula.cli.main import cli
from pyrula.workflows import RunInfo, RunStatus, SQLiteStore, projection
from pyrula.workflows.http import OPENAPI, RunRouter
from pyrula.workflows.projections import (
    PROJECTIONS,
    WHOLE,
    ProjectionSpec,
    fold_runs,
    lineage,
    projection_spec,
)
from pyrula.workflows.stores.capabilities import ProjectionHead

T = 1_800_000_000.0


def _run(run_id: str, status: RunStatus = RunStatus.COMPLETED, **params: Any) -> RunInfo:
    return RunInfo(run_id, "unit.wf", status, 1, params, None, T, T, T, T, result=1)


def _ids(state: Any, run: RunInfo) -> Any:
    return [*(state or []), run.run_id]


def test_the_decorator_registers_a_spec_and_returns_the_fold() -> None:
    @projection("unit.ids", on="unit.wf")
    def ids(state: Any, run: RunInfo) -> Any:
        return _ids(state, run)

    spec = projection_spec(ids)
    assert (spec.name, spec.on, spec.keyed) == ("unit.ids", ("unit.wf",), False)
    assert PROJECTIONS.all()["unit.ids"] is spec
    assert ids(None, _run("a")) == ["a"]  # still the plain function


@pytest.mark.parametrize(("args", "error", "says"), [
    (("", ["wf"]), ValueError, "projection name must be a non-empty str"),
    ((7, ["wf"]), ValueError, "projection name must be a non-empty str"),
    (("p\n", ["wf"]), ValueError, "control characters"),
    (("p", []), ValueError, "on= must name at least one workflow"),
    (("p", None), ValueError, "on= must name at least one workflow"),
    (("p", [""]), ValueError, "projection 'p': on= a workflow name must be a non-empty"),
    (("p", [3]), ValueError, "projection 'p': on= 3 is not a @workflow"),
])
def test_bad_projection_arguments_are_refused_naming_them(args: tuple[Any, Any],
                                                          error: type, says: str) -> None:
    with pytest.raises(error, match=says):
        projection(*args)


def test_a_key_must_be_a_function_and_the_fold_a_callable() -> None:
    with pytest.raises(TypeError, match="key must be a function of the run, got str"):
        projection("p", ["wf"], key="customer")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="decorates a function fold"):
        projection("p", ["wf"])(5)  # type: ignore[arg-type]


def test_a_key_function_must_return_a_str_or_an_int() -> None:
    spec = ProjectionSpec("p", ("unit.wf",), _ids, key=lambda run: run.params["k"])
    assert spec.key_of(_run("a", k=7)) == "7"
    with pytest.raises(TypeError, match="returned list for run a; it must return a str"):
        spec.key_of(_run("a", k=[1]))


def test_fold_runs_is_pure_skips_continued_runs_and_wants_json() -> None:
    spec = ProjectionSpec("p", ("unit.wf",), _ids)
    states = {WHOLE: ["x"]}
    runs = [_run("a"), _run("b", RunStatus.CONTINUED), _run("c", RunStatus.FAILED)]
    assert fold_runs(spec, states, runs) == {WHOLE: ["x", "a", "c"]}
    assert states == {WHOLE: ["x"]}
    bad = ProjectionSpec("p", ("unit.wf",), lambda state, run: {1, 2})
    with pytest.raises(TypeError, match="returned a state that is not JSON after run a"):
        fold_runs(bad, {}, [_run("a")])


def test_the_fingerprint_follows_the_fold_the_key_and_on() -> None:
    base = ProjectionSpec("p", ("a",), _ids)
    assert base.fingerprint == ProjectionSpec("p", ("a",), _ids).fingerprint
    assert base.fingerprint != ProjectionSpec("p", ("a", "b"), _ids).fingerprint
    assert base.fingerprint != ProjectionSpec("p", ("a",), lambda s, r: s).fingerprint
    assert base.fingerprint != ProjectionSpec("p", ("a",), _ids, key=str).fingerprint


@pytest.mark.parametrize(("stored", "mine", "action", "recorded"), [
    ("", "f1", "rebuild", "f1"),
    ("f1", "f1", "fold", None),
    ("f2 f1", "f1", "stand_down", None),
    ("f2 f1", "f3", "rebuild", "f3 f2 f1"),
])
def test_lineage_rebuilds_for_new_code_and_stands_down_for_replaced_code(
    stored: str, mine: str, action: str, recorded: str | None,
) -> None:
    assert lineage(stored, mine) == (action, recorded)


def _kept(db: Path) -> None:
    async def save() -> None:
        store = SQLiteStore(str(db))
        try:
            head = ProjectionHead("unit.by_key", 0, "fp", True, (T, "run-1"), 2, T)
            assert await store.save_projection(head, {"a": {"n": 1}, "b": {"n": 1}},
                                               expected=0, reset=False)
        finally:
            await store.aclose()

    asyncio.run(save())


def _cli(db: Path, *args: str, code: int = 0) -> str:
    done = CliRunner().invoke(cli, ["projections", *args, "--store", f"sqlite:///{db}"])
    assert done.exit_code == code, done.output
    return done.output


def test_the_cli_lists_shows_and_rebuilds_a_projection(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    _kept(db)

    listed = json.loads(_cli(db, "list", "--json"))
    assert [(p["name"], p["folded"], p["keyed"]) for p in listed] == [("unit.by_key", 2, True)]
    assert listed[0]["checkpoint"] == {"finished_at": "2027-01-15T08:00:00.000Z",
                                     "run_id": "run-1"}
    assert "unit.by_key" in _cli(db, "list")
    assert json.loads(_cli(db, "show", "unit.by_key")) == {"a": {"n": 1}, "b": {"n": 1}}
    shown = json.loads(_cli(db, "show", "unit.by_key", "--key", "a", "--json"))
    assert (shown["key"], shown["state"], shown["version"]) == ("a", {"n": 1}, 1)
    assert "no projection named 'nope'" in _cli(db, "show", "nope", code=1)

    assert "rebuilding unit.by_key" in _cli(db, "rebuild", "unit.by_key")
    assert json.loads(_cli(db, "show", "unit.by_key")) == {}


async def test_the_router_serves_a_projection_and_its_keys(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    await asyncio.to_thread(_kept, db)
    store = SQLiteStore(str(db))
    try:
        transport = httpx.ASGITransport(app=RunRouter(store, dashboard=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            whole = (await http.get("/projections/unit.by_key")).json()
            assert whole["state"] == {"a": {"n": 1}, "b": {"n": 1}}
            keyed = (await http.get("/projections/unit.by_key", params={"key": "b"})).json()
            assert (keyed["key"], keyed["state"], keyed["folded"]) == ("b", {"n": 1}, 2)
            missing = await http.get("/projections/nope")
            assert (missing.status_code, missing.json()["error"]["code"]) == (
                404, "projection_not_found")
    finally:
        await store.aclose()
    assert "/projections/{name}" in OPENAPI["paths"]


def test_an_app_that_only_declares_projections_is_loaded(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from pyrula.apps import load

    (tmp_path / "only_projections_app.py").write_text(
        "from pyrula.workflows import projection\n\n"
        "@projection('unit.app_only', on=['unit.wf'])\n"
        "def fold(state, run):\n    return (state or 0) + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load(["only_projections_app"], []) is None
    assert "unit.app_only" in PROJECTIONS.all()
