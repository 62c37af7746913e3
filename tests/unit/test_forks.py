"""What a fork copies of the run it forks (pure): the events of the calls before its point,
the signals and timer wakes recorded before that point, and nothing of the run's own
attempts."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyrula.workflows.forks import (
    ForkPoint,
    fork_copy,
    fork_origin,
    fork_point,
    forked_from,
    step_calls,
)

Event = dict[str, Any]


def journal(*events: Event) -> list[Event]:
    return [{"seq": seq, "ts": 1.0, **e} for seq, e in enumerate(events, start=1)]


def started(call: int, step: str) -> Event:
    return {"type": "step:started", "step": step, "call": call, "attempt": 1}


def completed(call: int, step: str) -> Event:
    return {"type": "step:completed", "step": step, "call": call, "result": call}


GATHERED = journal(
    {"type": "run:submitted", "name": "w"},
    {"type": "run:started", "attempt": 1},
    completed(1, "pyrula.now"),
    started(2, "mail"), started(3, "sms"),      # gathered: both started, then
    completed(3, "sms"),
    {"type": "run:waiting", "op": "pyrula.wait_for_signal", "call": 4, "signal": "ok"},
    completed(2, "mail"),                       # call 2 ends after call 4 began
    {"type": "signal:received", "name": "ok", "payload": 1},
    {"type": "run:started", "attempt": 2},
    started(5, "mail"), completed(5, "mail"),
)


def test_the_step_calls_are_the_calls_that_started_a_step() -> None:
    assert step_calls(GATHERED) == [(2, "mail"), (3, "sms"), (5, "mail")]


@pytest.mark.parametrize(("from_step", "call"), [("mail", 2), ("sms", 3), (3, 5), (1, 2)])
def test_the_fork_point_is_a_names_first_call_or_a_position(from_step: Any, call: int) -> None:
    assert fork_point("r", GATHERED, from_step).call == call


def test_a_fork_copies_the_calls_before_its_point_wherever_they_ended() -> None:
    copy = fork_copy(GATHERED, 4)
    assert [(e["type"], e.get("call")) for e in copy] == [
        ("step:completed", 1), ("step:started", 2), ("step:started", 3),
        ("step:completed", 3), ("step:completed", 2)]
    assert all("seq" not in e for e in copy)


def test_a_fork_past_a_wait_copies_the_signal_it_took() -> None:
    copy = fork_copy(GATHERED, 5)
    assert [e["type"] for e in copy][-2:] == ["step:completed", "signal:received"]
    assert "run:started" not in [e["type"] for e in copy]


def test_a_forks_key_names_the_run_call_and_step() -> None:
    point = fork_point("run:with:colons", GATHERED, "sms")
    key = point.key()
    assert forked_from(key) == ("run:with:colons", 3)
    assert fork_origin(key) == {"forked_from": "run:with:colons", "from_call": 3,
                                "from_step": "sms"}
    assert key != point.key(), "each fork is a run of its own"
    assert forked_from("retry:abc") is None and forked_from(None) is None


def test_a_key_that_only_starts_like_a_forks_is_no_fork() -> None:
    for key in ("fork:", "fork:nope", "fork:r:x:n", "fork:r:3", "fork:r:3:n:m", "fork:r:٣:n"):
        assert forked_from(key) is None, key
    assert forked_from("fork:r:3:") == ("r", 3)


@given(st.text(min_size=1))
def test_any_step_name_comes_back_from_a_forks_key(name: str) -> None:
    key = ForkPoint("r:1", 7, name).key()
    assert fork_origin(key) == {"forked_from": "r:1", "from_call": 7, "from_step": name}


def test_a_key_made_before_steps_were_named_or_a_clients_look_alike_names_no_step() -> None:
    for key in ("fork:r:3:0123456789ab", "fork:r:3:n.", "fork:r:3:n.abc", "fork:r:3:n.AB",
                "fork:r:3:n.ff", "fork:r:3:n.eda080", "fork:r:3:a.b.6161", "fork:r:3:n.6g"):
        assert fork_origin(key) == {"forked_from": "r", "from_call": 3}, key


async def test_runs_show_says_which_run_and_step_a_forks_first_attempt_was_forked_from(
    tmp_path: Any,
) -> None:
    from click.testing import CliRunner

    from pyrula.cli.runs import runs
    from pyrula.workflows import InlineWorkflowRunner, SQLiteStore, step, workflow

    @step(name="forks_cli.one")
    def one() -> int:
        return 1

    @step(name="forks_cli.two")
    def two() -> int:
        return 2

    @workflow(name="forks_cli.flow")
    async def flow(ctx: Any, params: Any) -> Any:
        return await one() + await two()

    path = tmp_path / "store.db"
    runner = InlineWorkflowRunner(store=SQLiteStore(str(path)), cloud=False)
    try:
        run = await runner.client.submit("forks_cli.flow", None)
        await runner.run(run.name, run.run_id)
        fork = await runner.client.fork(run.run_id, from_step="forks_cli.two")
        await runner.run(fork.name, fork.run_id)
        call = next(e["call"] for e in await runner.client.events(run.run_id)
                    if e.get("step") == "forks_cli.two")
    finally:
        await runner.aclose()
    store = f"sqlite:///{path}"
    shown = CliRunner().invoke(runs, ["show", fork.run_id, "--store", store])
    assert shown.exit_code == 0, shown.output
    (line,) = [line for line in shown.output.splitlines() if "attempt 1" in line]
    assert line.endswith(f", forked from {run.run_id} at step forks_cli.two (call {call})")
    shown = CliRunner().invoke(runs, ["show", run.run_id, "--store", store])
    assert "forked from" not in shown.output
    as_json = CliRunner().invoke(runs, ["show", fork.run_id, "--store", store, "--json"])
    (attempt,) = [e for e in json.loads(as_json.output)["timeline"] if e["kind"] == "attempt"]
    assert (attempt["forked_from"], attempt["from_call"]) == (run.run_id, call)
