"""Two rules of the package's layout, kept by a test as the code changes.

- The run router (``pyrula.workflows.http``) mounts the dashboard's page; the page takes
  what it shares with the router from ``pyrula.workflows.answers``, never from the router:
  one depends on the other, not both.
- The supervisor's state machine (``pyrula.supervisor.supervisor``) stays under 500 lines;
  its pure parts live in modules of their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pyrula

PACKAGE = Path(pyrula.__file__).parent


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_dashboard_never_imports_the_run_router() -> None:
    dashboard = sorted((PACKAGE / "dashboard").rglob("*.py"))
    assert dashboard
    for path in dashboard:
        assert "pyrula.workflows.http" not in _imported(path), path


def test_the_run_router_imports_the_dashboard_page() -> None:
    # The direction kept: the router mounts the page (so the rule above is not vacuous).
    assert "pyrula.dashboard.app" in _imported(PACKAGE / "workflows" / "http.py")


def test_the_supervisor_module_stays_under_500_lines() -> None:
    lines = (PACKAGE / "supervisor" / "supervisor.py").read_text().count("\n")
    assert lines < 500, lines
