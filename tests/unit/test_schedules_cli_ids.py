"""The id ``pyrula schedules create`` derives: stable across releases (a changed id would
make a user's repeated ``create`` add a second schedule), and a function of what the
schedule runs and when, only."""

from __future__ import annotations

from pyrula.cli.schedules import derived_id
from pyrula.workflows.schedules import Schedule


def test_the_derived_id_is_pinned() -> None:
    # The example of docs/schedules.md.
    assert derived_id("nightly_report", "0 2 * * *", None, {"window": "24h"},
                      "Europe/Berlin") == "nightly_report-0579ddb40e716c8f"


def test_params_compare_as_json_and_every_input_counts() -> None:
    base = derived_id("w", "0 2 * * *", None, {"a": 1, "b": [1, 2]}, "UTC")
    assert derived_id("w", "0 2 * * *", None, {"b": [1, 2], "a": 1}, "UTC") == base
    others = {
        derived_id("v", "0 2 * * *", None, {"a": 1, "b": [1, 2]}, "UTC"),
        derived_id("w", "0 3 * * *", None, {"a": 1, "b": [1, 2]}, "UTC"),
        derived_id("w", None, 300, {"a": 1, "b": [1, 2]}, "UTC"),
        derived_id("w", "0 2 * * *", None, {"a": 2, "b": [1, 2]}, "UTC"),
        derived_id("w", "0 2 * * *", None, {"a": 1, "b": [1, 2]}, "Europe/Berlin"),
    }
    assert base not in others and len(others) == 5


def test_a_name_unfit_for_an_id_still_gives_a_valid_id() -> None:
    sid = derived_id("billing report/nightly\t" + "x" * 300, None, 60, None, "UTC")
    assert sid.startswith("billing_report_nightly_x") and len(sid) == 64 + 1 + 16
    Schedule.create("w", every=60, schedule_id=sid)  # accepted as a schedule id
