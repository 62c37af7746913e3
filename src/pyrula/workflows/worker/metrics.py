"""In-process counters and gauges, rendered as Prometheus text."""

from __future__ import annotations

import threading
from collections import defaultdict


class Metrics:
    """Counters by name (dotted: ``pyrula.workflows.attempts``) and labels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
        self._gauges: dict[str, float] = {}

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counters[key] += amount

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self._gauges[name] = value

    def get(self, name: str, **labels: str) -> float:
        with self._lock:
            if labels:
                return self._counters.get((name, tuple(sorted(labels.items()))), 0.0)
            return sum(v for (n, _), v in self._counters.items() if n == name)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            out = {n: v for n, v in self._gauges.items()}
            for (name, labels), value in self._counters.items():
                label = ",".join(f"{k}={v}" for k, v in labels)
                out[f"{name}{{{label}}}" if label else name] = value
            return out

    def prometheus(self, prefix_labels: dict[str, str] | None = None) -> str:
        lines: list[str] = []
        with self._lock:
            items = [(n, dict(lab), v, "counter") for (n, lab), v in self._counters.items()]
            items += [(n, {}, v, "gauge") for n, v in self._gauges.items()]
        seen: set[str] = set()
        for name, labels, value, kind in sorted(items, key=lambda i: i[0]):
            metric = name.replace(".", "_")
            if kind == "counter" and not metric.endswith("_total"):
                metric += "_total"
            if metric not in seen:
                lines.append(f"# TYPE {metric} {kind}")
                seen.add(metric)
            all_labels = {**(prefix_labels or {}), **labels}
            text = ",".join(f'{k}="{v}"' for k, v in sorted(all_labels.items()))
            lines.append(f"{metric}{{{text}}} {value:g}" if text else f"{metric} {value:g}")
        return "\n".join(lines) + "\n"
