"""What the fleet reads of its host without psutil (whose import would cost every start
tens of milliseconds): the memory available and in all, and a child's resident memory.
The figures must be psutil's own, since psutil is what they replace."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

from pyrula.supervisor.capacity import available_memory, meminfo, rss_of, total_memory


def test_the_hosts_memory_is_what_psutil_says() -> None:
    assert total_memory() == psutil.virtual_memory().total
    available = available_memory()
    assert available is not None
    # Both read MemAvailable, a moment apart: the same within what a moment moves.
    assert abs(available - psutil.virtual_memory().available) < 64 * 2**20


def test_a_childs_rss_is_what_psutil_says_and_none_once_it_exited() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"  # settled
        ours = rss_of(child.pid)
        theirs = psutil.Process(child.pid).memory_info().rss
        assert ours is not None and abs(ours - theirs) <= 1 * 2**20
    finally:
        child.communicate(b"")
    assert rss_of(child.pid) is None


def test_meminfo_reads_the_field_named_in_bytes_and_falls_back_to_psutil(
        tmp_path: Path) -> None:
    fake = tmp_path / "meminfo"
    fake.write_text("MemTotal:       16384 kB\nMemFree:         1024 kB\n"
                    "MemAvailable:    8192 kB\n")
    assert meminfo("MemAvailable", "available", str(fake)) == 8192 * 1024
    assert meminfo("MemTotal", "total", str(fake)) == 16384 * 1024
    # No such file (not Linux): psutil's figure.
    assert meminfo("MemTotal", "total", str(tmp_path / "absent")) == \
        psutil.virtual_memory().total


def test_rss_without_proc_is_psutils(tmp_path: Path) -> None:
    # A host without /proc (macOS): psutil's figure for a live process, None for a gone one.
    assert rss_of(os.getpid(), proc=str(tmp_path / "no-proc")) == \
        psutil.Process().memory_info().rss
