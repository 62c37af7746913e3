"""What a fleet imports on its way to the first run, held to a list.

A fleet's start is on the path of every deploy, scale-up and restart: the supervisor imports
what it needs to fork its children, the fork server what a child needs to claim, and
nothing else before that (the dashboard's web stack, tracing and the archive's driver load
later, or only where they are used). Each test imports, in a fresh interpreter, what one
of them imports before the first fork, and fails when a package outside its list, or a part
of pyrula it must not reach, comes in with it: a new import on that path is then a choice
made here, not an accident of some module's top.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from unittest import mock

import pytest

#: What the supervisor imports before its first fork: the CLI, then (while the fork server
#: loads the app) the supervisor, its health port and each store's backend.
SUPERVISOR = ("pyrula.cli.fleet_commands", "pyrula.supervisor.supervisor", "pyrula.supervisor.web",
              "pyrula.health_http", "pyrula.workflows.stores.sqlite",
              "pyrula.workflows.stores.valkey")
#: What the fork server imports for its children (``run_fleet``'s preload), with either
#: backend, and the archive (preloaded where one is configured).
CHILD = ("pyrula.workflows.worker.child", "pyrula.workflows.worker.worker",
         "pyrula.workflows.stores.sqlite", "pyrula.workflows.stores.valkey",
         "pyrula.workflows.stores.archive")

#: The packages outside the standard library each may load.
SUPERVISOR_PACKAGES = {"click", "hiredis", "orjson", "pyrula"}
CHILD_PACKAGES = {"hiredis", "orjson", "pyrula"}
#: Parts of pyrula each must not load (a child forks from the fork server's state: what the
#: supervisor alone uses would be copied into every child for nothing).
SUPERVISOR_FORBIDDEN = ("pyrula.workflows.engine", "pyrula.workflows.worker",
                        "pyrula.dashboard")
CHILD_FORBIDDEN = ("pyrula.cli", "pyrula.supervisor", "pyrula.dashboard")
#: Standard modules neither may load: each is used only by what comes later (a schedule's
#: time zone, a mistyped name's suggestions), and each cost the start 0.5 - 3 ms.
LATER = ("zoneinfo", "difflib", "calendar", "importlib.resources")


def loaded(modules: tuple[str, ...]) -> tuple[set[str], list[str]]:
    """The packages outside the standard library, and every module, that importing
    ``modules`` in a fresh interpreter loads."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    names: list[str] = json.loads(done.stdout)
    # Leading-underscore names are the interpreter's and the virtualenv's own (such as
    # _sysconfigdata_* and _distutils_hack), not packages an import chose.
    packages = {n.split(".")[0] for n in names} - set(sys.stdlib_module_names)
    return {p for p in packages if not p.startswith("_")}, names


@pytest.mark.parametrize(("what", "modules", "allowed", "forbidden"), [
    ("the supervisor", SUPERVISOR, SUPERVISOR_PACKAGES, SUPERVISOR_FORBIDDEN),
    ("a child", CHILD, CHILD_PACKAGES, CHILD_FORBIDDEN),
], ids=["supervisor", "child"])
def test_the_way_to_the_first_run_imports_only_its_list(
        what: str, modules: tuple[str, ...], allowed: set[str],
        forbidden: tuple[str, ...]) -> None:
    packages, names = loaded(modules)
    assert packages - allowed == set(), f"{what} now imports {sorted(packages - allowed)}"
    reached = [n for n in names if any(n == f or n.startswith(f + ".")
                                       for f in (*forbidden, *LATER))]
    assert reached == [], f"{what} now imports {reached}"


def test_the_lists_name_what_is_imported_now() -> None:
    # A package dropped from the path is dropped from its list too, so the list stays the
    # budget and does not quietly allow it back.
    assert loaded(SUPERVISOR)[0] == SUPERVISOR_PACKAGES
    assert loaded(CHILD)[0] == CHILD_PACKAGES


def test_the_child_list_is_what_the_fleet_preloads() -> None:
    from pyrula.supervisor.prestart import fork_server_spec

    def preloads(environ: dict[str, str]) -> set[str]:
        with mock.patch.dict(os.environ, environ, clear=True):
            return {module for url in ("sqlite:///x.db", "redis://127.0.0.1:6379")
                    for module in fork_server_spec([], [], url, "/")["preload"]}

    # The archive only where one is configured: its module is not on every child's way.
    assert preloads({}) == set(CHILD) - {"pyrula.workflows.stores.archive"}
    assert preloads({"PYRULA_POSTGRES_DSN": "postgresql://127.0.0.1/x"}) == set(CHILD)
