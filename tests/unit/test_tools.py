"""A test skipped for a missing tool: skipped on a laptop, with its area named in the
session's last line; failed under ``CI=true``."""

from __future__ import annotations

import pytest

from tests.tools import area_of, needs_tool, summary


def test_a_missing_tool_skips_with_its_area_and_a_present_one_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CI", raising=False)
    needs_tool("chromium (dashboard browser tests)", None)  # present: nothing happens
    with pytest.raises(pytest.skip.Exception) as skipped:
        needs_tool("chromium (dashboard browser tests)", "no chromium on PATH")
    assert area_of(f"Skipped: {skipped.value.msg}") == (
        "chromium (dashboard browser tests)", "no chromium on PATH")


def test_under_ci_a_missing_tool_fails_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="libfaketime .*: not installed"):
        needs_tool("libfaketime (clock-jump chaos scenarios)", "not installed")


def test_the_summary_names_each_area_once_and_other_skips_not_at_all() -> None:
    assert area_of("Skipped: illustration only") is None
    areas = [("chromium (dashboard browser tests)", "not installed"),
             ("libfaketime (clock jumps)", "no libfaketime.so.1"),
             ("chromium (dashboard browser tests)", "not installed")]
    assert summary(areas) == ("skipped areas: chromium (dashboard browser tests): not "
                              "installed; libfaketime (clock jumps): no libfaketime.so.1")
    assert summary([]) == "skipped areas: none"
