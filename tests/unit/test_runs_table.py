"""``pyrula runs list``'s table: its id column is as wide as the longest id shown, so a
Valkey store's 40-character run ids line up as SQLite's 32-character ones do."""

from __future__ import annotations

import pytest

from pyrula.cli.runs import runs_table
from pyrula.workflows.records import RunInfo, RunStatus


def _run(run_id: str, name: str) -> RunInfo:
    return RunInfo(run_id=run_id, name=name, status=RunStatus.COMPLETED, attempt=1,
                   params={}, owner="tenant-1", created_at=1796165901.0,
                   updated_at=1796165902.0)


@pytest.mark.parametrize("lengths", [(40, 40), (32, 32), (40, 32), (32, 40, 36)],
                         ids=["valkey", "sqlite", "mixed", "three"])
def test_the_columns_line_up_whatever_the_id_length(lengths: tuple[int, ...]) -> None:
    rows = [_run("a" * n, f"wf{i}") for i, n in enumerate(lengths)]
    header, *lines = runs_table(rows)
    column = header.index("WORKFLOW")
    assert column == max(lengths) + 2
    for i, line in enumerate(lines):
        assert line[column:].startswith(f"wf{i} "), (header, line)
        assert line.index("completed") == header.index("STATUS")
        assert line.index("tenant-1") == header.index("OWNER")
    assert lines[0].endswith("2026-12-01T22:58:21Z")
