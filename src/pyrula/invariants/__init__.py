"""What the chaos suite and ``pyrula-fleet bench --verify`` check after a load under faults:
a ledger the steps write (what really ran) and a checker over it and the journals."""

from pyrula.invariants.checker import (
    Fails,
    Report,
    check,
    collect_journals,
    count_stale_refusals,
)
from pyrula.invariants.ledger import Execution, Ledger, read_ledger

__all__ = [
    "Execution",
    "Fails",
    "Ledger",
    "Report",
    "check",
    "collect_journals",
    "count_stale_refusals",
    "read_ledger",
]
