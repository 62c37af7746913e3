"""The connector: reports a worker's runs to a collector and takes the runs it submits.

``report()`` only appends to a queue (never awaits, never fails), so a run is never slowed
by reporting. One task, owned by the connector and ended by ``drain()``, sends the queue
in batches every ``FLUSH_INTERVAL_S`` (sooner once a batch is full), with the worker's
state as a heartbeat, and asks for submitted runs every ``SUBMIT_POLL_S``.

The delivery promise: a send that fails leaves its events queued (retried with backoff)
and writes the critical ones (``wire.CRITICAL_EVENTS``) to the spool (``outbox``);
``drain()`` gets ``drain_deadline_s`` to send the rest, then spools what is critical and
still undelivered. The next connector to start on the host sends it. Only live-stream
detail (steps, sleeps, starts) can be lost: at a drain that runs out, when the spool is
``off``, or when more than ``MAX_QUEUED`` events wait.

What a process killed with SIGKILL still held is found again in the store: every
``reconcile_s`` the task also runs a pass of ``reconcile.Reconciler``, which sends the
critical events of the runs that ended since a cursor kept in the store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from pyrula.cloud.outbox import Outbox
from pyrula.cloud.reconcile import Reconciler
from pyrula.cloud.wire import (
    ACK_SUBMITS_PATH,
    INGEST_PATH,
    TAKE_SUBMITS_PATH,
    SendFailed,
    is_critical,
    post,
    shaped,
)
from pyrula.config.cloud import CloudConfig
from pyrula.workflows.client import WorkflowClient
from pyrula.workflows.events import Event
from pyrula.workflows.stores.capabilities import capabilities_of

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.5
HEARTBEAT_S = 5.0
SUBMIT_POLL_S = 2.0
BATCH = 500
REQUEST_TIMEOUT_S = 5.0
MAX_BACKOFF_S = 5.0
#: Beyond this many queued events, live-stream detail is dropped (critical events never).
MAX_QUEUED = 100_000

#: Live worker state sent with every batch (``kind``, ``worker_id``, ``fleet``...).
Source = Callable[[], Mapping[str, Any]]


class CloudConnector:
    """One worker's (or runner's) link to the collector at ``config.url``."""

    def __init__(self, config: CloudConfig, client: WorkflowClient, source: Source,
                 workflows: Callable[[], list[str]], log: Mapping[str, str]) -> None:
        self.config = config
        self._client = client
        self._source = source
        self._workflows = workflows
        self._log = dict(log)
        self._queue: deque[dict[str, Any]] = deque()
        #: Ids of queued events already in the spool file.
        self._spooled: set[str] = set()
        self._outbox: Outbox | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._sent_at = 0.0
        self._polled_at = 0.0
        self._reconciled_at = 0.0
        self._reconciler = self._make_reconciler()
        #: Whether the spool file may hold events (it is deleted once all are delivered).
        self._spool_dirty = False
        self.dropped = 0
        self.delivered = 0

    def _make_reconciler(self) -> Reconciler | None:
        projections = capabilities_of(self._client.store).projections
        if projections is None:  # a store without an ended-runs index: nothing to read
            return None
        return Reconciler(self._client.store, projections, self.config.environment,
                          self.config.reconcile_s)

    # --- the worker's side ----------------------------------------------------------

    def report(self, run_id: str, workflow: str, events: list[Event]) -> None:
        """Queue ``events`` of ``run_id`` for the collector (from the event loop)."""
        for event in events:
            report = shaped(run_id, workflow, event)
            if report is None:
                continue
            if len(self._queue) >= MAX_QUEUED and not is_critical(report):
                self.dropped += 1
                continue
            self._queue.append(report)
        if len(self._queue) >= BATCH and self._wake is not None:
            self._wake.set()

    async def start(self) -> None:
        """Open the spool, take what gone processes left in it, start sending."""
        if self._task is not None:
            return
        self._open_outbox()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name="pyrula-cloud-connector")
        logger.info("cloud_connected: reporting to %s as environment %s", self.config.url,
                    self.config.environment, extra={"event": "cloud_connected", **self._log})

    def _open_outbox(self) -> None:
        if self.config.outbox is None:
            return
        try:
            self._outbox = Outbox(self.config.outbox)
            leftovers = self._outbox.take_leftovers()
        except OSError as exc:
            logger.warning("cloud_outbox_unavailable: %s; undelivered events are lost at "
                           "shutdown", exc, extra={"event": "cloud_outbox_unavailable",
                                                   **self._log})
            self._outbox = None
            return
        for report in leftovers:
            self._queue.append(report)
            self._spooled.add(report["id"])
        self._spool_dirty = bool(leftovers)
        if leftovers:
            logger.info("cloud_outbox_resend: %d spooled events to send", len(leftovers),
                        extra={"event": "cloud_outbox_resend", **self._log})

    async def drain(self) -> None:
        """Stop polling; send what is queued within ``drain_deadline_s``; spool the
        critical rest. Returns within the deadline (plus a spool write)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        end = time.monotonic() + self.config.drain_deadline_s
        backoff = 0.05
        while self._queue and (left := end - time.monotonic()) > 0:
            if not await self._send_batch(min(left, REQUEST_TIMEOUT_S)):
                await asyncio.sleep(min(backoff, max(0.0, end - time.monotonic())))
                backoff = min(backoff * 2, 1.0)
        self._spool_critical()
        critical = sum(1 for r in self._queue if is_critical(r))
        lost = len(self._queue) - critical + self.dropped
        if self._outbox is None:
            lost, critical = lost + critical, 0
        logger.log(logging.WARNING if self._queue else logging.INFO,
                   "cloud_drained: %d events delivered, %d critical events spooled, %d live "
                   "events lost", self.delivered, critical, lost,
                   extra={"event": "cloud_drained", **self._log})
        self._queue.clear()

    # --- the sending task -----------------------------------------------------------

    async def _loop(self) -> None:
        assert self._wake is not None
        backoff = FLUSH_INTERVAL_S
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=backoff)
            except TimeoutError:
                pass
            self._wake.clear()
            ok = await self._flush()
            if ok and time.monotonic() - self._polled_at >= SUBMIT_POLL_S:
                self._polled_at = time.monotonic()
                ok = await self._take_submits()
            if self._reconciler is not None and (
                    time.monotonic() - self._reconciled_at >= self._reconciler.every_s):
                # Also while the collector is down: the first pass sets the cursors.
                self._reconciled_at = time.monotonic()
                ok = await self._reconcile(self._reconciler) and ok
            backoff = FLUSH_INTERVAL_S if ok else min(backoff * 2, MAX_BACKOFF_S)

    async def _flush(self) -> bool:
        """Send everything queued (or a heartbeat when due); False once a send fails."""
        if not self._queue and time.monotonic() - self._sent_at < HEARTBEAT_S:
            return True
        while True:
            if not await self._send_batch(REQUEST_TIMEOUT_S):
                return False
            if not self._queue:
                return True

    async def _send_batch(self, timeout: float) -> bool:
        batch = [self._queue[i] for i in range(min(BATCH, len(self._queue)))]
        body = {"source": dict(self._source()), "events": batch}
        try:
            await post(self.config.url, self.config.key, INGEST_PATH, body, timeout)
        except SendFailed as exc:
            logger.debug("cloud send failed: %s", exc, extra=self._log)
            self._spool_critical()
            return False
        for _ in batch:
            done = self._queue.popleft()
            self._spooled.discard(done["id"])
        self.delivered += len(batch)
        self._sent_at = time.monotonic()
        if self._spool_dirty and not self._spooled and self._outbox is not None:
            self._outbox.clear()
            self._spool_dirty = False
        return True

    def _spool_critical(self) -> None:
        """Write the critical queued events not yet in the spool to it."""
        if self._outbox is None:
            return
        fresh = [r for r in self._queue if is_critical(r) and r["id"] not in self._spooled]
        if not fresh:
            return
        try:
            self._outbox.append(fresh)
        except OSError as exc:
            logger.warning("cloud_outbox_write_failed: %s", exc, extra=self._log)
            return
        self._spooled.update(r["id"] for r in fresh)
        self._spool_dirty = True

    async def _reconcile(self, reconciler: Reconciler) -> bool:
        """A pass over each served workflow; False once the collector refused a send."""
        try:
            for workflow in self._workflows():
                going_on = False
                while True:
                    done = await reconciler.reconcile(workflow, self._deliver,
                                                      now=time.time(), going_on=going_on)
                    if done.outcome == "undelivered":
                        return False
                    if done.runs:
                        logger.info("cloud_reconciled: %d ended run%s of %s sent from the "
                                    "store", done.runs, "" if done.runs == 1 else "s", workflow,
                                    extra={"event": "cloud_reconciled", **self._log})
                    if not done.more:
                        break
                    going_on = True
        except Exception as exc:  # the store is down: the next pass tries again
            logger.debug("cloud reconcile failed: %s", exc, extra=self._log)
        return True

    async def _deliver(self, reports: list[dict[str, Any]]) -> bool:
        """Send ``reports`` (beside the queue) in batches; True once all were taken."""
        for start in range(0, len(reports), BATCH):
            body = {"source": dict(self._source()), "events": reports[start:start + BATCH]}
            try:
                await post(self.config.url, self.config.key, INGEST_PATH, body,
                           REQUEST_TIMEOUT_S)
            except SendFailed as exc:
                logger.debug("cloud send failed: %s", exc, extra=self._log)
                return False
        return True

    async def _take_submits(self) -> bool:
        """Submit into this store the runs the collector queued for this environment."""
        source = self._source()
        body = {"worker_id": source.get("worker_id"), "workflows": self._workflows()}
        try:
            answer = await post(self.config.url, self.config.key, TAKE_SUBMITS_PATH, body,
                                REQUEST_TIMEOUT_S)
            acks = []
            for submit in answer.get("submits", []):
                handle = await self._client.submit(
                    submit["workflow"], submit.get("params") or {},
                    idempotency_key=f"cloud:{submit['submit_id']}",
                )
                acks.append({"submit_id": submit["submit_id"], "run_id": handle.run_id})
            if acks:
                await post(self.config.url, self.config.key, ACK_SUBMITS_PATH,
                           {"acks": acks}, REQUEST_TIMEOUT_S)
        except SendFailed as exc:
            logger.debug("cloud submit poll failed: %s", exc, extra=self._log)
            return False
        except Exception:  # a submit the store refuses: offered again after it lapses
            logger.warning("cloud submit failed", exc_info=True, extra=self._log)
        return True
