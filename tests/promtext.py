"""Reading Prometheus text as a scrape does, for the metrics tests."""

from __future__ import annotations

import re

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text → {(sample name, labels): value}."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        assert match, f"not a Prometheus sample: {line!r}"
        name, labels, value = match.groups()
        out[(name, frozenset(_LABEL.findall(labels or "")))] = float(value)
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, frozenset(labels.items())), 0.0)
