"""The sync-step pool runs every call in flight on its own thread, up to its size."""

from __future__ import annotations

import threading

from pyrula.workflows.worker.pool import StepPool


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
