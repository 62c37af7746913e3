"""The per-worker journal cache: journals of runs this worker parked, bounded in events."""

from __future__ import annotations

from collections import OrderedDict

from pyrula.workflows.events import Event


class JournalCache:
    """LRU of run id -> journal, holding at most ``max_events`` events in all (0: off)."""

    def __init__(self, max_events: int) -> None:
        self.max_events = max_events
        self._journals: OrderedDict[str, list[Event]] = OrderedDict()
        self._events = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._journals)

    @property
    def events(self) -> int:
        return self._events

    def put(self, run_id: str, journal: list[Event]) -> None:
        self.drop(run_id)
        if self.max_events <= 0 or len(journal) > self.max_events:
            return
        self._journals[run_id] = journal
        self._events += len(journal)
        while self._events > self.max_events:
            _, evicted = self._journals.popitem(last=False)
            self._events -= len(evicted)

    def take(self, run_id: str, base_seq: int) -> list[Event] | None:
        """The cached journal if it ends exactly at ``base_seq``; removes it either way."""
        journal = self._journals.pop(run_id, None)
        if journal is None:
            self.misses += 1
            return None
        self._events -= len(journal)
        if not journal or int(journal[-1]["seq"]) != base_seq:
            self.misses += 1
            return None
        self.hits += 1
        return journal

    def drop(self, run_id: str) -> None:
        journal = self._journals.pop(run_id, None)
        if journal is not None:
            self._events -= len(journal)
