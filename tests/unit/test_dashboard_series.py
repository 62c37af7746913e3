"""The dashboard's charts: rates and latencies from the fleet's cumulative counters."""

from __future__ import annotations

from typing import Any

import pytest

from pyrula.dashboard.series import (
    CLAIM_LATENCY,
    COMPLETED,
    RUN_DURATION,
    Series,
    point,
    quantile,
    read,
)
from pyrula.timestamps import iso_utc


def _histogram(name: str, observed: list[float], bounds: tuple[float, ...]) -> dict[str, Any]:
    buckets = [[f"{name}_bucket", {"workflow": "w", "le": str(b)},
                float(sum(v <= b for v in observed))] for b in bounds]
    buckets.append([f"{name}_bucket", {"workflow": "w", "le": "+Inf"}, float(len(observed))])
    return {"type": "histogram", "help": "", "samples": [
        *buckets, [f"{name}_count", {"workflow": "w"}, float(len(observed))],
        [f"{name}_sum", {"workflow": "w"}, float(sum(observed))]]}


def families(completed: float, run: list[float], bounds: tuple[float, ...] = (0.1, 1.0),
             claims: list[float] | None = None) -> dict[str, Any]:
    """Families in the fleet's shape: ``run`` the run durations observed so far (two
    workflows), ``claims`` the claim latencies (no claim histogram when None)."""
    out = {
        COMPLETED: {"type": "counter", "help": "", "samples": [
            [f"{COMPLETED}_total", {"workflow": "a"}, completed / 2],
            [f"{COMPLETED}_total", {"workflow": "b"}, completed / 2]]},
        RUN_DURATION: _histogram(RUN_DURATION, run, bounds),
    }
    if claims is not None:
        out[CLAIM_LATENCY] = _histogram(CLAIM_LATENCY, claims, bounds)
    return out


def test_a_point_is_the_rate_and_the_latency_of_what_ended_between_two_readings() -> None:
    before = read(families(10, [0.05] * 10), at=100.0)
    after = read(families(30, [0.05] * 10 + [0.5] * 20), at=102.0)
    p = point(before, after)
    assert p["completed_per_s"] == 10.0  # 20 runs in 2 s, summed over both workflows
    assert p["run_count"] == 20 and p["run_mean_s"] == 0.5
    assert 0.1 < p["run_p95_s"] <= 1.0  # within the bucket the new runs fell in
    assert p["claim_count"] == 0 and p["claim_mean_s"] is None  # no claim histogram yet


def test_a_counter_that_went_down_counts_from_zero() -> None:
    before = read(families(50, [0.05] * 50), at=0.0)
    after = read(families(3, [0.05] * 3), at=1.0)  # the fleet restarted
    p = point(before, after)
    assert p["completed_per_s"] == 3.0 and p["run_count"] == 3


def test_quantile_interpolates_within_the_bucket_like_histogram_quantile() -> None:
    assert quantile({0.1: 50.0, 1.0: 100.0, float("inf"): 100.0}, 0.75) == pytest.approx(0.55)
    assert quantile({0.1: 0.0, float("inf"): 0.0}, 0.95) is None
    assert quantile({0.1: 0.0, float("inf"): 4.0}, 0.95) == 0.1  # past the last bound


def test_the_ring_keeps_the_last_window_only() -> None:
    series = Series(interval=1.0, window=5.0)
    for second in range(20):
        series.add(read(families(second, [], claims=[0.02] * second), at=float(second)))
    body = series.body()
    assert [p["at"] for p in body["points"]] == [iso_utc(float(t)) for t in range(15, 20)]
    assert all(p["completed_per_s"] == 1.0 for p in body["points"])
    # The claim histogram is read too: one claim of 20 ms a second, within its first bucket.
    for p in body["points"]:
        assert p["claim_count"] == 1 and p["claim_mean_s"] == 0.02, p
        assert 0 < p["claim_p95_s"] <= 0.1, p
