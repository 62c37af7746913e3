"""A randomised fault schedule, drawn from a seed: which store the load runs on, how big
the fleet and its runs are (and whether a standalone worker runs beside it), and which
faults strike when, whom, and for how long.

The processes the schedule is applied to are real, so timing is not deterministic, but
everything the schedule says is: the same seed draws the same schedule (one
``random.Random(seed)``, consumed in one fixed order), and :meth:`Schedule.text` prints it,
so a failing seed can be read, and run again with ``make fuzz SEED=<seed>``.

Faults are applied one after the other, each undone (a stopped child continued, a store or
a fleet started again) before the next one strikes, so "what happens in which order" is
the seed's alone. Pure: nothing here starts or signals a process
(``tests/chaos/nemesis.py`` does).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SQLITE, VALKEY, CLUSTER = "sqlite", "valkey", "cluster"
STORES = (SQLITE, VALKEY, CLUSTER)

#: SIGKILL of one child of the fleet (the supervisor replaces it and recovers its runs).
KILL = "kill -9"
#: SIGSTOP of one child, SIGCONT after ``lasts`` seconds: within the lock TTL it only
#: stalls; past it the others reclaim its runs and its late writes are refused; past the
#: child timeout the supervisor kills it.
STOP = "SIGSTOP"
#: SIGTERM of one child: it drains on its own and the supervisor replaces it.
TERM = "SIGTERM"
#: SIGKILL of the standalone ``pyrula worker`` beside the fleet (no supervisor recovers
#: its runs: the others' orphan scans take them once their locks lapse), started again
#: after ``lasts`` seconds.
WORKER_KILL = "worker kill -9"
#: SIGKILL of the fleet's whole process group (a host lost), started again after ``lasts``
#: seconds: the new fleet reclaims the dead one's runs once their locks lapse.
CRASH = "fleet kill -9"
#: SIGKILL of the Valkey server, started again on its port and data directory (an
#: append-only file written with ``appendfsync always``) after ``lasts`` seconds.
STORE_KILL = "valkey kill -9"
#: ``CLUSTER FAILOVER`` on one replica (the ``target``-th, mod the replicas there are).
FAILOVER = "CLUSTER FAILOVER"
#: Another process holds the SQLite file's write lock (``BEGIN IMMEDIATE``, as a backup or
#: an operator's shell would) for ``lasts`` seconds: every writer waits, past the lock TTL.
STORE_LOCK = "sqlite locked"

#: The faults a fleet can be dealt on every store, and their weights.
FLEET_FAULTS = {KILL: 4, STOP: 2, TERM: 2, CRASH: 1}
#: The faults of each store's own. A SQLite store has no server to lose: its file locked by
#: another process is its outage, and the fleet crash (every writer killed mid-transaction)
#: its restart.
STORE_FAULTS: dict[str, dict[str, int]] = {SQLITE: {STORE_LOCK: 2}, VALKEY: {STORE_KILL: 2},
                                           CLUSTER: {FAILOVER: 2}}
#: The faults of a schedule with a standalone worker, and their weights.
WORKER_FAULTS = {WORKER_KILL: 2}
#: Faults that hit one child of the fleet: ``target`` is its slot.
CHILD_FAULTS = frozenset({KILL, STOP, TERM})
#: Faults undone ``lasts`` seconds after they struck (0: at once).
UNDONE = frozenset({STOP, CRASH, STORE_KILL, STORE_LOCK, WORKER_KILL})

#: The fleet's timings the durations are drawn around (``tests/chaos/nemesis.py`` starts
#: its fleets with them).
LOCK_TTL = 2.0
CHILD_TIMEOUT = 3.0


@dataclass(frozen=True, slots=True)
class Planned:
    """One fault of a schedule."""

    #: seconds after the load began (at the earliest: the fault before it is undone first,
    #: and a child fault waits for its child to be ready)
    at: float
    kind: str
    #: the slot of the child a child fault hits; the replica a failover promotes
    target: int
    #: seconds until it is undone (a stop, a store or fleet down: ``UNDONE``; 0: at once)
    lasts: float
    #: runs submitted when the fault is due, just before it strikes: it strikes a busy fleet
    runs: int

    def line(self) -> str:
        whom = (f" slot {self.target}" if self.kind in CHILD_FAULTS
                else f" replica {self.target}" if self.kind == FAILOVER else "")
        lasting = f" for {self.lasts:.2f} s" if self.kind in UNDONE else ""
        return f"t+{self.at:5.2f} s  {self.runs} runs, then {self.kind}{whom}{lasting}"


@dataclass(frozen=True, slots=True)
class Schedule:
    seed: int
    store: str
    children: int
    #: standalone ``pyrula worker`` processes beside the fleet (0 or 1)
    workers: int
    #: the bench workflow's load: ``steps`` steps of ``kind`` ("async"/"sync"), each
    #: holding ``hold`` seconds
    steps: int
    hold: float
    kind: str
    #: runs submitted before the first fault
    runs: int
    faults: tuple[Planned, ...]

    @property
    def total_runs(self) -> int:
        return self.runs + sum(f.runs for f in self.faults)

    def count(self, kind: str) -> int:
        return sum(1 for f in self.faults if f.kind == kind)

    def replay(self) -> str:
        """The command that runs this schedule again."""
        return f"make fuzz SEED={self.seed}"

    def text(self) -> str:
        beside = f" and {self.workers} worker" if self.workers else ""
        head = (f"fault schedule seed={self.seed}: {self.store} store, {self.children} "
                f"children{beside}, {self.runs} runs of {self.steps} {self.kind} steps holding "
                f"{self.hold:.2f} s, {len(self.faults)} faults (replay: {self.replay()})")
        return "\n".join([head, *("  " + f.line() for f in self.faults)])


def draw(seed: int) -> Schedule:
    """The schedule of ``seed``."""
    rng = random.Random(seed)
    store = rng.choice(STORES)
    children = rng.choice((2, 3))
    workers = rng.choice((0, 1))
    steps = rng.randint(2, 4)
    hold = round(rng.uniform(0.02, 0.15), 3)
    kind = rng.choice(("async", "sync"))
    runs = rng.randrange(100, 301, 10)
    kinds = {**FLEET_FAULTS, **STORE_FAULTS[store], **(WORKER_FAULTS if workers else {})}
    names, weights = list(kinds), list(kinds.values())
    faults = []
    at = rng.uniform(0.5, 1.5)
    for _ in range(rng.randint(3, 6)):
        fault = rng.choices(names, weights)[0]
        planned = Planned(round(at, 2), fault, _target(rng, fault, children),
                          _lasts(rng, fault), rng.randrange(20, 101, 10))
        faults.append(planned)
        at += planned.lasts + rng.uniform(0.3, 2.0)
    return Schedule(seed, store, children, workers, steps, hold, kind, runs, tuple(faults))


def _target(rng: random.Random, fault: str, children: int) -> int:
    if fault in CHILD_FAULTS:
        return rng.randrange(children)
    if fault == FAILOVER:
        return rng.randrange(3)  # the cluster's replicas: one per primary
    return 0


def _lasts(rng: random.Random, fault: str) -> float:
    if fault == STOP:
        # A third each: a stall within the lock TTL, a stop past it that the others
        # reclaim from, a stop past the child timeout that the supervisor ends.
        low, high = rng.choice(((0.3, LOCK_TTL - 0.5), (LOCK_TTL + 0.5, CHILD_TIMEOUT - 0.3),
                                (CHILD_TIMEOUT + 0.5, CHILD_TIMEOUT + 2.0)))
        return round(rng.uniform(low, high), 2)
    if fault == STORE_KILL:
        # Started again at once (as the other Valkey scenarios do), or down a while.
        return 0.0 if rng.random() < 0.5 else round(rng.uniform(0.5, 3.0), 2)
    if fault in (CRASH, WORKER_KILL):
        return round(rng.uniform(0.0, 2.0), 2)
    if fault == STORE_LOCK:
        return round(rng.uniform(0.5, 2 * LOCK_TTL), 2)
    return 0.0
