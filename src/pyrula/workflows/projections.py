"""Projections: ``@projection(name, on=[workflow names], key=None)`` on ``def fold(state,
run)`` keeps a read model over the runs of those workflows that ended, each run folded
into it exactly once by whichever worker gets there first.

The definition, its fingerprint and the pure fold of a batch of runs live here (no I/O,
no store); the stores keep each projection's state, checkpoint and version and write them
with a compare-and-set (``stores.capabilities.Projections``); the worker's projection loop
reads, folds and writes (``worker.projections``). See docs/projections.md.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from pyrula.timestamps import iso_utc
from pyrula.workflows.build import DIGITS, code_text
from pyrula.workflows.definition import check_name, workflow_name
from pyrula.workflows.records import RunInfo, RunStatus

if TYPE_CHECKING:
    from pyrula.workflows.stores.capabilities import ProjectionHead

#: The longest projection name, in characters.
MAX_PROJECTION_NAME_LENGTH = 200
#: The longest key a keyed projection's key function may return, in characters.
MAX_KEY_LENGTH = 1000
#: Where an unkeyed projection keeps its one state.
WHOLE = ""
#: The statuses of the runs a projection folds: a run that ``continued`` as new is not
#: folded (its chain goes on in its successor, whose own end is folded).
FOLDED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})

#: Heads whose names begin with this control character (which no projection name may
#: hold) are bookkeeping kept beside projections, such as the Cloud connector's cursors:
#: listings of projections skip them.
INTERNAL_MARK = "\x1f"

Fold = Callable[[Any, RunInfo], Any]
KeyOf = Callable[[RunInfo], Any]


def is_internal(name: str) -> bool:
    """Whether a head named ``name`` is bookkeeping, not a projection."""
    return name.startswith(INTERNAL_MARK)


def check_projection_name(name: Any) -> str:
    """``name`` if it may name a projection (as a workflow name may), else ValueError."""
    return check_name("projection name", name, MAX_PROJECTION_NAME_LENGTH)


@dataclass(frozen=True, slots=True)
class ProjectionSpec:
    """One projection: fold the ended runs of the workflows ``on`` into its state (one
    state per ``key(run)`` where ``key`` is given)."""

    name: str
    on: tuple[str, ...]
    fold: Fold
    key: KeyOf | None = None

    @property
    def keyed(self) -> bool:
        return self.key is not None

    @property
    def fingerprint(self) -> str:
        """A digest of the fold's and the key function's code and of ``on``: a worker that
        finds another fingerprint with the state starts the projection over."""
        digest = hashlib.sha256()
        for part in (self.name, "\0".join(self.on), code_text(self.fold),
                     "" if self.key is None else code_text(self.key)):
            digest.update(part.encode("utf-8", "surrogatepass"))
            digest.update(b"\0")
        return digest.hexdigest()[:DIGITS]

    def key_of(self, run: RunInfo) -> str:
        """The key of the state ``run`` folds into (WHOLE for an unkeyed projection);
        TypeError if the key function returns neither a str nor an int."""
        if self.key is None:
            return WHOLE
        key = self.key(run)
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise TypeError(f"the key function of projection {self.name!r} returned "
                            f"{type(key).__name__} for run {run.run_id}; it must return a "
                            "str or an int")
        text = str(key)
        if len(text) > MAX_KEY_LENGTH:
            raise ValueError(f"the key function of projection {self.name!r} returned a key "
                             f"of {len(text)} characters for run {run.run_id}, above the "
                             f"limit of {MAX_KEY_LENGTH}")
        return text


def fold_runs(spec: ProjectionSpec, states: Mapping[str, Any],
              runs: Iterable[RunInfo]) -> dict[str, Any]:
    """The states of the keys ``runs`` touch after folding them in order (pure: ``states``
    is not changed). Runs of other statuses than FOLDED are skipped. Raises whatever the
    fold or the key function raises, and TypeError for a state that is not JSON."""
    changed: dict[str, Any] = {}
    for run in runs:
        if run.status not in FOLDED:
            continue
        key = spec.key_of(run)
        before = changed[key] if key in changed else json_copy(states.get(key))
        changed[key] = json_copy(spec.fold(before, run), spec.name, run.run_id)
    return changed


def json_copy(value: Any, name: str = "", run_id: str = "") -> Any:
    """``value`` through JSON (what the store will give back), TypeError if it is not JSON."""
    try:
        return orjson.loads(orjson.dumps(value))
    except TypeError as exc:
        raise TypeError(f"the fold of projection {name!r} returned a state that is not "
                        f"JSON after run {run_id}: {exc}") from None


#: How many replaced fingerprints a projection remembers (see :func:`lineage`).
LINEAGE = 16


def lineage(stored: str, fingerprint: str) -> tuple[str, str | None]:
    """What a worker folding with code ``fingerprint`` does with a projection whose head
    holds ``stored`` (the fingerprint its states were folded by, then those it replaced,
    space-separated): ``("fold", None)`` with the same code; ``("stand_down", None)`` when
    its code was replaced (an older build during a rolling deploy must not undo the newer
    one's rebuild); ``("rebuild", lineage)`` for new code, with the lineage to record."""
    current, *replaced = stored.split() or [""]
    if current == fingerprint:
        return "fold", None
    if fingerprint in replaced:
        return "stand_down", None
    kept = ([current] if current else []) + replaced
    return "rebuild", " ".join([fingerprint, *kept[:LINEAGE - 1]])


def projection(name: str, on: Sequence[Any] | str, key: KeyOf | None = None
               ) -> Callable[[Fold], Fold]:
    """Declare ``fold`` as the projection ``name`` over the ended runs of the workflows
    ``on``: ``fold(state, run) -> state``, ``state`` None before the first run, ``run``
    the run's RunInfo (status, params, result, error...). ``key=lambda run: ...`` keeps one
    state per key (a str or an int). The fold must be pure: a worker may call it again on
    the same run after a lost race or a crash, and only one result is kept."""
    check_projection_name(name)
    names = _check_on(name, on)
    if key is not None and not callable(key):
        raise TypeError(f"projection {name!r}: key must be a function of the run, got "
                        f"{type(key).__name__}")

    def decorate(fold: Fold) -> Fold:
        if not callable(fold):
            raise TypeError(f"@projection({name!r}) decorates a function fold(state, run), "
                            f"got {type(fold).__name__}")
        spec = ProjectionSpec(name, names, fold, key)
        PROJECTIONS.add(spec)
        fold.__pyrula_projection__ = spec  # type: ignore[attr-defined]
        return fold

    return decorate


def _check_on(name: str, on: Any) -> tuple[str, ...]:
    if isinstance(on, str):
        on = [on]
    if not isinstance(on, Sequence) or not on:
        raise ValueError(f"projection {name!r}: on= must name at least one workflow, "
                         f"got {on!r}")
    names = []
    for item in on:
        try:
            names.append(workflow_name(item))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"projection {name!r}: on= {exc}") from None
    return tuple(sorted(set(names)))


def projection_spec(target: Any) -> ProjectionSpec:
    """The spec of a ``@projection`` function (or a spec itself); TypeError otherwise."""
    if isinstance(target, ProjectionSpec):
        return target
    spec = getattr(target, "__pyrula_projection__", None)
    if not isinstance(spec, ProjectionSpec):
        raise TypeError(f"{target!r} is not a @projection (a fold decorated with "
                        "@projection(name, on=[...]))")
    return spec


class ProjectionRegistry:
    """Projection names to specs. Declaring a name again replaces it (the last import
    wins), as for workflows."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._specs: dict[str, ProjectionSpec] = {}

    def add(self, spec: ProjectionSpec) -> None:
        with self._lock:
            self._specs[spec.name] = spec

    def all(self) -> dict[str, ProjectionSpec]:
        with self._lock:
            return dict(self._specs)


PROJECTIONS = ProjectionRegistry()


def head_document(head: ProjectionHead) -> dict[str, Any]:
    """A projection's head as the CLI, the RunRouter and the dashboard show it (times in
    ISO-8601 UTC)."""
    checkpoint = None if head.checkpoint is None else {
        "finished_at": iso_utc(head.checkpoint[0]), "run_id": head.checkpoint[1]}
    return {"name": head.name, "keyed": head.keyed, "version": head.version,
            "folded": head.folded, "checkpoint": checkpoint,
            "fingerprint": (head.fingerprint.split() or [""])[0],
            "updated_at": iso_utc(head.updated_at)}
