"""Schedules: submit a workflow on a cron expression (IANA time zone) or a fixed interval.

``Schedule`` is pure (no I/O); stores keep schedules (``store.schedule_create`` ...), the
worker's schedule loop fires them, and ``control`` pauses, resumes and triggers them.
"""

from pyrula.errors import ScheduleNotFound
from pyrula.workflows.schedules.cron import CronError
from pyrula.workflows.schedules.schedule import OVERLAP_POLICIES, Schedule, idempotency_key

__all__ = ["OVERLAP_POLICIES", "CronError", "Schedule", "ScheduleNotFound", "idempotency_key"]
