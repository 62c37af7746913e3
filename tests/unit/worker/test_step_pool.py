"""The sync-step pool runs every call in flight on its own thread, up to its size."""

from __future__ import annotations

import logging
import threading

import pytest

from pyrula.workflows.worker.pool import SATURATION_LOG_INTERVAL_S, StepPool
from tests.conftest import wait_until


def test_calls_submitted_together_each_get_a_thread_even_after_one_went_idle() -> None:
    pool = StepPool(max_workers=4)
    try:
        # A first call leaves one idle thread behind.
        assert pool.submit(lambda: 1).result(timeout=5) == 1
        # Two calls that wait for each other: with one thread for both, this deadlocks.
        first_started = threading.Event()
        second_started = threading.Event()

        def first() -> str:
            first_started.set()
            assert second_started.wait(timeout=5), "the second call never started"
            return "first"

        def second() -> str:
            second_started.set()
            assert first_started.wait(timeout=5), "the first call never started"
            return "second"

        a = pool.submit(first)
        b = pool.submit(second)
        assert (a.result(timeout=10), b.result(timeout=10)) == ("first", "second")
    finally:
        pool.shutdown(wait=False)


def test_the_pool_never_runs_more_threads_than_its_size() -> None:
    pool = StepPool(max_workers=2)
    release = threading.Event()
    try:
        futures = [pool.submit(release.wait, 5) for _ in range(5)]
        assert len(pool._threads) == 2
        release.set()
        assert all(f.result(timeout=10) for f in futures)
    finally:
        pool.shutdown(wait=False)


def test_saturation_is_counted_each_time_and_said_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pyrula")
    now = [1000.0]
    counted: list[int] = []
    pool = StepPool(max_workers=2, on_saturated=lambda: counted.append(1),
                    clock=lambda: now[0])

    def saturate() -> None:
        """Every thread busy and one call more, then all of them done."""
        release = threading.Event()
        futures = [pool.submit(release.wait, 5) for _ in range(3)]
        release.set()
        for future in futures:
            future.result(timeout=5)
        wait_until(lambda: pool.busy == 0, what="the pool idle")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if getattr(r, "event", None) == "user_code_threads_saturated"]

    try:
        saturate()
        assert len(warnings()) == 1 and "(1 time since the last report)" in warnings()[0]
        for _ in range(4):  # a backlog keeps the pool full: counted, not said again
            now[0] += 10
            saturate()
        assert len(warnings()) == 1
        now[0] += SATURATION_LOG_INTERVAL_S
        saturate()
        assert len(warnings()) == 2 and "(5 times since the last report)" in warnings()[1]
        assert pool.saturations == len(counted) == 6
    finally:
        pool.shutdown(wait=False)
