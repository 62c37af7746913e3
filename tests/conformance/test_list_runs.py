"""Store contract: list_runs order, filters and keyset pagination."""

from __future__ import annotations

from typing import Any

from pyrula.workflows.records import RunInfo, RunStatus
from pyrula.workflows.stores.base import Store
from tests.conformance.support import T0, complete, running, sleep, submit


async def _pages(store: Store, size: int, **filters: Any) -> list[list[RunInfo]]:
    pages: list[list[RunInfo]] = []
    before: tuple[float, str] | None = None
    while True:
        page = await store.list_runs(limit=size, before=before, **filters)
        assert len(page) <= size
        if not page:
            return pages
        pages.append(page)
        before = (page[-1].created_at, page[-1].run_id)
        assert len(pages) < 100, "pagination does not end"


async def test_list_runs_is_newest_first(store: Store) -> None:
    ids = [await submit(store, now=T0 + i) for i in range(5)]

    listed = await store.list_runs()

    assert [r.run_id for r in listed] == ids[::-1]
    assert [r.created_at for r in listed] == [T0 + i for i in range(4, -1, -1)]


async def test_list_runs_honours_limit(store: Store) -> None:
    ids = [await submit(store, now=T0 + i) for i in range(5)]

    assert [r.run_id for r in await store.list_runs(limit=2)] == ids[:2:-1]
    assert len(await store.list_runs(limit=100)) == 5


async def test_list_runs_filters_by_name_status_and_owner(store: Store) -> None:
    a_queued = await submit(store, "wf.a", owner="t1", now=T0)
    a_done = await running(store, "wf.a", owner="t2", now=T0 + 1)
    await complete(store, a_done.run_id, a_done.token, now=T0 + 2)
    b_sleeping = await running(store, "wf.b", owner="t1", now=T0 + 3)
    await sleep(store, b_sleeping.run_id, b_sleeping.token, T0 + 600, now=T0 + 4)
    b_running = await running(store, "wf.b", now=T0 + 5)

    async def ids(**filters: Any) -> list[str]:
        return [r.run_id for r in await store.list_runs(**filters)]

    assert await ids(name="wf.a") == [a_done.run_id, a_queued]
    assert await ids(name="wf.b") == [b_running.run_id, b_sleeping.run_id]
    assert await ids(status=RunStatus.QUEUED) == [a_queued]
    assert await ids(status=RunStatus.COMPLETED) == [a_done.run_id]
    assert await ids(status=RunStatus.SLEEPING) == [b_sleeping.run_id]
    assert await ids(status=RunStatus.RUNNING) == [b_running.run_id]
    assert await ids(status=RunStatus.FAILED) == []
    assert await ids(owner="t1") == [b_sleeping.run_id, a_queued]
    assert await ids(owner="t2") == [a_done.run_id]
    assert await ids(owner="nobody") == []
    assert await ids(name="wf.a", owner="t1") == [a_queued]
    assert await ids(name="wf.b", status=RunStatus.RUNNING) == [b_running.run_id]
    assert await ids(name="wf.a", status=RunStatus.RUNNING) == []
    assert await ids(name="wf.none") == []


async def test_pages_have_no_duplicates_and_no_gaps(store: Store) -> None:
    # Several runs per timestamp, so the run id must break ties in the keyset.
    for i in range(23):
        await submit(store, now=T0 + i // 4)
    everything = [r.run_id for r in await store.list_runs(limit=1000)]
    assert len(everything) == 23

    for size in (1, 3, 4, 7, 23, 50):
        pages = await _pages(store, size)
        paged = [r.run_id for page in pages for r in page]
        assert paged == everything, f"page size {size}"


async def test_filtered_pages_have_no_duplicates_and_no_gaps(store: Store) -> None:
    for i in range(30):
        await submit(store, "wf.a" if i % 3 else "wf.b", owner=f"t{i % 2}", now=T0 + i // 5)
    wanted = [r.run_id for r in await store.list_runs(name="wf.a", owner="t1", limit=1000)]
    assert len(wanted) == 10

    pages = await _pages(store, 3, name="wf.a", owner="t1")

    assert [r.run_id for page in pages for r in page] == wanted
    assert all(r.name == "wf.a" and r.owner == "t1" for page in pages for r in page)
