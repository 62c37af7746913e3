"""The trace of a run whose fleet child was killed under it: both attempts, in one trace,
with the dead child's pid and exit signal, as ``pyrula runs show`` tells the same story."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pyrula.workflows import SyncWorkflowClient
from pyrula.workflows.tracing import export_run_sync, trace_id_of
from tests.conftest import wait_until
from tests.fleet.fleetprocs import QUICK, STORE_FILE, Fleets, child_env

pytestmark = pytest.mark.slow


def test_a_run_whose_child_is_killed_traces_both_attempts_and_the_kill(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    fleet = fleets.start("-n", "2", *QUICK)
    fleet.wait_ready(2)
    run = client.submit("fa_gated", {"tag": "t"})

    # The step blocks in the child that claimed the run until the test opens its gate.
    [victim] = wait_until(lambda: fleets.ran("gated", "t"), timeout=20, what="the step runs")
    # The kill's evidence carries the RSS the supervisor last measured: let it measure one.
    fleet.wait_status(lambda s: any(c["pid"] == victim and c["rss_bytes"]
                                    for c in s["children"]), what="the victim's RSS measured")
    os.kill(victim, signal.SIGKILL)
    ran = wait_until(lambda: len(fleets.ran("gated", "t")) == 2 and fleets.ran("gated", "t"),
                     timeout=20, what="the step runs again in another child")
    assert ran[1] != victim
    fleets.open_gate("t")
    assert client.result(run.run_id, timeout=20) == ran[1]
    assert client.get(run.run_id).attempt == 2

    exporter = InMemorySpanExporter()
    spans = export_run_sync(client, run.run_id, exporter)
    assert list(exporter.get_finished_spans()) == spans
    assert {s.context.trace_id for s in spans} == {trace_id_of(run.run_id)}
    by_name = {s.name: s for s in spans}
    assert set(by_name) == {"run fa_gated", "attempt 1", "attempt 2", "step gated"}
    first, second = by_name["attempt 1"], by_name["attempt 2"]
    assert (second.attributes or {})["pyrula.after"] == "orphaned"
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["pyrula.worker"] != second.attributes["pyrula.worker"]
    killed = [e for e in first.events if e.name == "child_killed"]
    assert len(killed) == 1, [e.name for e in first.events]
    facts = dict(killed[0].attributes or {})
    assert facts["pyrula.pid"] == victim
    assert facts["pyrula.exit_signal"] == "SIGKILL"
    assert "run_requeued" in [e.name for e in first.events]
    assert by_name["run fa_gated"].attributes == {
        "pyrula.run_id": run.run_id, "pyrula.workflow": "fa_gated",
        "pyrula.status": "completed", "pyrula.attempts": 2}

    # The CLI, a process of its own, reads the same two attempts and the requeue's reason.
    shown = subprocess.run(
        [sys.executable, "-m", "pyrula.cli", "runs", "show", run.run_id,
         "--store", f"sqlite:///{STORE_FILE}"],
        cwd=fleets.directory, env=child_env(), capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL, check=False,
    )
    assert shown.returncode == 0, shown.stderr
    attempts = [line for line in shown.stdout.splitlines() if " attempt " in line]
    assert len(attempts) == 2, shown.stdout
    assert attempts[0].endswith(f"attempt 1 on {first.attributes['pyrula.worker']}")
    worker1 = first.attributes["pyrula.worker"]
    assert f"attempt 2 (requeued: orphaned; {worker1} died: SIGKILL, pid {victim}, RSS " \
        in attempts[1], attempts[1]
    assert attempts[1].endswith(f" MB) on {second.attributes['pyrula.worker']}")

    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0
