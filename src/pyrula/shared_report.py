"""A fleet child's latest report of the runs it holds, in memory its supervisor shares.

A child tells its supervisor which runs it holds (and which may be inside their own code)
right after every claim and before a run enters its code unreported, so that the
supervisor can requeue them, and charge a crash to the right ones, should the child die.
Sent over the pipe, each such report woke the supervisor: a process wake-up on the path of
every run, for a message the supervisor needs only once the child has died. Here the child
writes it into a small shared mapping instead, and the supervisor reads it after the death.
The periodic heartbeat still goes over the pipe; both carry a sequence number, and the
supervisor takes the newer of the two.

Two slots, written in turn: a child killed in the middle of a write leaves the slot it
wrote before intact. Each slot's head (its sequence number, length and checksum) is
written after its data, and a slot whose checksum (of its number and its data) does not
hold is not believed.

A leaf module: both the child and the supervisor import it; it imports nothing of pyrula.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import zlib
from typing import Any

import orjson

#: Bytes of the mapping: two slots of half each. A report that does not fit (some tens of
#: thousands of held runs) goes over the pipe as before.
SIZE = 1 << 20
_HEAD = struct.Struct("<QII")  # the slot's sequence number, its length, its CRC-32
_SLOT = SIZE // 2
_ROOM = _SLOT - _HEAD.size


def _new_fd() -> int:
    """A file only in memory, unnamed (a temporary file where the host has no memfd)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("pyrula-report", os.MFD_CLOEXEC)
    else:  # pragma: no cover - not Linux
        import tempfile

        with tempfile.TemporaryFile() as file:
            fd = os.dup(file.fileno())
    os.ftruncate(fd, SIZE)
    return fd


def _checksum(seq: int, data: bytes) -> int:
    """Of the number and the report: a head half written (a new number over an old report)
    does not check out."""
    return zlib.crc32(data, zlib.crc32(seq.to_bytes(8, "little")))


def _rebuild(dup: Any) -> SharedReport:
    return SharedReport(dup.detach())


class SharedReport:
    """One child's report board. The supervisor makes it (``SharedReport()``) and hands it
    to the child as a process argument; ``write`` is the child's, ``read`` the
    supervisor's."""

    def __init__(self, fd: int | None = None) -> None:
        self._fd = _new_fd() if fd is None else fd
        self._map: mmap.mmap | None = mmap.mmap(self._fd, SIZE)

    def __reduce__(self) -> tuple[Any, ...]:
        # Passed to a child started by a fork server (or spawned) as multiprocessing passes
        # a pipe's end: the descriptor itself travels, duplicated for the child.
        from multiprocessing import reduction

        return _rebuild, (reduction.DupFd(self._fd),)

    def write(self, seq: int, report: dict[str, Any]) -> bool:
        """Record ``report`` as the child's report number ``seq`` (numbers only grow, from
        1); False if it does not fit (send it another way) or the board is closed."""
        data = orjson.dumps(report)
        if self._map is None or len(data) > _ROOM:
            return False
        at = (seq % 2) * _SLOT
        self._map[at + _HEAD.size:at + _HEAD.size + len(data)] = data
        _HEAD.pack_into(self._map, at, seq, len(data), _checksum(seq, data))
        return True

    def read(self) -> tuple[int, dict[str, Any]] | None:
        """(its sequence number, the report) of the last report written whole; None if
        none was."""
        if self._map is None:
            return None
        found: tuple[int, dict[str, Any]] | None = None
        for at in (0, _SLOT):
            seq, length, crc = _HEAD.unpack_from(self._map, at)
            if seq == 0 or length > _ROOM or (found is not None and seq <= found[0]):
                continue
            data = self._map[at + _HEAD.size:at + _HEAD.size + length]
            if _checksum(seq, data) != crc:
                continue  # torn: the child died while writing it
            try:
                report = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(report, dict):
                found = (seq, report)
        return found

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
            with contextlib.suppress(OSError):
                os.close(self._fd)
