"""Every ```python block of the how-to pages and the README runs, each in a fresh
interpreter (blocks without ``asyncio.run(main())`` or an ``assert`` are illustrations)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["docs/writing-workflows.md", "docs/schedules.md", "docs/operations.md", "README.md"]


def _blocks() -> list[tuple[str, int, str]]:
    found = []
    for page in PAGES:
        text = (ROOT / page).read_text()
        for match in re.finditer(r"```python\n(.*?)```", text, re.S):
            line = text[: match.start()].count("\n") + 1
            found.append((page, line, match.group(1)))
    return found


@pytest.mark.parametrize(("page", "line", "code"), _blocks(), ids=lambda v: str(v)[:30])
def test_docs_example_runs(page: str, line: int, code: str, tmp_path: Path) -> None:
    if "asyncio.run(main())" not in code and "assert" not in code:
        pytest.skip("illustration only")
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, f"{page}:{line} failed:\n{proc.stderr}"
