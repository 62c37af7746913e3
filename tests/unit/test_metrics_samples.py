"""A worker's figures are plain numbers, kept in the shape of Prometheus samples: they must
read exactly as ``prometheus_client``'s own counters, gauges and histograms would, for any
sequence of recordings (the fleet sums them and the dashboard reads them by these names).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pyrula.metrics import CATALOG, Kind, Metrics, render

#: Catalogued metrics of each kind, and one dotted name outside the catalog.
NAMES = ["pyrula.workflows.runs.started", "pyrula.workflows.runs.requeued",
         "pyrula.workflows.queue.depth", "pyrula.workflows.runs.in_flight",
         "pyrula.workflows.step.duration", "pyrula.workflows.claim.latency",
         "pyrula.workflows.timers.woken"]
VALUES = st.sampled_from(["a", "b", "c d", 'q"uote'])
AMOUNTS = st.one_of(st.floats(min_value=0, max_value=1e5, allow_nan=False),
                    st.sampled_from([0.001, 0.0025, 1.0, 300.0, 86400.0]))


def kind_of(name: str) -> Kind:
    spec = CATALOG.get(name)
    return spec.kind if spec is not None else Kind.COUNTER


def labels_of(name: str) -> tuple[str, ...]:
    spec = CATALOG.get(name)
    return spec.labels if spec is not None else ("x",)


@st.composite
def recordings(draw: Any) -> list[tuple[str, float, dict[str, str]]]:
    out = []
    for _ in range(draw(st.integers(0, 30))):
        name = draw(st.sampled_from(NAMES))
        labels = {label: draw(VALUES) for label in labels_of(name)}
        out.append((name, draw(AMOUNTS), labels))
    return out


def reference(ops: list[tuple[str, float, dict[str, str]]]) -> dict[str, Any]:
    """What prometheus_client itself makes of the same recordings."""
    registry = CollectorRegistry(auto_describe=False)
    made: dict[str, Any] = {}
    for name, amount, labels in ops:
        if name not in made:
            spec = CATALOG.get(name)
            prom = spec.prometheus if spec else name.replace(".", "_")
            common: dict[str, Any] = {"labelnames": labels_of(name), "registry": registry}
            kind = kind_of(name)
            if kind is Kind.COUNTER:
                made[name] = Counter(prom, spec.help if spec else name, **common)
            elif kind is Kind.GAUGE:
                made[name] = Gauge(prom, spec.help if spec else name, **common)
            else:
                assert spec is not None
                made[name] = Histogram(prom, spec.help, buckets=spec.buckets, **common)
        series = made[name].labels(**labels) if labels else made[name]
        record = {Kind.COUNTER: "inc", Kind.GAUGE: "set", Kind.HISTOGRAM: "observe"}
        getattr(series, record[kind_of(name)])(amount)
    return {f.name: {"type": f.type, "help": f.documentation,
                     "samples": sorted([s.name, sorted(s.labels.items()), s.value]
                                       for s in f.samples if not s.name.endswith("_created"))}
            for f in registry.collect()}


def ours(ops: list[tuple[str, float, dict[str, str]]]) -> dict[str, Any]:
    metrics = Metrics()
    for name, amount, labels in ops:
        record = {Kind.COUNTER: metrics.inc, Kind.GAUGE: metrics.set,
                  Kind.HISTOGRAM: metrics.observe}[kind_of(name)]
        record(name, amount, **labels)
    return {name: {**family, "samples": sorted([n, sorted(labels.items()), v]
                                               for n, labels, v in family["samples"])}
            for name, family in metrics.samples().items()}


@settings(max_examples=200, deadline=None)
@given(recordings())
def test_samples_read_as_prometheus_clients_own(ops: list[tuple[str, float, dict[str, str]]]
                                                ) -> None:
    assert ours(ops) == reference(ops)


@settings(max_examples=50, deadline=None)
@given(recordings())
def test_rendered_text_is_what_prometheus_client_renders(
        ops: list[tuple[str, float, dict[str, str]]]) -> None:
    from prometheus_client.exposition import generate_latest

    metrics = Metrics()
    for name, amount, labels in ops:
        {Kind.COUNTER: metrics.inc, Kind.GAUGE: metrics.set,
         Kind.HISTOGRAM: metrics.observe}[kind_of(name)](name, amount, **labels)
    lines = sorted(line for line in metrics.prometheus().splitlines()
                   if not line.startswith("#"))
    registry_text = render(reference_families(ops))
    assert lines == sorted(line for line in registry_text.splitlines()
                           if not line.startswith("#"))
    assert generate_latest  # the renderer is prometheus_client's own


def reference_families(ops: list[tuple[str, float, dict[str, str]]]) -> dict[str, Any]:
    return {name: {**family, "samples": [[n, dict(labels), v] for n, labels, v in
                                         family["samples"]]}
            for name, family in reference(ops).items()}


def test_a_counter_only_goes_up_and_labels_are_the_metrics_own() -> None:
    metrics = Metrics()
    with pytest.raises(ValueError, match="only go up"):
        metrics.inc("pyrula.workflows.runs.started", -1, workflow="w")
    with pytest.raises(ValueError, match=r"takes the labels \['workflow'\]"):
        metrics.inc("pyrula.workflows.runs.started", step="s")
    assert metrics.samples() == {"pyrula_runs_started": {
        "type": "counter", "help": CATALOG["pyrula.workflows.runs.started"].help,
        "samples": []}}


def test_get_sums_over_the_labels_not_given_and_counts_a_histogram() -> None:
    metrics = Metrics()
    metrics.inc("pyrula.workflows.runs.started", workflow="a")
    metrics.inc("pyrula.workflows.runs.started", 2, workflow="b")
    metrics.observe("pyrula.workflows.step.duration", 0.5, workflow="a", step="s")
    metrics.observe("pyrula.workflows.step.duration", 5.0, workflow="a", step="t")
    assert metrics.get("pyrula.workflows.runs.started") == 3
    assert metrics.get("pyrula.workflows.runs.started", workflow="b") == 2
    assert metrics.get("pyrula.workflows.step.duration", step="t") == 1
    assert metrics.get("pyrula.workflows.nothing") == 0
    metrics.set("pyrula.workflows.queue.depth", 4, workflow="a")
    metrics.set("pyrula.workflows.queue.depth", 5, workflow="b")
    metrics.forget("pyrula.workflows.queue.depth", [{"workflow": "b"}])
    assert metrics.get("pyrula.workflows.queue.depth") == 5


@settings(max_examples=200, deadline=None)
@given(recordings(), st.data())
def test_series_found_once_record_as_the_calls_do(
        ops: list[tuple[str, float, dict[str, str]]], data: st.DataObject) -> None:
    """A hot path's ``Metrics.counter``/``histogram`` handles, mixed in any order with
    ``inc``/``observe`` on the same series, read as prometheus_client's own; a handle
    that recorded nothing yet shows nothing."""
    metrics = Metrics()
    handles: dict[Any, Any] = {}
    for name, amount, labels in ops:
        kind = kind_of(name)
        if kind is Kind.GAUGE or not data.draw(st.booleans(), label="by handle"):
            {Kind.COUNTER: metrics.inc, Kind.GAUGE: metrics.set,
             Kind.HISTOGRAM: metrics.observe}[kind](name, amount, **labels)
            continue
        key = (name, tuple(sorted(labels.items())))
        if key not in handles or data.draw(st.booleans(), label="a new handle"):
            handles[key] = (metrics.counter(name, **labels) if kind is Kind.COUNTER
                            else metrics.histogram(name, **labels))
        if kind is Kind.COUNTER:
            handles[key].inc(amount)
        else:
            handles[key].observe(amount)
    metrics.counter("pyrula.workflows.runs.cancelled", workflow="never")
    metrics.histogram("pyrula.workflows.run.duration", workflow="never")
    got = {name: {**family, "samples": sorted([n, sorted(labels.items()), v]
                                              for n, labels, v in family["samples"])}
           for name, family in metrics.samples().items()}
    assert got == reference(ops)


def test_a_handle_refuses_what_the_calls_refuse() -> None:
    metrics = Metrics()
    with pytest.raises(ValueError, match="only go up"):
        metrics.counter("pyrula.workflows.runs.started", workflow="w").inc(-1)
    with pytest.raises(ValueError, match=r"takes the labels \['workflow'\]"):
        metrics.counter("pyrula.workflows.runs.started", step="s").inc()
    assert metrics.samples()["pyrula_runs_started"]["samples"] == []
