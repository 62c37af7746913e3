"""What a bench is asked to do (``BenchConfig``), and the error it stops with."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pyrula.cli.bench.expect import Check, Expected, expect_check, sum_check

#: The workflow of ``pyrula.examples.bench`` that every bench run is a run of.
WORKFLOW = "pyrula.bench"
APP = "pyrula.examples.bench"
STEP_KINDS = ("async", "sync")


class BenchError(Exception):
    """The bench cannot go on: a one-line message and the exit code (2: the user's
    configuration; 1: the fleet or the store failed under the bench)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class BenchConfig:
    children: int = 2
    runs: int = 10000
    steps: int = 3
    #: None: a fresh SQLite file in a temporary directory (own fleet), or the fleet's
    #: default (``$PYRULA_STORE_URL``, else ``sqlite:///pyrula.db``) with ``attach``.
    store_url: str | None = None
    namespace: str | None = None
    step_kind: str = "async"
    payload_bytes: int = 0
    rate: float | None = None
    concurrency: int | None = None
    #: The health URL of a running fleet to load instead of starting one.
    attach: str | None = None
    kill_every: float | None = None
    #: Start the bench's own fleet elastic between these (``-n`` its start size).
    min_children: int | None = None
    max_children: int | None = None
    #: SIGUSR2 the fleet this often: an upgrade to a new generation under the load.
    upgrade_every: float | None = None
    #: Runs still not ended when no run has ended for this long are reported lost.
    lost_after: float = 30.0
    #: Check the invariants over journals and the side-effect ledger after the load.
    verify: bool = False
    #: Where the steps write the ledger (with ``verify``); None: the bench's temporary
    #: directory. An attached fleet's processes must be able to write there.
    ledger: str | None = None
    #: A workflow of the attached fleet's to load it with instead of the built-in one,
    #: each run with ``params``; with ``expect``, each run's result must equal its value.
    workflow: str | None = None
    params: Any = field(default_factory=dict)
    expect: Expected | None = None

    def __post_init__(self) -> None:
        checks = [
            (self.children >= 1, f"-n must be >= 1, got {self.children}"),
            (self.runs >= 1, f"--runs must be >= 1, got {self.runs}"),
            (self.steps >= 0, f"--steps must be >= 0, got {self.steps}"),
            (self.payload_bytes >= 0, f"--payload-bytes must be >= 0, got {self.payload_bytes}"),
            (self.step_kind in STEP_KINDS,
             f"--step-kind must be one of {', '.join(STEP_KINDS)}, got {self.step_kind!r}"),
            (self.rate is None or 0 < self.rate < math.inf,
             f"--rate must be a number of runs per second > 0, got {self.rate}"),
            (self.concurrency is None or self.concurrency >= 1,
             f"--concurrency must be >= 1, got {self.concurrency}"),
            (self.rate is None or self.concurrency is None,
             "--rate and --concurrency exclude each other: pick one"),
            (self.kill_every is None or 0 < self.kill_every < math.inf,
             f"--kill-every must be > 0 seconds, got {self.kill_every}"),
            (self.upgrade_every is None or 0 < self.upgrade_every < math.inf,
             f"--upgrade-every must be > 0 seconds, got {self.upgrade_every}"),
            ((self.min_children is None) == (self.max_children is None),
             "--min and --max go together"),
            (self.min_children is None or 1 <= self.min_children <= self.children
             <= (self.max_children or 0),
             f"-n ({self.children}) must be within --min {self.min_children} .. "
             f"--max {self.max_children}, and --min >= 1"),
            (self.min_children is None or self.attach is None,
             "--min/--max size the bench's own fleet: not with --attach"),
            (0 < self.lost_after < math.inf,
             f"--lost-after must be > 0 seconds, got {self.lost_after}"),
            (self.ledger is None or self.verify, "--ledger is only used with --verify"),
            (self.workflow is None or self.attach is not None,
             "--workflow needs --attach URL: the bench's own fleet serves only "
             f"{WORKFLOW}; start yours (pyrula-fleet start --app ...) and attach to it"),
            (self.workflow is None or not self.verify,
             "--verify checks the built-in workflow's ledger: not with --workflow"),
            (self.workflow is None or self.payload_bytes == 0,
             "--payload-bytes shapes the built-in workflow's params: with --workflow, "
             "--params are each run's params"),
            (self.workflow is not None or (self.params == {} and self.expect is None),
             "--params and --expect go with --workflow NAME"),
        ]
        for ok, message in checks:
            if not ok:
                raise BenchError(message, code=2)
        if self.attach is not None:
            object.__setattr__(self, "attach", parse_health_url(self.attach))

    @property
    def workflow_name(self) -> str:
        """The workflow every run is a run of."""
        return self.workflow or WORKFLOW

    @property
    def check(self) -> Check:
        """Whether a run's result is right (see ``pyrula.cli.bench.expect``)."""
        return sum_check(self.steps) if self.workflow is None else expect_check(self.expect)

    @property
    def mode(self) -> str:
        """``rate`` (open loop), ``concurrency`` (closed loop) or ``queue`` (all first)."""
        if self.rate is not None:
            return "rate"
        if self.concurrency is not None:
            return "concurrency"
        return "queue"


def parse_health_url(url: str) -> str:
    """``http://host:port`` of a fleet's health port, without a trailing slash; a
    BenchError (exit 2) for anything else."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise BenchError(f"--attach {url!r} is not a URL: {exc}", code=2) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchError(
            f"--attach {url!r} is not the http://HOST:PORT of a fleet's health port "
            "(e.g. http://127.0.0.1:8081)", code=2,
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise BenchError(
            f"--attach {url!r}: give the fleet's health URL without a path "
            "(e.g. http://127.0.0.1:8081)", code=2,
        )
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")
