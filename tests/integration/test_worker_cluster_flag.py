"""``pyrula worker|dev --cluster/--no-cluster``: the flag the hidden-cluster error names,
passed on to the Valkey store as ``cluster``."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pyrula.workflows import SyncWorkflowClient, ValkeyStore
from tests.integration.workerprocs import APP_MODULE, STORE_URL, Workers, child_env, write_app


def _pyrula(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyrula.cli", *args], cwd=tmp_path,
                          env=child_env(), capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.mark.parametrize("command", ["worker", "dev"])
@pytest.mark.parametrize("flag", ["--cluster", "--no-cluster"])
def test_worker_and_dev_take_the_flag(tmp_path: Path, command: str, flag: str) -> None:
    done = _pyrula(tmp_path, command, flag, "--help")
    assert done.returncode == 0, done.stderr
    assert "--cluster / --no-cluster" in done.stdout


def test_a_worker_with_no_cluster_serves_runs_on_valkey(
    workers: Workers, valkey_url: str, valkey_namespace: str
) -> None:
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace, cluster=False)
    try:
        client = SyncWorkflowClient(store)
        run = client.submit("pp_two_steps", {"tag": "plain"})
        worker = workers.start("--store", valkey_url, "--namespace", valkey_namespace,
                               "--no-cluster")
        workers.wait_ran("two", "plain", worker.pid)
        workers.open_gate("plain")
        assert client.result(run.run_id, timeout=15) == {"one": "one",
                                                         "two": f"two-{worker.pid}"}
        worker.send(signal.SIGTERM)
        assert worker.wait() == 0
    finally:
        store.close()


@pytest.mark.parametrize("flag", ["--cluster", "--no-cluster"])
def test_the_flag_on_a_store_that_is_not_valkey_is_one_line_and_exit_2(
    tmp_path: Path, flag: str
) -> None:
    write_app(tmp_path)
    done = _pyrula(tmp_path, "worker", "--app", APP_MODULE, "--store", STORE_URL, flag)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--cluster/--no-cluster applies to Valkey stores only" in lines[0]
