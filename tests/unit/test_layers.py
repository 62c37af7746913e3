"""The import directions between the engine, the stores and the runtime.

The engine (definition, context, replay) imports no store backend, worker or supervisor;
the stores know nothing of workers or the engine; the supervisor never imports the engine
(it talks to children through exit codes, the heartbeat wire format and the store). And no
two src modules import each other, directly or round a longer circle, at import time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "pyrula"

ENGINE = {
    "pyrula.workflows.definition",
    "pyrula.workflows.build",
    "pyrula.workflows.compat",
    "pyrula.workflows.context",
    "pyrula.workflows.engine",
    "pyrula.workflows.replay",
    "pyrula.workflows.operations",
    "pyrula.workflows.blockers",
    "pyrula.workflows.writes",
    "pyrula.workflows.stop",
    "pyrula.workflows.events",
    "pyrula.workflows.history",
    "pyrula.workflows.errors",
    "pyrula.workflows.records",
    "pyrula.workflows.clock",
    "pyrula.workflows.schedules",
    "pyrula.workflows.triggers",
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
    "pyrula.workflows.build",
    "pyrula.workflows.compat",
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


# Import circles. Only what runs at import time counts: statements at module level (and in
# class bodies), not those inside functions or under ``if TYPE_CHECKING:``. ``import a.b.c``
# also runs ``a/__init__`` and ``a/b/__init__``, except the packages that hold the importing
# module, which are already initialised (or initialising) before it runs: a package's
# ``__init__`` importing its own submodules, which import their siblings, is not a circle.
# ``from pkg import name`` depends on ``pkg.name`` when that is a module, and on ``pkg`` itself
# unless ``pkg`` holds the importer and ``name`` is one of its submodules; a lazy namespace
# (a module-level ``_SOURCES`` table read by ``__getattr__``) depends on the module its
# table names.


def _runtime_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.If):
            test = node.test
            if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
            ):
                out.extend(_runtime_statements(node.orelse))
                continue
        out.append(node)
        for field in ("body", "orelse", "finalbody", "handlers"):
            children = getattr(node, field, None)
            if isinstance(children, list):
                for child in children:
                    if isinstance(child, ast.ExceptHandler):
                        out.extend(_runtime_statements(child.body))
                out.extend(_runtime_statements([c for c in children if isinstance(c, ast.stmt)]))
    return out


def _lazy_table(path: Path) -> dict[str, str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_SOURCES" for t in node.targets
        ):
            table = ast.literal_eval(node.value)
            assert isinstance(table, dict)
            return table
    return {}


PATHS = {_module_name(p): p for p in SRC.rglob("*.py")}
LAZY = {module: _lazy_table(path) for module, path in PATHS.items()}


def _holds(package: str, module: str) -> bool:
    return module.startswith(package + ".")


def _with_parents(importer: str, target: str) -> set[str]:
    parts = target.split(".")
    chain = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return {m for m in chain if m in PATHS and not _holds(m, importer) and m != importer}


def _import_time_edges(module: str) -> set[str]:
    path = PATHS[module]
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rsplit(".", 1)[0]
    edges: set[str] = set()
    for node in _runtime_statements(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                edges |= _with_parents(module, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                prefix = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{prefix}.{base}" if base else prefix
            edges |= _with_parents(module, base)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in PATHS:
                    edges |= _with_parents(module, sub)
                elif alias.name in LAZY.get(base, {}):
                    edges |= _with_parents(module, LAZY[base][alias.name])
                elif base in PATHS and (_holds(base, module)):
                    edges.add(base)  # a name the enclosing package's __init__ defines
    return edges


def _circles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Each strongly connected group of two or more modules (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph[node]:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"], "e": ["e"], "f": []}
    assert _circles(graph) == [["a", "b", "c"], ["e"]]


def test_lazy_from_imports_depend_on_the_module_their_table_names() -> None:
    assert LAZY["pyrula.workflows"]["WorkflowWorker"] == "pyrula.workflows.worker"
    assert "pyrula.workflows.worker" in _import_time_edges("pyrula.examples.__main__")


def test_no_import_circles_among_src_modules() -> None:
    graph = {m: sorted(_import_time_edges(m) & PATHS.keys()) for m in PATHS}
    circles = _circles(graph)
    for group in circles:
        print("import circle:", " <-> ".join(group))
    assert circles == []
