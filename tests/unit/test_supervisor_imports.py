"""The supervisor never loads the engine or the worker, even through a package ``__init__``.

``test_layers`` reads import statements; this test runs them. Every ``pyrula.*`` module the
supervisor package imports (at module level or inside a function) is imported in a fresh
interpreter, and the engine and worker must not have been loaded as a side effect.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SUPERVISOR = Path(__file__).resolve().parents[2] / "src" / "pyrula" / "supervisor"
FORBIDDEN = ("pyrula.workflows.engine", "pyrula.workflows.worker")


def _supervisor_imports() -> list[str]:
    """Each ``pyrula.*`` import statement in the supervisor package, made absolute."""
    found: set[str] = set()
    for path in sorted(SUPERVISOR.glob("*.py")):
        stem = path.stem
        module = "pyrula.supervisor" if stem == "__init__" else f"pyrula.supervisor.{stem}"
        found.add(f"import {module}")
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update(f"import {a.name}" for a in node.names if a.name.startswith("pyrula."))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = ["pyrula", "supervisor"]
                    prefix = ".".join(parts[: len(parts) - node.level + 1])
                    base = f"{prefix}.{base}" if base else prefix
                if base.startswith("pyrula."):
                    names = ", ".join(a.name for a in node.names)
                    found.add(f"from {base} import {names}")
    return sorted(found)


def test_the_walk_finds_the_function_level_import_of_records() -> None:
    # recovery.py imports the records inside a function; the walk must see it.
    assert any(" pyrula.workflows.records " in line for line in _supervisor_imports())


def test_importing_what_the_supervisor_imports_loads_no_engine_or_worker() -> None:
    script = (
        "import sys\n"
        + "".join(f"{line}\n" for line in _supervisor_imports())
        + f"forbidden = {FORBIDDEN!r}\n"
        "print('\\n'.join(sorted(m for m in sys.modules\n"
        "    if any(m == f or m.startswith(f + '.') for f in forbidden))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], f"the supervisor's imports loaded {done.stdout.split()}"


def test_the_lazy_namespace_serves_every_public_name_from_its_module() -> None:
    import importlib

    import pyrula.workflows as api

    assert set(api.__all__) == set(api._SOURCES)
    assert set(api.__all__) <= set(dir(api))
    for name in api.__all__:
        source = importlib.import_module(api._SOURCES[name])
        assert getattr(api, name) is getattr(source, name)
    with pytest.raises(AttributeError, match="NoSuchName"):
        api.NoSuchName  # noqa: B018


def test_from_import_of_each_public_name_works_in_a_fresh_interpreter() -> None:
    import pyrula.workflows as api

    script = "".join(f"from pyrula.workflows import {name}\n" for name in api.__all__)
    script += "from pyrula.workflows import *\n"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
