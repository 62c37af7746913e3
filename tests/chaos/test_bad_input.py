"""Bad input on the command line: ``pyrula`` and ``pyrula-fleet`` exit 2 with one line on
stderr naming what is wrong, never a traceback, and write nothing to the store.

Real processes (``python -m pyrula.cli`` and the fleet's entry point) in the test's own
directory, over an SQLite file there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyrula.workflows import SQLiteStore, SyncWorkflowClient

SRC = Path(__file__).resolve().parents[2] / "src"
PYRULA = [sys.executable, "-m", "pyrula.cli"]
FLEET = [sys.executable, "-c", "from pyrula.cli.fleet import main; main()"]


def _run(command: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYRULA_")}
    clean.update(PYTHONPATH=str(SRC), **env)
    return subprocess.run(command, cwd=cwd, env=clean, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def _refused(proc: subprocess.CompletedProcess[str], says: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert says in lines[0], lines[0]


@pytest.mark.parametrize(("args", "says"), [
    (["submit", "orders", "{bad"], "PARAMS_JSON is not JSON"),
    (["submit", "orders", '{"ratio": NaN}'], "NaN is not JSON"),
    (["submit", "orders", "[Infinity]"], "Infinity is not JSON"),
    (["submit", "orders", "'single'"], "PARAMS_JSON is not JSON"),
    (["signal", "0" * 32, "go", "{bad"], "PAYLOAD_JSON is not JSON"),
    (["signal", "0" * 32, "", "1"], "signal name must be a non-empty str"),
    (["submit", "orders", "1", "--namespace", "ns"], "--namespace applies to Valkey stores"),
])
def test_a_bad_argument_is_one_line_and_exit_2_and_writes_nothing(
    tmp_path: Path, args: list[str], says: str
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = SQLiteStore(str(tmp_path / "store.db"))  # as the fleet creates it
    try:
        assert list(SyncWorkflowClient(store).list_runs(limit=10)) == []
        _refused(_run([*PYRULA, *args, "--store", url], tmp_path), says)
        assert list(SyncWorkflowClient(store).list_runs(limit=10)) == []
    finally:
        store.close()


BAD_STORES = [
    ("ftp://127.0.0.1:6379", "unknown store URL scheme 'ftp'"),
    ("redis://127.0.0.1:99999", "Port out of range"),
    ("redis://:6379", "no host"),
    ("redis://127.0.0.1:6379?ssl_ca_cert=ca.pem", "unknown query option 'ssl_ca_cert'"),
    ("redis://user:hunter2@127.0.0.1:0", "redis://user:***@127.0.0.1:0"),
]


@pytest.mark.parametrize(("url", "says"), BAD_STORES)
def test_a_worker_refuses_a_store_url_that_names_no_server(
    tmp_path: Path, url: str, says: str
) -> None:
    proc = _run([*PYRULA, "worker", "--app", "pyrula.examples.orders", "--store", url],
                tmp_path)
    _refused(proc, says)
    assert "hunter2" not in proc.stderr


@pytest.mark.parametrize(("url", "says"), BAD_STORES[:3])
def test_the_fleet_refuses_a_store_url_that_names_no_server(
    tmp_path: Path, url: str, says: str
) -> None:
    proc = _run([*FLEET, "start", "-n", "1", "--app", "pyrula.examples.orders",
                 "--health-port", "0", "--store", url], tmp_path)
    _refused(proc, says)


@pytest.mark.parametrize("namespace", ["a*b", "evid?x", "[a-z]", "two words", "a:b", "{t}",
                                       "line\nbreak", ""])
def test_a_bad_namespace_is_refused_from_the_flag_and_the_environment(
    tmp_path: Path, namespace: str
) -> None:
    url = "redis://127.0.0.1:6379"  # never reached: refused before any connection
    flag = _run([*PYRULA, "worker", "--app", "pyrula.examples.orders", "--store", url,
                 "--namespace", namespace], tmp_path)
    _refused(flag, f"--namespace (or PYRULA_VALKEY_NAMESPACE) {namespace!r} is not a valid")
    fleet = _run([*FLEET, "start", "-n", "1", "--app", "pyrula.examples.orders",
                  "--health-port", "0", "--store", url, "--namespace", namespace], tmp_path)
    _refused(fleet, f"--namespace (or PYRULA_VALKEY_NAMESPACE) {namespace!r} is not a valid")
    if namespace:  # an empty variable means unset, as for every PYRULA_* variable
        env = _run([*PYRULA, "get", "0" * 40, "--store", url], tmp_path,
                   PYRULA_VALKEY_NAMESPACE=namespace)
        _refused(env, "PYRULA_VALKEY_NAMESPACE")
