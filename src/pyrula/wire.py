"""The wire format between a fleet child and its supervisor: one JSON object per message.

A leaf module: both the worker side (``pyrula.workflows.worker.child``) and the
supervisor import it, and it imports nothing of pyrula.

Child -> supervisor:
    {"type": "heartbeat", "state": "starting"|"ready"|"draining", "worker_id", "pid",
     "in_flight", "runs_done", "shards": {workflow: n}, "held": {run_id: token},
     "user_code": [run_id...], "suspects": [run_id...],
     "claim_tick_age": seconds, "free": slots, "store_ok": bool, "build": build id,
     "seq": the report's number}
    {"type": "boot_error", "message": "Type: text", "traceback": "..."}
                                                  before exiting without becoming ready
    {"type": "metrics", "families": {name: {"type", "help", "samples"}}, "workflows": [...]}
                                                  every METRICS_INTERVAL, and as it exits

A heartbeat goes out every HEARTBEAT_INTERVAL. A child also reports right after a claim and
whenever a run is about to enter its code unreported: into the memory it shares with its
supervisor (``pyrula.shared_report``: ``held``, ``user_code`` and ``suspects`` as below),
or, without that, as a heartbeat. ``user_code`` names every run that may be inside its own
code until the next report (the runs a crash may be charged to), ``suspects`` the held runs
with a crash counted against them. Reports are numbered (``seq``) across both ways, so the
supervisor knows which is the latest. A message without ``user_code`` (a child of an older
build) leaves every held run chargeable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

#: Exit code of a child that could not boot (import error, store refused it).
EXIT_BOOT_FAILURE = 3
#: How often a child's event loop sends its heartbeat (seconds).
HEARTBEAT_INTERVAL = 0.25
#: How often a child sends its metrics (seconds): the fleet's /metrics lags by up to this.
METRICS_INTERVAL = 1.0


class WorkerState(StrEnum):
    """A worker's state, as its heartbeat and its probes say it."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass(slots=True)
class Heartbeat:
    state: WorkerState
    worker_id: str
    pid: int
    in_flight: int = 0
    runs_done: int = 0
    shards: dict[str, int] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)
    user_code: list[str] | None = None
    suspects: list[str] = field(default_factory=list)
    claim_tick_age: float = 0.0
    free: int = 0
    #: whether the child's store answered when it last looked (a child that cannot reach
    #: its store is not ready to serve)
    store_ok: bool = True
    #: the build the child's worker serves (``pyrula.workflows.build``); "" from a child
    #: of an older pyrula
    build: str = ""
    #: the report's number: heartbeats and shared reports count up together (0 from a
    #: child of an older pyrula)
    seq: int = 0


def encode(message: dict[str, Any]) -> bytes:
    # orjson: a child reports at every claim, so this is on the hot path (stdlib json
    # took ~2 % of a busy child's time).
    return orjson.dumps(message)


def decode(data: bytes) -> dict[str, Any]:
    message: dict[str, Any] = orjson.loads(data)
    return message


def metrics_message(families: dict[str, Any], workflows: list[str]) -> bytes:
    return encode({"type": "metrics", "families": families, "workflows": workflows})


def heartbeat_message(beat: Heartbeat) -> bytes:
    return encode({"type": "heartbeat", **{k: getattr(beat, k) for k in beat.__slots__}})


def _state(value: Any) -> WorkerState:
    try:
        return WorkerState(value)
    except ValueError:  # missing, or a state this build does not know: not ready
        return WorkerState.STARTING


def parse_heartbeat(message: dict[str, Any]) -> Heartbeat:
    return Heartbeat(
        state=_state(message.get("state")),
        worker_id=str(message.get("worker_id", "")),
        pid=int(message.get("pid", 0)),
        in_flight=int(message.get("in_flight", 0)),
        runs_done=int(message.get("runs_done", 0)),
        shards={str(k): int(v) for k, v in dict(message.get("shards", {})).items()},
        held={str(k): int(v) for k, v in dict(message.get("held", {})).items()},
        user_code=(None if message.get("user_code") is None
                   else [str(r) for r in message["user_code"]]),
        suspects=[str(r) for r in message.get("suspects", [])],
        claim_tick_age=float(message.get("claim_tick_age", 0.0)),
        free=int(message.get("free", 0)),
        store_ok=bool(message.get("store_ok", True)),
        build=str(message.get("build") or ""),
        seq=int(message.get("seq") or 0),
    )
