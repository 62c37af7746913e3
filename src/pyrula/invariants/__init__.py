"""What the chaos suite and ``pyrula-fleet bench --verify`` check after a load under faults:
a ledger the steps write (what really ran) and a checker over it and the journals, and an
exactly-once check of what is delivered into runs, projections and collectors."""

from pyrula.invariants.checker import (
    Fails,
    Report,
    check,
    collect_journals,
    count_stale_refusals,
)
from pyrula.invariants.ledger import Execution, Ledger, read_ledger
from pyrula.invariants.membership import Membership, check_once, holdings

__all__ = [
    "Execution",
    "Fails",
    "Ledger",
    "Membership",
    "Report",
    "check",
    "check_once",
    "collect_journals",
    "count_stale_refusals",
    "holdings",
    "read_ledger",
]
