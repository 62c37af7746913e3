"""The fleet's memory limits, pure parts: the container's limit read from its cgroup files,
the per-child limits derived from it, their checks, and the hard limit's verdict."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pyrula.config.fleet import FleetOptions
from pyrula.config.parse import MIB
from pyrula.errors import ConfigurationError
from pyrula.supervisor.children import Child
from pyrula.supervisor.memory import (
    MemoryLimits,
    cgroup_memory_limit,
    read_cgroup_memory_limit,
    resolve_limits,
)
from pyrula.supervisor.watch import Kill, MemoryKill, Recycle, verdict
from pyrula.wire import Heartbeat

GIB = 1024 * MIB
V1_UNLIMITED = "9223372036854771712\n"  # what cgroup v1 writes for "no limit"


@pytest.mark.parametrize(
    ("v2", "v1", "physical", "expected"),
    [
        ("max\n", None, None, None),  # v2, no limit
        ("536870912\n", None, None, 512 * MIB),
        ("536870912\n", V1_UNLIMITED, None, 512 * MIB),  # v2 wins where both are mounted
        ("max\n", "536870912\n", None, None),
        (None, "1073741824\n", None, GIB),  # v1 only
        (None, V1_UNLIMITED, None, None),
        (None, str(1 << 60), None, None),  # any count this large limits nothing
        (None, None, None, None),  # no cgroup files: not in a container
        ("2147483648", None, 2 * GIB, None),  # at the host's memory: no limit
        ("2147483648", None, 4 * GIB, 2 * GIB),
        ("0\n", None, None, None),
        ("", None, None, None),
        ("garbage", None, None, None),
    ],
)
def test_cgroup_memory_limit(v2: str | None, v1: str | None, physical: int | None,
                             expected: int | None) -> None:
    assert cgroup_memory_limit(v2, v1, physical) == expected


def test_read_cgroup_memory_limit_reads_v2_then_v1_under_the_root(tmp_path: Path) -> None:
    assert read_cgroup_memory_limit(tmp_path) is None
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("268435456\n")
    assert read_cgroup_memory_limit(tmp_path) == 256 * MIB
    (tmp_path / "memory.max").write_text("max\n")
    assert read_cgroup_memory_limit(tmp_path) is None
    (tmp_path / "memory.max").write_text("134217728\n")
    assert read_cgroup_memory_limit(tmp_path) == 128 * MIB


@pytest.mark.parametrize(
    ("soft", "hard", "container", "children", "expected"),
    [
        # No container limit: what was given, nothing derived (as without this feature).
        (None, None, None, 2, MemoryLimits(None, None)),
        (100 * MIB, None, None, 2, MemoryLimits(100 * MIB, None)),
        # 3 GiB for 2 children: a share of 1 GiB each (the children plus one replacement).
        (None, None, 3 * GIB, 2,
         MemoryLimits(819 * MIB, 921 * MIB, 3 * GIB, ("soft", "hard"))),
        (None, None, 4 * GIB, 3,
         MemoryLimits(819 * MIB, 921 * MIB, 4 * GIB, ("soft", "hard"))),
        # Given limits win; only the one not given is derived.
        (500 * MIB, None, 3 * GIB, 2, MemoryLimits(500 * MIB, 921 * MIB, 3 * GIB, ("hard",))),
        (None, 900 * MIB, 3 * GIB, 2, MemoryLimits(819 * MIB, 900 * MIB, 3 * GIB, ("soft",))),
        (500 * MIB, 600 * MIB, 3 * GIB, 2, MemoryLimits(500 * MIB, 600 * MIB, 3 * GIB)),
        # A derived limit on the wrong side of the one given is left off, and said so.
        (950 * MIB, None, 3 * GIB, 2, MemoryLimits(
            950 * MIB, None, 3 * GIB, (), "the derived --memory-hard-limit 921 MB is not "
            "above the --max-memory-per-child given: left off")),
        (None, 800 * MIB, 3 * GIB, 2, MemoryLimits(
            None, 800 * MIB, 3 * GIB, (), "the derived --max-memory-per-child 819 MB is not "
            "under the --memory-hard-limit given: left off")),
        # Too small a share: a derived limit would recycle children that just started.
        (None, None, 256 * MIB, 4, MemoryLimits(
            None, None, 256 * MIB, (), "256 MB for 4 children is under 64 MB per child: "
            "no limit derived (give fewer children, or the limits)")),
    ],
)
def test_resolve_limits(soft: int | None, hard: int | None, container: int | None,
                        children: int, expected: MemoryLimits) -> None:
    assert resolve_limits(soft, hard, container, children) == expected


@pytest.mark.parametrize(("soft", "hard"), [(200 * MIB, 200 * MIB), (300 * MIB, 200 * MIB)])
def test_a_hard_limit_not_above_the_soft_one_is_refused(soft: int, hard: int) -> None:
    message = r"--memory-hard-limit \(\d+ bytes\) must be above --max-memory-per-child"
    with pytest.raises(ConfigurationError, match=message):
        resolve_limits(soft, hard, None, 2)
    with pytest.raises(ConfigurationError, match=message):
        FleetOptions(apps=("app",), max_memory_per_child=soft, memory_hard_limit=hard)


OPTIONS = FleetOptions(apps=("app",), child_timeout=30.0, max_memory_per_child=1000,
                       memory_hard_limit=2000)
NOW = 1000.0


def child(*, rss: int, retiring: bool = False, ready_seen: bool = True,
          killed_for: str | None = None, last_beat: float = NOW - 1) -> Child:
    made = Child(slot=0, process=SimpleNamespace(pid=100), conn=None,  # type: ignore[arg-type]
                 last_beat=last_beat, ready_seen=ready_seen, rss_bytes=rss, retiring=retiring,
                 killed_for=killed_for)
    made.beat = Heartbeat(state="ready" if ready_seen else "starting", worker_id="w0", pid=100)
    return made


@pytest.mark.parametrize(
    ("made", "serving", "expected"),
    [
        (child(rss=1500), True, Recycle("RSS 1500 bytes")),  # soft: replaced, not killed
        (child(rss=2000), True, Recycle("RSS 2000 bytes")),
        (child(rss=2001), True, MemoryKill(2001, 2000)),
        # The hard limit holds whatever the child is doing: draining, or still starting.
        (child(rss=2001, retiring=True), False, MemoryKill(2001, 2000)),
        (child(rss=2001, ready_seen=False), False, MemoryKill(2001, 2000)),
        (child(rss=2001, last_beat=NOW - 31), True, MemoryKill(2001, 2000)),
        (child(rss=1500, last_beat=NOW - 31), True, Kill(31.0)),
        (child(rss=2001, killed_for="already"), True, None),  # killed once is enough
        (child(rss=1500, retiring=True), False, None),
    ],
)
def test_the_hard_limit_verdict(made: Child, serving: bool,
                                expected: Kill | MemoryKill | Recycle | None) -> None:
    assert verdict(made, serving, OPTIONS, NOW) == expected
