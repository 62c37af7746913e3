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
    """The sample ``name{labels}`` (exactly those labels); an AssertionError naming the
    samples of that name there are when it is absent. A metric that is not exposed is not
    a metric at 0: a test that means "absent" says so with ``maybe(...) is None``."""
    found = maybe(text, name, **labels)
    if found is None:
        near = sorted(_spell(key, dict(ls)) for key, ls in samples(text) if key == name)
        raise AssertionError(f"no sample {_spell(name, labels)} in the scrape; there are "
                             f"{', '.join(near) if near else 'none of that name'}")
    return found


def _spell(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}" if inner else name


def maybe(text: str, name: str, **labels: str) -> float | None:
    """The sample ``name{labels}``, or None when the scrape has no such sample (to poll
    for one that is yet to appear, or to assert one is absent)."""
    return samples(text).get((name, frozenset(labels.items())))
