"""The trigger loop: every ``trigger_interval``, start the runs of the due batches of
events of each served workflow declared with a ``BatchTrigger`` (not while the worker
drains or is bound to another project).

The store takes each batch and queues its run in one atomic step
(``Triggers.take_batches``), so any number of workers may pass over the same events at
once, or die between two passes: each event still lands in exactly one run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pyrula.metrics import Metrics
from pyrula.workflows.definition import WorkflowSpec
from pyrula.workflows.stores.capabilities import Triggers
from pyrula.workflows.triggers import BatchTrigger
from pyrula.workflows.worker.runtime import Runtime

logger = logging.getLogger(__name__)

#: Runs one pass starts per workflow; a pass that started this many goes again at once.
BATCHES = 100

STARTED = "pyrula.workflows.triggers.started"


class TriggerLoop:
    """Starts the runs of due batches of ``triggered`` (workflow name -> its trigger)."""

    name = "trigger"

    def __init__(
        self,
        store: Triggers,
        triggered: Mapping[str, BatchTrigger],
        metrics: Metrics,
        log: dict[str, str],
        *,
        interval: float,
        runtime: Runtime | None = None,
    ) -> None:
        self.interval = interval
        self._store = store
        self._triggered = dict(triggered)
        self._metrics = metrics
        self._log = log
        self._rt = runtime

    async def tick(self, now: float) -> float | None:
        if self._rt is not None and self._rt.paused:
            return None
        again = False
        for name, trigger in self._triggered.items():
            started = await self._store.take_batches(
                name, trigger.topic, max_size=trigger.max_size, max_wait=trigger.max_wait,
                now=now, limit=BATCHES,
            )
            for handle in started:
                self._metrics.inc(STARTED, workflow=name)
                logger.info(
                    "trigger_fired: a batch of topic %r started run %s of %s",
                    trigger.topic, handle.run_id, name,
                    extra={"event": "trigger_fired", "run_id": handle.run_id,
                           "workflow": name, "topic": trigger.topic, **self._log},
                )
            again = again or len(started) >= BATCHES
        return 0.0 if again else None


def trigger_loops(
    specs: Mapping[str, WorkflowSpec],
    store: Triggers | None,
    metrics: Metrics,
    log: dict[str, str],
    *,
    interval: float,
    runtime: Runtime,
    store_shown: str,
) -> list[TriggerLoop]:
    """The trigger loop of a worker serving ``specs``: none where no workflow has a
    trigger, nor where the store keeps no events (logged once: no batch starts here)."""
    triggered = {name: spec.trigger for name, spec in sorted(specs.items())
                 if spec.trigger is not None}
    if not triggered:
        return []
    if store is None:
        logger.warning(
            "trigger_loop_unsupported: %s keeps no events; the triggers of %s start no "
            "runs here", store_shown, ", ".join(triggered),
            extra={"event": "trigger_loop_unsupported", **log},
        )
        return []
    return [TriggerLoop(store, triggered, metrics, log, interval=interval, runtime=runtime)]
