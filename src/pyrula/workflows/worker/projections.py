"""The projection loop: every ``projection_interval``, fold the runs of each projection's
workflows that ended since its checkpoint (and at least ``projection_grace`` ago) into its
state, a batch at a time (not while the worker drains or is bound to another project).

Each pass reads the head (version, checkpoint, fingerprint), the runs after the checkpoint
and the states of the keys they touch, folds (pure), and writes the new states and the new
checkpoint with a compare-and-set on the version, in one atomic store call
(``Projections.save_projection``). A pass that lost the race to another worker, or a worker
that died before its write, wrote nothing: the batch is folded again from the stored state,
so every run is in the state exactly once. See docs/projections.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from pyrula.metrics import Metrics
from pyrula.workflows.projections import FOLDED, ProjectionSpec, fold_runs, lineage
from pyrula.workflows.stores.capabilities import ProjectionHead, Projections
from pyrula.workflows.worker.runtime import Runtime

logger = logging.getLogger(__name__)

#: The most runs one pass folds into one projection; a full batch goes again at once.
BATCH = 500

FOLDED_RUNS = "pyrula.workflows.projections.folded"


class FoldFailed(Exception):
    """The fold (or the key function) of a projection raised: nothing was written."""


@dataclass(frozen=True, slots=True)
class FoldPass:
    """One pass over one projection: ``folded`` runs written (0 if it lost the race),
    ``more``: a full batch was written (go again at once), ``outcome`` what happened:
    ``saved``, ``idle`` (nothing new), ``lost`` (another writer came first),
    ``stand_down`` (newer code folds it)."""

    outcome: str
    folded: int = 0
    more: bool = False


async def fold_once(store: Projections, spec: ProjectionSpec, *, now: float, grace: float,
                    batch: int = BATCH) -> FoldPass:
    """Fold the next batch of ended runs into ``spec``'s projection (runs that ended up to
    ``now - grace``, after the checkpoint); a head folded by other code is started over
    (or left alone if that code replaced this one's: ``lineage``). Raises FoldFailed."""
    head = await store.projection_head(spec.name)
    action, new_lineage = lineage("" if head is None else head.fingerprint, spec.fingerprint)
    if action == "stand_down":
        return FoldPass("stand_down")
    fresh = head is None or action == "rebuild"
    expected = 0 if head is None else head.version
    cursor = None if fresh or head is None else head.checkpoint
    runs = await store.ended_infos(spec.on, after=cursor, until=now - grace, limit=batch)
    if not runs and not fresh:
        return FoldPass("idle")
    try:  # user code: the key function
        keys = sorted({spec.key_of(run) for run in runs if run.status in FOLDED})
    except Exception as exc:
        raise FoldFailed(f"{type(exc).__name__}: {exc}") from exc
    states = {} if fresh else await store.projection_states(spec.name, keys)
    try:  # user code: the fold
        changed = fold_runs(spec, states, runs)
    except Exception as exc:
        raise FoldFailed(f"{type(exc).__name__}: {exc}") from exc
    count = sum(1 for run in runs if run.status in FOLDED)
    checkpoint = (float(runs[-1].finished_at or 0.0), runs[-1].run_id) if runs else cursor
    folded = count + (0 if fresh or head is None else head.folded)
    written = ProjectionHead(spec.name, expected + 1, new_lineage or (head.fingerprint if head
                             else spec.fingerprint), spec.keyed, checkpoint, folded, now)
    if not await store.save_projection(written, changed, expected=expected, reset=fresh):
        return FoldPass("lost")
    return FoldPass("saved", count, len(runs) >= batch)


class ProjectionLoop:
    """Folds ended runs into ``specs`` (projection name -> its spec)."""

    name = "projection"

    def __init__(self, store: Projections, specs: Mapping[str, ProjectionSpec],
                 metrics: Metrics, log: dict[str, str], *, interval: float, grace: float,
                 runtime: Runtime | None = None) -> None:
        self.interval = interval
        self._store = store
        self._specs = dict(specs)
        self._metrics = metrics
        self._log = log
        self._grace = grace
        self._rt = runtime
        self._failing: dict[str, str] = {}

    async def tick(self, now: float) -> float | None:
        if self._rt is not None and self._rt.paused:
            return None
        again = False
        for name, spec in self._specs.items():
            try:
                done = await fold_once(self._store, spec, now=now, grace=self._grace)
            except FoldFailed as exc:
                self._fold_failed(name, str(exc))
                continue
            self._failing.pop(name, None)
            if done.folded:
                self._metrics.inc(FOLDED_RUNS, done.folded, projection=name)
                logger.debug("projection_folded: %d runs into %s", done.folded, name,
                             extra={"event": "projection_folded", "projection": name,
                                    **self._log})
            again = again or done.more
        return 0.0 if again else None

    def _fold_failed(self, name: str, why: str) -> None:
        """Logged once per distinct failure: the projection stays where it was (its
        checkpoint does not move) until its code is fixed, which rebuilds it."""
        if self._failing.get(name) == why:
            return
        self._failing[name] = why
        logger.error("projection_fold_failed: projection %s is stuck: %s", name, why,
                     extra={"event": "projection_fold_failed", "projection": name,
                            **self._log})


def projection_loops(
    specs: Mapping[str, ProjectionSpec], store: Projections | None, metrics: Metrics,
    log: dict[str, str], *, interval: float, grace: float, runtime: Runtime, store_shown: str,
) -> list[ProjectionLoop]:
    """The projection loop of a worker serving ``specs``: none without projections, nor
    where the store keeps none (logged once)."""
    if not specs:
        return []
    if store is None:
        logger.warning(
            "projection_loop_unsupported: %s keeps no projections; %s are not folded here",
            store_shown, ", ".join(sorted(specs)),
            extra={"event": "projection_loop_unsupported", **log},
        )
        return []
    return [ProjectionLoop(store, specs, metrics, log, interval=interval, grace=grace,
                           runtime=runtime)]
