"""multiprocessing's resource tracker, forked from a young fleet supervisor
(``pyrula.supervisor.forkserver.fork_tracker``) rather than started as an interpreter: it
does its job as one started anew would, and leaves when its clients have gone."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import multiprocessing, os, sys
    from multiprocessing import resource_tracker
    from pyrula.supervisor import forkserver

    assert forkserver.fork_tracker()
    tracker = resource_tracker._resource_tracker
    assert tracker._pid is not None and tracker._check_alive()
    assert not forkserver.fork_tracker()  # one runs already
    # A named semaphore, registered with the tracker, then left behind: the tracker
    # unlinks it once this process has gone, and says so.
    lock = multiprocessing.get_context("spawn").Lock()
    print(tracker._pid, lock._semlock.name, flush=True)
    os._exit(0)
""")


def test_a_forked_resource_tracker_cleans_up_after_its_client() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    pid, name = done.stdout.split()
    assert int(pid) > 0
    assert "leaked semaphore objects to clean up at shutdown" in done.stderr, done.stderr
    # Gone as the tracker unlinked it: a semaphore of that name can be made anew.
    again = subprocess.run(
        [sys.executable, "-c",
         f"import _multiprocessing as m; s = m.SemLock(1, 1, 1, {name!r}, False); "
         f"m.sem_unlink({name!r})"],
        capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 0, again.stderr
