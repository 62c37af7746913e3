"""``python -m pyrula.examples``: run the example app on the embedded SQLite store."""

from __future__ import annotations

import asyncio
import os
import sys

import pyrula.examples  # noqa: F401  (registers the example workflows)
from pyrula.workflows import InlineWorkflowRunner, SQLiteStore


async def main(path: str) -> None:
    store = SQLiteStore(path)
    runner = InlineWorkflowRunner(store=store)
    handles = [
        await runner.client.submit(
            "process_order",
            {"order_id": f"o-{i}", "amount": 25.0 * i, "items": ["tea", "cup"]},
            idempotency_key=f"demo-o-{i}",
        )
        for i in range(1, 6)
    ]
    print(f"submitted {len(handles)} runs to {path}")
    while (events := await runner.run_next()) is not None:
        last = events[-1]
        print(f"  {events[0].get('name'):>14} -> {last['type']:<14} {last.get('result', '')}")
    for handle in handles:
        info = await runner.client.get(handle.run_id)
        print(f"{handle.run_id}  {info.status.value:<9} {info.result}")
    await runner.aclose()
    store.close()


if __name__ == "__main__":
    default = os.environ.get("PYRULA_DB", "pyrula.db")
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else default))
