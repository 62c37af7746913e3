"""InlineWorkflowRunner: execute runs in the calling process, one frontier at a time.

No background loops: a ``ctx.sleep()`` parks the run for good (nothing wakes it), and a
run that a signal, resume or wake re-queued stalls until ``run()`` is called again.
Use ``WorkflowWorker`` for anything that sleeps, waits or runs on a schedule.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from pyrula.config.cloud import cloud_config
from pyrula.workflows.build import serving_build
from pyrula.workflows.client import WorkflowClient
from pyrula.workflows.clock import SYSTEM_CLOCK, Clock
from pyrula.workflows.definition import REGISTRY, WorkflowSpec, workflow_name
from pyrula.workflows.engine import Attempt, AttemptSettings
from pyrula.workflows.errors import WorkflowNotFound
from pyrula.workflows.events import Event
from pyrula.workflows.forks import seed_fork
from pyrula.workflows.records import ClaimedRun
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.memory import MemoryStore
from pyrula.workflows.worker.attempts import report_attempt
from pyrula.workflows.worker.pool import default_pool_size

if TYPE_CHECKING:
    from pyrula.cloud.connector import CloudConnector


class InlineWorkflowRunner:
    """Runs workflows in the calling process, for tests and scripts that do not suspend."""

    def __init__(
        self,
        store: Store | None = None,
        *,
        workflows: Sequence[Any] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        settings: AttemptSettings | None = None,
        cloud: bool = True,
    ) -> None:
        self.store: Store = store if store is not None else MemoryStore()
        self.client = WorkflowClient(self.store, clock=clock)
        self.worker_id = f"inline-{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
        self._only = None if workflows is None else {workflow_name(w) for w in workflows}
        self._clock = clock
        self._settings = settings or AttemptSettings()
        self._cloud = cloud
        self._started = False
        self._executor: ThreadPoolExecutor | None = None
        self._build: str | None = None
        self._connector: CloudConnector | None = None

    @property
    def build(self) -> str:
        """The build recorded in the run:started of the runs this runner claims (as a
        worker's: PYRULA_BUILD_ID, else the fingerprint of its workflows and steps), read
        when first asked."""
        if self._build is None:
            served = [spec for name, spec in REGISTRY.workflows().items()
                      if self._only is None or name in self._only]
            self._build = serving_build(served, REGISTRY)
        return self._build

    async def start(self) -> None:
        """Check the configuration and, with a Cloud key set, connect now instead of on
        the first ``run()``/``run_next()`` (for a host that must report from its start)."""
        if self._started:
            return
        config = cloud_config(self._cloud)
        self._started = True
        if config is not None:
            from pyrula.cloud.connector import CloudConnector

            self._connector = CloudConnector(config, self.client, self._cloud_source,
                                             self._served, {"worker_id": self.worker_id})
            await self._connector.start()

    async def aclose(self) -> None:
        """Send what the Cloud connector holds (within PYRULA_CLOUD_DRAIN_DEADLINE_S) and
        release the step threads."""
        connector, self._connector = self._connector, None
        if connector is not None:
            await connector.drain()
        self._started = False
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _served(self) -> list[str]:
        return sorted(REGISTRY.workflows() if self._only is None else self._only)

    def _cloud_source(self) -> dict[str, Any]:
        return {"kind": "inline", "worker_id": self.worker_id, "fleet": None,
                "host": socket.gethostname(), "pid": os.getpid(), "state": "ready",
                "workflows": self._served(), "build": self.build}

    def _spec(self, name: str) -> WorkflowSpec:
        if self._only is not None and name not in self._only:
            raise WorkflowNotFound(f"workflow {name!r} is not served by this runner")
        return REGISTRY.workflow(name)

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=default_pool_size(),
                thread_name_prefix="pyrula-inline-step",
            )
        return self._executor

    async def run(self, name: str, run_id: str) -> list[Event]:
        """Advance the run to its next frontier (end, sleep, wait) and return its journal.

        A run that is not queued (already ended, sleeping, waiting) is left as it is.
        """
        await self.start()
        spec = self._spec(name)
        info = await self.client.get(run_id)
        if info.name != name:
            raise ValueError(f"run {run_id} is a run of {info.name!r}, not {name!r}")
        claimed = await self.store.claim_run(
            run_id, self.worker_id, now=self._clock.now(), lock_ttl=self._settings.lock_ttl,
            build=self.build,
        )
        if claimed is None:
            return await self.store.read_events(run_id)
        return await self._execute(spec, claimed)

    async def run_next(self) -> list[Event] | None:
        """Run the next queued run of a served workflow to its frontier, or return None.
        A suspect is run once no ordinary run is queued (one run at a time: it runs alone)."""
        await self.start()
        names = self._served()
        now, ttl = self._clock.now(), self._settings.lock_ttl
        claimed = await self.store.claim(self.worker_id, names, limit=1, now=now,
                                         lock_ttl=ttl, build=self.build)
        run = claimed[0] if claimed else None
        if run is None and claimed.suspects:
            run = await self.store.claim_suspect(self.worker_id, claimed.suspects, now=now,
                                                 lock_ttl=ttl, build=self.build)
        if run is None:
            return None
        return await self._execute(self._spec(run.name), run)

    async def _execute(self, spec: WorkflowSpec, claimed: ClaimedRun) -> list[Event]:
        journal = claimed.journal
        if claimed.base_seq:
            journal = await self.store.read_events(claimed.run_id)
        journal = await seed_fork(self.store, claimed, list(journal), now=self._clock.now(),
                                  lock_ttl=self._settings.lock_ttl)
        attempt = Attempt(
            spec, claimed, journal, self.store,
            executor=self._pool(), clock=self._clock, settings=self._settings,
        )
        report = self._connector.report if self._connector is not None else None
        report_attempt(report, claimed)
        outcome = await attempt.run()
        report_attempt(report, claimed, outcome.journal)
        return [dict(e) for e in outcome.journal]
