"""The sync-step pool runs every call in flight on its own thread, up to its size."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

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


# --- run_async: outcomes handed back to the loop ---------------------------------------------


async def test_outcomes_that_come_while_the_loop_is_busy_go_back_on_one_wake_up() -> None:
    loop = asyncio.get_running_loop()
    pool = StepPool(max_workers=20)
    left: list[int] = []
    wake_ups = 0
    hand_back = pool._hand_back

    def counted() -> None:
        nonlocal wake_ups
        wake_ups += 1
        hand_back()

    pool._hand_back = counted  # type: ignore[method-assign]
    release = threading.Event()
    try:
        futures = [pool.run_async(loop, lambda i=i: release.wait(5) and i * 2,
                                  lambda i=i: left.append(i)) for i in range(20)]
        wait_until(lambda: pool.busy == 20, what="every call running")
        release.set()
        # The loop is busy (this coroutine does not yield) while every call returns.
        wait_until(lambda: pool.busy == 0, what="every call returned")
        assert await asyncio.gather(*futures) == [i * 2 for i in range(20)]
        assert wake_ups == 1
        assert sorted(left) == list(range(20))  # each call's section ended, once
    finally:
        pool.shutdown()


async def test_a_failure_is_raised_in_the_awaiting_step() -> None:
    loop = asyncio.get_running_loop()
    pool = StepPool(max_workers=2)
    left: list[str] = []

    def fails() -> None:
        raise ValueError("from the step")

    def stops() -> None:
        raise StopIteration

    try:
        with pytest.raises(ValueError, match="from the step"):
            await pool.run_async(loop, fails, lambda: left.append("fails"))
        with pytest.raises(RuntimeError, match="StopIteration"):  # said as 3.13 says it too
            await pool.run_async(loop, stops, lambda: left.append("stops"))
        assert left == ["fails", "stops"]
    finally:
        pool.shutdown()


async def test_a_call_given_up_before_it_began_never_runs_and_leaves_at_once() -> None:
    loop = asyncio.get_running_loop()
    pool = StepPool(max_workers=1)
    release = threading.Event()
    ran: list[str] = []
    left: list[str] = []
    try:
        busy = pool.run_async(loop, lambda: release.wait(5), lambda: left.append("busy"))
        queued = pool.run_async(loop, lambda: ran.append("queued"), lambda: left.append("q"))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(queued, 0.05)  # the only thread is taken
        assert left == ["q"]  # its section ended when it was given up
        release.set()
        assert await busy is True
        await asyncio.wait_for(_until(lambda: left == ["q", "busy"]), 5)
        assert ran == []  # given up before it began: never run
    finally:
        pool.shutdown()


async def test_a_call_given_up_while_it_runs_leaves_when_its_thread_returns() -> None:
    loop = asyncio.get_running_loop()
    pool = StepPool(max_workers=1)
    release = threading.Event()
    left: list[str] = []
    try:
        running = pool.run_async(loop, lambda: release.wait(5), lambda: left.append("run"))
        wait_until(lambda: pool.busy == 1, what="the call running")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(running, 0.05)
        assert left == []  # a timed-out step's thread runs on, in its section
        release.set()
        await asyncio.wait_for(_until(lambda: left == ["run"]), 5)
    finally:
        pool.shutdown()


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)
