"""Payloads are JSON only: nothing a store, a client or a child process hands pyrula is ever
unpickled, unmarshalled or evaluated. A run's params, results and journal come from a
shared store that other processes (and, if it is misconfigured, other people) can write;
``pickle.loads`` of such bytes runs arbitrary code. So no module of ``src/`` may import a
deserialiser that can build arbitrary objects, or call ``eval``/``exec``, and the fleet's
pipes carry JSON bytes (``send_bytes``), never ``Connection.send`` (which pickles).

The fork server of ``multiprocessing`` pickles what the supervisor passes to a new child
(its options, by value; the trampoline, by reference): local, parent to its own child over a
socket only they share, and never anything read from a store."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "pyrula"
SOURCES = sorted(SRC.rglob("*.py"))

#: Modules whose loads build arbitrary objects (or run code) from bytes.
FORBIDDEN_MODULES = {"pickle", "_pickle", "cPickle", "marshal", "shelve", "dill",
                     "cloudpickle", "jsonpickle", "copyreg"}
FORBIDDEN_CALLS = {"eval", "exec", "__import__"}
#: multiprocessing.Connection methods that pickle what they carry.
PICKLING_METHODS = {"send", "recv"}


def _findings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.name if SRC not in path.parents else path.relative_to(SRC.parent)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    found.append(f"{where}:{node.lineno} imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] in FORBIDDEN_MODULES:
                found.append(f"{where}:{node.lineno} imports from {node.module}")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in FORBIDDEN_CALLS:
                found.append(f"{where}:{node.lineno} calls {func.id}()")
            elif (isinstance(func, ast.Attribute) and func.attr in PICKLING_METHODS
                  and isinstance(func.value, ast.Attribute | ast.Name)
                  and "conn" in ast.unparse(func.value).lower()):
                found.append(f"{where}:{node.lineno} calls {ast.unparse(func)}() (pickles)")
    return found


def test_the_sources_are_found() -> None:
    assert len(SOURCES) > 50
    assert SRC / "workflows" / "events.py" in SOURCES


def test_no_module_unpickles_unmarshals_or_evaluates() -> None:
    findings = [f for path in SOURCES for f in _findings(path)]
    assert findings == []


@pytest.mark.parametrize("snippet", [
    "import pickle\n", "import marshal as m\n", "from shelve import open\n",
    "import cloudpickle\n", "value = eval(text)\n", "exec(code)\n",
    "child.conn.send(message)\n", "obj = conn.recv()\n",
])
def test_the_scan_finds_each_forbidden_use(snippet: str, tmp_path: Path) -> None:
    # Each of these is reported, so a clean scan of src/ means something.
    probe = tmp_path / "probe.py"
    probe.write_text(snippet)
    assert _findings(probe), snippet


def test_the_scan_lets_json_and_byte_pipes_through(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import json\nimport orjson\nconn.send_bytes(b'{}')\n"
                     "conn.recv_bytes()\nstore.evalsha(sha)\n")
    assert _findings(probe) == []
