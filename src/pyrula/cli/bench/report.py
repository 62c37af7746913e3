"""The bench's figures as the few lines a person reads."""

from __future__ import annotations

import json
from typing import Any

from pyrula.cli.bench.measure import ShareState


def _ms(figures: dict[str, Any] | None) -> str:
    if not figures:
        return "n/a"
    return (f"p50 {figures['p50']:.1f}  p95 {figures['p95']:.1f}  p99 {figures['p99']:.1f}  "
            f"max {figures['max']:.1f} ms")


def _what(f: dict[str, Any]) -> str:
    """What each run was: ``3000 runs x 3 async steps, payload 0 B`` of the built-in
    workflow, ``40 runs of orders.place, params {"x": 1}`` of the user's."""
    if f["steps"] is not None:
        return (f"{f['runs']} runs x {f['steps']} {f['step_kind']} steps, payload "
                f"{f['payload_bytes']} B")
    return f"{f['runs']} runs of {f['workflow']}, params {_json(f['params'])}"


def _right(f: dict[str, Any]) -> str:
    """What every run was verified to do."""
    if f["steps"] is not None:
        return f"completed with x + {f['steps']}"
    if f["expect_given"]:
        return f"of {f['workflow']} completed with the expected result {_json(f['expect'])}"
    return f"of {f['workflow']} completed (no --expect: any result)"


def _json(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def render(f: dict[str, Any]) -> str:
    """A text report of ``run_bench``'s figures."""
    if f["mode"] == "rate":
        mode = f"open loop at {f['rate']:g} runs/s"
    elif f["mode"] == "concurrency":
        mode = f"{f['concurrency']} in flight"
    else:
        mode = "all queued first"
    fleet = f"attached fleet {f['attached']}" if f["attached"] else "own fleet"
    steps_per_s = "" if f["steps_per_s"] is None else f" ({f['steps_per_s']:,.1f} steps/s)"
    lines = [
        f"pyrula-fleet bench: {_what(f)}, {mode}; {f['children']} children ({fleet}), "
        f"store {f['store']}",
        f"  throughput     {f['runs_per_s']:,.1f} runs/s{steps_per_s} in "
        f"{f['seconds']:.3f} s; submitting took {f['submit_seconds']:.3f} s"
        + (f" ({f['submit_rate_achieved']:,.1f} runs/s achieved)"
           if f["mode"] == "rate" and f["submit_rate_achieved"] else ""),
        f"  latency        submit -> result  {_ms(f['latency_ms'])}",
        f"  run duration   started -> finished  {_ms(f['run_duration_ms'])}",
    ]
    shares = f["child_shares"]
    if shares:
        lines.append("  child shares   " + ",  ".join(
            f"pid {s['pid']} {s['percent']:.1f} % ({s['runs']}"
            + ("" if s["state"] == ShareState.LIVE else f", {s['state']}") + ")"
            for s in shares))
    shards = f["shards"]
    lines.append(
        f"  shards         {shards['workflow']}: {shards['min']}-{shards['max']} per child "
        f"(min-max over {len(shards['per_child'])} children, {shards['total']} held)"
        if shards else "  shards         n/a (the store has no shards)"
        if f["store"] == "sqlite" else "  shards         n/a (no child reported shards)")
    if f["store_commands_per_run"] is not None:
        lines.append(f"  store          {f['store_commands_per_run']:.1f} commands per run "
                     "(INFO commandstats of the whole server: other clients count too)")
    else:
        lines.append(f"  store          commands per run not measured ({f['store_commands_note']})")
    if f.get("upgrade_every") is not None:
        lines.append(f"  upgrades       {len(f['upgrades_at_s'])} SIGUSR2s, one every "
                     f"{f['upgrade_every']:g} s")
    if f.get("min") is not None:
        lines.append(f"  elastic        --min {f['min']} --max {f['max']}")
    if f["kill_every"] is not None:
        pids = ", ".join(str(k["pid"]) for k in f["kills"][:10])
        more = ", ..." if len(f["kills"]) > 10 else ""
        lines.append(f"  kills          {len(f['kills'])} SIGKILLs, one every {f['kill_every']:g} s"
                     + (f" (pids {pids}{more})" if pids else "")
                     + f"; {f['runs_retried']} runs ran more than once (attempt > 1)")
    elif f["runs_retried"]:
        lines.append(f"  retries        {f['runs_retried']} runs ran more than once (attempt > 1)")
    if f.get("invariants_line"):
        lines.append(f"  invariants     {f['invariants_line']}")
    v = f["verification"]
    if v["ok"]:
        lines.append(f"  verified       all {v['runs']} runs {_right(f)}")
    else:
        lines.append(f"  FAILED         {v['completed']}/{v['runs']} runs verified; "
                     + "; ".join(f["problems"])
                     + (f" (gave up: {f['gave_up']})" if f["gave_up"] else ""))
    return "\n".join(lines)
