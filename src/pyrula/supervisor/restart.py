"""Restart policy, pure: when to respawn a slot, and when a crash loop stops the fleet."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Respawn:
    delay: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    reason: str


class RestartPolicy:
    """A child that exits before becoming ready is a boot failure; ``max_boot_failures``
    of them in a row stop the fleet. A child that dies after becoming ready is replaced
    however often, with a per-slot backoff that doubles for children that die young
    (0, 0.1, 0.2 ... 5 s) and resets once a child lived ``stable_after`` seconds."""

    def __init__(self, max_boot_failures: int, stable_after: float = 10.0,
                 first: float = 0.1, cap: float = 5.0) -> None:
        self.max_boot_failures = max_boot_failures
        self.stable_after = stable_after
        self.first = first
        self.cap = cap
        self.boot_failures = 0
        self._young_deaths: dict[int, int] = {}

    def ready(self, slot: int) -> None:
        """A child of ``slot`` became ready: the crash-loop count starts again."""
        self.boot_failures = 0

    def exited(
        self, slot: int, was_ready: bool, lived: float, error: str | None
    ) -> Respawn | GiveUp:
        if not was_ready:
            self.boot_failures += 1
            if self.boot_failures >= self.max_boot_failures:
                return GiveUp(
                    f"{self.boot_failures} children in a row exited before becoming ready"
                    + (f"; the last one said: {error}" if error else "")
                )
            return Respawn(min(self.cap, self.first * 2 ** (self.boot_failures - 1)))
        if lived >= self.stable_after:
            self._young_deaths[slot] = 0
            return Respawn(0.0)
        deaths = self._young_deaths.get(slot, 0)
        self._young_deaths[slot] = deaths + 1
        return Respawn(0.0 if deaths == 0 else min(self.cap, self.first * 2 ** (deaths - 1)))
