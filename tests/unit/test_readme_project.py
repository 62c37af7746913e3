"""The README's "Use it in your project" section, and that what it says holds: the install
forms name this package and its extras, ``--app package.module`` imports from the
directory the command runs in, and the default store is ``./pyrula.db`` there."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from pyrula.cli.common import load_workflows
from pyrula.cli.main import cli
from pyrula.workflows import SQLiteStore, SyncWorkflowClient

ROOT = Path(__file__).resolve().parents[2]


def _section() -> str:
    text = (ROOT / "README.md").read_text()
    assert "\n## Use it in your project\n" in text
    return text.split("\n## Use it in your project\n", 1)[1].split("\n## ", 1)[0]


def test_the_section_says_how_to_install_import_and_find_the_store() -> None:
    section = _section()
    for said in ("pip install /path/to/pyrula", '"pyrula[http] @ git+https://', "--app",
                 "sys.path", "sqlite:///pyrula.db", "PYRULA_STORE_URL"):
        assert said in section, said
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "pyrula"
    for extra in ("http", "postgres", "otel"):
        assert f"`{extra}`" in section and extra in project["optional-dependencies"]


def test_app_imports_a_package_module_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "readme_shop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "workflows.py").write_text(
        "from pyrula.workflows import workflow\n"
        "MARK = 'from the working directory'\n"
        "@workflow(name='readme_shop.order')\n"
        "async def order(ctx, params):\n"
        "    return MARK\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        # What `--app readme_shop.workflows` does: the working directory is importable.
        load_workflows(("readme_shop.workflows",), ())
        assert sys.modules["readme_shop.workflows"].MARK == "from the working directory"
    finally:
        for name in ("readme_shop.workflows", "readme_shop"):
            sys.modules.pop(name, None)


def test_the_default_store_is_pyrula_db_where_the_command_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYRULA_STORE_URL", raising=False)
    refused = CliRunner().invoke(cli, ["submit", "readme_flow", "{}"], catch_exceptions=False)
    assert refused.exit_code == 1  # no fleet has made a store here: nothing is created
    assert f"no store at {tmp_path / 'pyrula.db'}" in refused.output
    SQLiteStore(str(tmp_path / "pyrula.db")).close()  # as a fleet started here makes it
    done = CliRunner().invoke(cli, ["submit", "readme_flow", "{}"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    run_id = json.loads(done.stdout)["run_id"]
    store = SQLiteStore(str(tmp_path / "pyrula.db"))
    try:
        assert SyncWorkflowClient(store).get(run_id).name == "readme_flow"
    finally:
        store.close()
