"""Which build an open run needs, as an upgrade's audit reads it from the journal.

A run needs the build that last made progress on it. An attempt that refused the run (a
``build_mismatch`` right after its start) does not count, and neither does one that has
just started it and not yet decided: a newer worker that claimed the run a moment ago may
be about to refuse it, and the audit must not let the older generation go meanwhile.
Journals of attempts drawn by Hypothesis, judged against a model of that rule."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pyrula.workflows.worker.generations import BUILD_MISMATCH, UPGRADE, _ran_on

BUILDS = ("b-one", "b-two", "b-three")
#: How an attempt ended: it made progress (a step, then handed back), it refused the run,
#: or it is the attempt under way, with nothing written after its start yet.
OUTCOMES = ("progressed", "refused")


def journal_of(attempts: list[tuple[str, str]], deciding: str | None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"type": "run:submitted"}]
    for build, outcome in attempts:
        events.append({"type": "run:started", "build": build})
        if outcome == "progressed":
            events.append({"type": "step:completed", "step": "s"})
            events.append({"type": "run:requeued", "reason": UPGRADE})
        else:
            events.append({"type": "run:requeued", "reason": BUILD_MISMATCH})
    if deciding is not None:
        events.append({"type": "run:started", "build": deciding})
    return events


@given(
    attempts=st.lists(st.tuples(st.sampled_from(BUILDS), st.sampled_from(OUTCOMES)),
                      max_size=6),
    deciding=st.none() | st.sampled_from(BUILDS),
    asked=st.sampled_from(BUILDS),
)
def test_a_run_needs_the_build_that_last_made_progress_on_it(
    attempts: list[tuple[str, str]], deciding: str | None, asked: str,
) -> None:
    progressed = [build for build, outcome in attempts if outcome == "progressed"]
    last = progressed[-1] if progressed else None
    # An attempt under way may go on (its build needed) or refuse (the one before it).
    needs = {last} if deciding is None else {deciding, last}
    assert _ran_on(journal_of(attempts, deciding), asked) is (asked in needs)


def test_a_run_a_newer_worker_just_claimed_still_needs_the_older_build() -> None:
    journal = journal_of([("b-one", "progressed")], deciding="b-two")
    assert _ran_on(journal, "b-one")
