"""Several real processes share one SQLite file: claims are atomic, no run is claimed twice."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from pyrula.workflows import SQLiteStore, SyncWorkflowClient
from tests.conftest import wait_until

CLAIMER = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    from pyrula.workflows import SQLiteStore

    async def main(path: str, worker: str, go: str) -> None:
        store = SQLiteStore(path)
        store.ping()
        open(go + "." + worker, "w").close()  # ready
        while not os.path.exists(go):  # start together, so they really compete
            await asyncio.sleep(0.005)
        got = []
        idle = 0
        while idle < 20:
            runs = await store.claim(worker, ["pc_job"], limit=3, now=time.time(), lock_ttl=60)
            if not runs:
                idle += 1
                await asyncio.sleep(0.01)
                continue
            idle = 0
            for run in runs:
                got.append(run.run_id)
                await store.finish(run.run_id, run.token,
                                   [{"type": "run:completed", "ts": time.time(), "result": 1}],
                                   now=time.time(), status="completed", result=1)
        print(json.dumps(got))
        store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    """
)


def test_two_processes_claiming_from_one_file_never_get_the_same_run(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    store = SQLiteStore(path)
    client = SyncWorkflowClient(store)
    submitted = {client.submit("pc_job", {"i": i}).run_id for i in range(300)}
    go = str(tmp_path / "go")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, path, f"w{n}", go],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(3)
    ]
    wait_until(lambda: all(Path(f"{go}.w{n}").exists() for n in range(3)), 30, what="ready")
    Path(go).touch()
    claimed: list[list[str]] = []
    for proc in procs:
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        claimed.append(json.loads(out.strip().splitlines()[-1]))
    everything = [run_id for got in claimed for run_id in got]
    assert len(everything) == len(set(everything)), "a run was claimed twice"
    assert set(everything) == submitted
    assert sum(1 for got in claimed if got) >= 2, "the processes did not actually compete"
    for run_id in list(submitted)[:20]:
        info = client.get(run_id)
        assert info.status == "completed" and info.attempt == 1
    store.close()


def test_a_process_waiting_on_many_results_learns_of_ends_in_other_processes(
    tmp_path: Path,
) -> None:
    # The waiting process's event loop looks up the runs its waiters wait for together
    # (EndWatch), rather than each waiter polling its run on its own.
    import asyncio

    from tests.unit.test_sqlite_waits import watched

    path = str(tmp_path / "shared.db")
    store = SQLiteStore(path)
    client = SyncWorkflowClient(store)
    submitted = [client.submit("pc_job", {"i": i}).run_id for i in range(200)]
    go = str(tmp_path / "go")
    procs = [
        subprocess.Popen([sys.executable, "-c", CLAIMER, path, f"w{n}", go],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in range(2)
    ]
    lookups = 0
    real = store._reads.ends._ended

    async def counted(run_ids: list[str]) -> Any:
        nonlocal lookups
        lookups += 1
        return await real(run_ids)

    store._reads.ends._ended = counted  # type: ignore[method-assign]

    async def wait_all() -> list[str]:
        waits = [store.wait_result(run_id, timeout=60) for run_id in submitted]
        gathered = asyncio.gather(*waits)
        await watched(store._reads.ends, len(submitted))  # every waiter waits before any run ends
        await asyncio.to_thread(Path(go).touch)
        return [info.status for info in await gathered]

    wait_until(lambda: all(Path(f"{go}.w{n}").exists() for n in range(2)), 30, what="ready")
    try:
        statuses = asyncio.run(wait_all())
    finally:
        for proc in procs:
            out, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err
        store.close()
    assert statuses == ["completed"] * 200
    assert 1 <= lookups < 200, lookups
