"""A run's journal as an OpenTelemetry trace: one trace per run, built from the journal.

The spans are not recorded by a tracer while the run executes: they are built afterwards
from the run's durable journal (``pyrula.workflows.history`` reads it), so an attempt
whose process was killed loses nothing, and every attempt of a run, on any worker, lands
in the same trace. Ids are derived from the run id (the trace) and from the position of
the event that opened each span, so exporting a run again gives the same ids and a
collector sees the same spans, not new ones.

The trace of a run::

    run <workflow>                      submitted .. the run's last event; ERROR if failed
    ├── attempt N                       a claim .. its park, requeue or the run's end
    │   └── step <name>                 one try of a step; ERROR for a failed try
    └── parked sleeping|waiting         the time the run held no worker

The root span names the run's parent (``pyrula.parent_id``, a child workflow's run) and
carries the family and update facts as span events: ``children_started`` (the call, how
many, their workflow; a single child's run id), ``children_ended`` (how many a fan-out saw
end) and ``update_applied`` (the update's name and id; ``pyrula.error_type`` for one its
handler refused).

Recovery facts are span events of the attempt they ended: ``run_requeued`` (its reason),
``child_killed`` (a fleet child that died: pid, exit signal, RSS), ``run_reclaimed`` (an
orphaned run taken back from a dead worker), ``run_quarantined`` (the crash past the
poison policy).

The pure part (``run_spans``) needs only the journal; the export part reads it from a
store or a client and hands the spans to any ``SpanExporter``. Both need the extra
``pyrula[otel]`` (``opentelemetry-sdk``); pyrula itself works without it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyrula
from pyrula.errors import ConfigurationError
from pyrula.workflows.events import Event, EventType, parent_of_key
from pyrula.workflows.history import Attempt, History, read_history

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["SpanPlan", "TraceExportFailed", "export_run", "export_run_sync", "plan_spans",
           "require_otel", "run_spans", "span_id_of", "trace_id_of"]

INSTALL_HINT = "pip install 'pyrula[otel]'"

#: Scalar attributes of a crash's evidence copied onto ``child_killed``.
_EVIDENCE = ("pid", "exit_signal", "exit", "exit_code", "rss_bytes", "killed_for", "worker",
             "cause")


class TraceExportFailed(RuntimeError):
    """The exporter answered FAILURE for a run's spans."""


def require_otel() -> None:
    """Raise ConfigurationError naming the extra if the OpenTelemetry SDK is not installed."""
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise ConfigurationError(
            f"tracing needs the OpenTelemetry SDK, which is not installed: {INSTALL_HINT}"
        ) from None


# --- ids ---------------------------------------------------------------------------------


def _nonzero(digest: bytes) -> int:
    value = int.from_bytes(digest, "big")
    return value or 1  # an all-zero id is invalid in OpenTelemetry


def trace_id_of(run_id: str) -> int:
    """The trace id of a run: 128 bits of a hash of its id, the same on every worker."""
    return _nonzero(hashlib.sha256(f"pyrula.trace:{run_id}".encode()).digest()[:16])


def span_id_of(run_id: str, key: str) -> int:
    """The id of the span ``key`` (``run`` or the position of the event that opened it)."""
    return _nonzero(hashlib.sha256(f"pyrula.span:{run_id}:{key}".encode()).digest()[:8])


def _ns(ts: float) -> int:
    return round(ts * 1_000_000_000)


# --- the pure part: what the spans are ---------------------------------------------------


@dataclass(slots=True)
class SpanPlan:
    """One span, before it is an OpenTelemetry object: times in epoch seconds."""

    key: str
    name: str
    start: float
    end: float
    parent: str | None
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, float, dict[str, Any]]] = field(default_factory=list)
    error: str | None = None  # the description of an ERROR status
    ok: bool = False
    link_run: str | None = None  # the run this one continues as


def plan_spans(events: Sequence[Event], run_id: str) -> list[SpanPlan]:
    """The spans of the run whose journal is ``events``, parents before children. No
    OpenTelemetry is needed here: this is what ``run_spans`` turns into spans."""
    history = read_history(events)
    if history.first is None or history.last is None:
        return []
    root = _root(history, run_id)
    _family_and_updates(root, events)
    plans = [root]
    for position, attempt in enumerate(history.attempts):
        plans.append(_attempt(attempt, position, history))
    for tried in history.tries:
        parent = history.attempts[tried.attempt] if tried.attempt is not None else None
        attrs: dict[str, Any] = {"pyrula.step": tried.name, "pyrula.call": tried.call,
                                 "pyrula.try": tried.number, "pyrula.outcome": tried.outcome}
        end = tried.end if tried.end is not None else (parent.end if parent else history.last)
        plan = SpanPlan(str(tried.index), f"step {tried.name}", tried.start, max(end, tried.start),
                        str(parent.index) if parent else "run", attrs)
        if tried.error is not None and tried.outcome in ("failed", "retrying"):
            attrs["pyrula.will_retry"] = tried.outcome == "retrying"
            attrs["error.type"] = str(tried.error.get("type"))
            plan.error = f"{tried.error.get('type')}: {tried.error.get('message')}"
        plans.append(plan)
    for park in history.parks:
        attrs = {"pyrula.why": park.why}
        for name in ("signal", "wake_at", "timeout_at", "step"):
            if park.event.get(name) is not None:
                attrs[f"pyrula.{name}"] = park.event[name]
        if park.ended_by is not None:
            attrs["pyrula.ended_by"] = park.ended_by
        end = park.end if park.end is not None else history.last
        plans.append(SpanPlan(str(park.index), f"parked {park.kind}", park.start, end, "run",
                              attrs))
    return plans


def _root(history: History, run_id: str) -> SpanPlan:
    start = history.submitted if history.submitted is not None else (
        history.attempts[0].start if history.attempts else history.first)
    final = history.final
    end = final["ts"] if final is not None else history.last
    assert start is not None and end is not None
    workflow = history.workflow or "unknown"
    attrs: dict[str, Any] = {"pyrula.run_id": run_id, "pyrula.workflow": workflow,
                             "pyrula.status": history.status,
                             "pyrula.attempts": len(history.attempts)}
    plan = SpanPlan("run", f"run {workflow}", start, max(end, start), None, attrs)
    if final is not None and final["type"] == EventType.RUN_ERROR:
        attrs["pyrula.error_code"] = str(final.get("code"))
        attrs["error.type"] = str(final.get("error_type"))
        plan.error = f"{final.get('code')}: {final.get('error_type')}: {final.get('message')}"
    elif final is not None and final["type"] == EventType.RUN_COMPLETED:
        plan.ok = True
    elif final is not None and final["type"] == EventType.RUN_CONTINUED:
        successor = final.get("successor")
        if successor:
            attrs["pyrula.successor"] = str(successor)
            plan.link_run = str(successor)
    if history.forked is not None:
        _, forked = history.forked
        attrs["pyrula.forked_from"] = str(forked.get("from_run"))
        plan.events.append(("run_forked", float(forked["ts"]), {
            "pyrula.from_run": str(forked.get("from_run")),
            "pyrula.from_step": str(forked.get("from_step")),
            "pyrula.from_call": int(forked.get("from_call") or 0)}))
    for signal in history.signals:
        plan.events.append(("signal_received", float(signal["ts"]),
                            {"pyrula.signal": str(signal.get("name"))}))
    return plan


def _family_and_updates(root: SpanPlan, events: Sequence[Event]) -> None:
    """The run's parent, the children it started and saw end, and the updates it applied,
    on the root span."""
    if events and events[0].get("type") == EventType.RUN_SUBMITTED:
        parent = parent_of_key(events[0].get("idempotency_key"))
        if parent is not None:
            root.attributes["pyrula.parent_id"] = parent
    for event in events:
        type_, ts = event.get("type"), float(event.get("ts", 0.0))
        if type_ == EventType.CHILD_STARTED:
            many = event.get("children")
            facts: dict[str, Any] = {"pyrula.call": int(event.get("call") or 0)}
            if isinstance(many, list):
                facts["pyrula.children"] = len(many)
                names = sorted({str(item[2]) for item in many if len(item) > 2})
                facts["pyrula.child_workflow"] = ", ".join(names)
            else:
                facts.update({"pyrula.children": 1, "pyrula.child_run": str(event.get("child")),
                              "pyrula.child_workflow": str(event.get("name"))})
            root.events.append(("children_started", ts, facts))
        elif type_ == EventType.CHILD_ENDED:
            root.events.append(("children_ended", ts, {
                "pyrula.call": int(event.get("call") or 0),
                "pyrula.children": len(event.get("indices") or [])}))
        elif type_ == EventType.UPDATE_APPLIED:
            applied = {"pyrula.update": str(event.get("name")),
                       "pyrula.update_id": str(event.get("update"))}
            if event.get("error_type") is not None:
                applied["pyrula.error_type"] = str(event["error_type"])
            root.events.append(("update_applied", ts, applied))


def _attempt(attempt: Attempt, position: int, history: History) -> SpanPlan:
    number = attempt.number if attempt.number is not None else position + 1
    attrs: dict[str, Any] = {"pyrula.attempt": number, "pyrula.worker": str(attempt.worker)}
    if attempt.after is not None:
        attrs["pyrula.after"] = attempt.after
    plan = SpanPlan(str(attempt.index), f"attempt {number}", attempt.start, attempt.end, "run",
                    attrs)
    for note in attempt.notes:
        ts = float(note["ts"])
        found = note.get("detail")
        detail: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        if note["type"] == EventType.RUN_REQUEUED:
            reason = str(note.get("reason", "unknown"))
            requeued: dict[str, Any] = {"pyrula.reason": reason}
            if note.get("crashes") is not None:
                requeued["pyrula.crashes"] = note["crashes"]
            plan.events.append(("run_requeued", ts, requeued))
            if reason == "orphaned":
                plan.events.append(("run_reclaimed", ts, _evidence(detail, ("worker", "cause"))))
        elif note.get("code") == "max_retries":
            plan.events.append(("run_quarantined", ts, {
                "pyrula.crashes": detail.get("crashes", 0),
                "pyrula.message": str(note.get("message")),
            }))
            plan.error = str(note.get("message"))
        if "pid" in detail or "exit_signal" in detail:
            plan.events.append(("child_killed", ts, _evidence(detail, _EVIDENCE)))
    for mark in history.patches:
        if mark.attempt == position:
            plan.events.append(("patch_applied", mark.at,
                                {"pyrula.patch": mark.patch, "pyrula.call": mark.call}))
    if history.final is not None and position == len(history.attempts) - 1 \
            and history.final["type"] == EventType.RUN_ERROR and plan.error is None:
        plan.error = str(history.final.get("message"))
    return plan


def _evidence(detail: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    return {f"pyrula.{name}": detail[name] for name in names
            if isinstance(detail.get(name), str | int | float | bool)}


# --- OpenTelemetry spans -----------------------------------------------------------------


def run_spans(events: Sequence[Event], *, run_id: str,
              resource: Resource | None = None) -> list[ReadableSpan]:
    """The run's trace as finished ``ReadableSpan``s, ready for any ``SpanExporter``."""
    require_otel()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event as SpanEvent
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

    resource = resource if resource is not None else Resource.create({"service.name": "pyrula"})
    scope = InstrumentationScope("pyrula", pyrula.__version__)
    trace_id = trace_id_of(run_id)

    def context(key: str, run: str = run_id, tid: int = trace_id) -> SpanContext:
        return SpanContext(tid, span_id_of(run, key), is_remote=False,
                           trace_flags=TraceFlags(TraceFlags.SAMPLED))

    spans: list[ReadableSpan] = []
    for plan in plan_spans(events, run_id):
        if plan.error is not None:
            status = Status(StatusCode.ERROR, plan.error)
        else:
            status = Status(StatusCode.OK if plan.ok else StatusCode.UNSET)
        links = []
        if plan.link_run is not None:
            links.append(Link(context("run", plan.link_run, trace_id_of(plan.link_run)),
                              {"pyrula.link": "continued_as"}))
        spans.append(ReadableSpan(
            name=plan.name, context=context(plan.key),
            parent=context(plan.parent) if plan.parent is not None else None,
            resource=resource, attributes=plan.attributes,
            events=[SpanEvent(name, attrs, _ns(ts)) for name, ts, attrs in plan.events],
            links=links, status=status, start_time=_ns(plan.start), end_time=_ns(plan.end),
            instrumentation_scope=scope,
        ))
    return spans


# --- export -------------------------------------------------------------------------------


class _EventsReader(Protocol):
    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]: ...


class _EventsClient(Protocol):
    async def events(self, run_id: str, after_seq: int = 0) -> list[Event]: ...


async def _read(source: Any, run_id: str) -> list[Event]:
    if hasattr(source, "read_events"):
        reader: _EventsReader = source
        return await reader.read_events(run_id)
    client: _EventsClient = source
    return await client.events(run_id)


def _export(exporter: SpanExporter, spans: list[ReadableSpan], run_id: str) -> None:
    from opentelemetry.sdk.trace.export import SpanExportResult

    if spans and exporter.export(spans) is not SpanExportResult.SUCCESS:
        raise TraceExportFailed(f"the exporter refused the {len(spans)} spans of run {run_id}")


async def export_run(source: Any, run_id: str, exporter: SpanExporter, *,
                     resource: Resource | None = None) -> list[ReadableSpan]:
    """Read the journal of ``run_id`` from ``source`` (a store or a ``WorkflowClient``) and
    export its trace; returns the spans. The exporter runs on a thread (exporters block on
    the network), so the event loop goes on meanwhile. Raises ``TraceExportFailed`` if the
    exporter answers FAILURE."""
    require_otel()
    spans = run_spans(await _read(source, run_id), run_id=run_id, resource=resource)
    await asyncio.to_thread(_export, exporter, spans, run_id)
    return spans


def export_run_sync(source: Any, run_id: str, exporter: SpanExporter, *,
                    resource: Resource | None = None) -> list[ReadableSpan]:
    """``export_run`` for code that is not async: a store (run the way the store declares)
    or a ``SyncWorkflowClient``."""
    require_otel()
    from pyrula.workflows.stores.admin import run_for

    if hasattr(source, "read_events"):
        events = run_for(source, source.read_events(run_id))
    else:
        events = source.events(run_id)
    spans = run_spans(events, run_id=run_id, resource=resource)
    _export(exporter, spans, run_id)
    return spans
