"""The import directions of STYLE.md: three rooms with doors between them, not through them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "pyrula"

ENGINE = {
    "pyrula.workflows.definition",
    "pyrula.workflows.context",
    "pyrula.workflows.engine",
    "pyrula.workflows.replay",
    "pyrula.workflows.operations",
    "pyrula.workflows.blockers",
    "pyrula.workflows.writes",
    "pyrula.workflows.stop",
    "pyrula.workflows.events",
    "pyrula.workflows.errors",
    "pyrula.workflows.records",
    "pyrula.workflows.clock",
    "pyrula.workflows.schedules",
}
BACKENDS = (
    "pyrula.workflows.stores.memory",
    "pyrula.workflows.stores.sqlite",
    "pyrula.workflows.stores.valkey",
    "pyrula.workflows.stores.archive",
)
RUNTIME = ("pyrula.workflows.worker", "pyrula.supervisor", "pyrula.cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    package = _module_name(path).rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


MODULES = {_module_name(p): _imports(p) for p in SRC.rglob("*.py")}


def _violations(modules: set[str] | tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for module, imports in sorted(MODULES.items()):
        if not any(module == m or module.startswith(m + ".") for m in modules):
            continue
        for name in sorted(imports):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{module} imports {name}")
    return bad


def test_the_engine_imports_no_store_backend_worker_or_supervisor() -> None:
    assert _violations(ENGINE, BACKENDS + RUNTIME) == []


def test_stores_know_nothing_of_workers_or_the_engine() -> None:
    stores = ("pyrula.workflows.stores",)
    forbidden = RUNTIME + ("pyrula.workflows.engine", "pyrula.workflows.context")
    assert _violations(stores, forbidden) == []


def test_the_supervisor_never_imports_the_engine() -> None:
    forbidden = (
        "pyrula.workflows.engine",
        "pyrula.workflows.definition",
        "pyrula.workflows.context",
        "pyrula.workflows.worker",
    )
    assert _violations(("pyrula.supervisor",), forbidden) == []


def test_nothing_in_src_imports_the_tests() -> None:
    assert _violations(("pyrula",), ("tests",)) == []


@pytest.mark.parametrize("module", sorted(ENGINE))
def test_engine_modules_exist(module: str) -> None:
    # A renamed module would silently escape the checks above.
    assert module in MODULES
