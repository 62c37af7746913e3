"""A small workflow app: the one the README and ``make run`` use.

``process_order`` charges a card (a step that fails once, then succeeds on retry),
reserves stock and ships, all journaled; big orders wait for an ``approved`` signal.
``nightly_digest`` shows a durable sleep and ``continue_as_new``.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

from pyrula.workflows import WorkflowContext, step, workflow

_attempts: dict[str, int] = {}


@step(retries=3, retry_backoff=0.2)
async def charge_card(order_id: str, amount: float) -> dict[str, Any]:
    """Fails on the first attempt for one order in three, as a flaky payment API would."""
    _attempts[order_id] = _attempts.get(order_id, 0) + 1
    if zlib.crc32(order_id.encode()) % 3 == 0 and _attempts[order_id] == 1:
        raise ConnectionError(f"payment gateway timed out for {order_id}")
    await asyncio.sleep(0.01)
    return {"order_id": order_id, "charged": amount, "receipt": f"rcpt-{order_id}"}


@step
def reserve_stock(order_id: str, items: list[str]) -> list[str]:
    return [f"{item}@shelf-{zlib.crc32(item.encode()) % 40}" for item in items]


@step
def ship(order_id: str, locations: list[str]) -> str:
    return f"parcel-{order_id}-{len(locations)}"


@workflow(name="process_order")
async def process_order(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, Any]:
    order_id = params["order_id"]
    amount = float(params.get("amount", 10.0))
    if amount >= 1000:
        approved = await ctx.wait_for_signal("approved", timeout=3600)
        if not approved:
            return {"order_id": order_id, "status": "rejected"}
    receipt, locations = await asyncio.gather(
        charge_card(order_id, amount), reserve_stock(order_id, params.get("items", []))
    )
    parcel = await ship(order_id, locations)
    return {"order_id": order_id, "status": "shipped", "receipt": receipt["receipt"],
            "parcel": parcel}


@step
def collect_digest(day: int) -> dict[str, int]:
    return {"day": day, "orders": 40 + day}


@workflow(name="nightly_digest")
async def nightly_digest(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, Any]:
    day = int(params.get("day", 1))
    digest: dict[str, Any] = await collect_digest(day)
    if day < int(params.get("days", 1)):
        await ctx.sleep(float(params.get("interval", 1.0)))
        ctx.continue_as_new({**params, "day": day + 1})
    return digest
