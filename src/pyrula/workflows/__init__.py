"""The public API of pyrula's workflow engine. Re-exports only.

The names load lazily (a module ``__getattr__``): importing one submodule, say
``pyrula.workflows.records`` from the supervisor, must not load the engine, the worker or
every store backend as a side effect of this package's ``__init__``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyrula.workflows.children import ChildHandle
    from pyrula.workflows.client import SyncWorkflowClient, WorkflowClient
    from pyrula.workflows.context import WorkflowContext
    from pyrula.workflows.definition import StepInfo, step, step_info, workflow
    from pyrula.workflows.errors import (
        ArchiveSchemaMismatch,
        ChildFailed,
        ConfigurationError,
        NonDeterminismError,
        PayloadTooLarge,
        ProjectionNotFound,
        QueryFailed,
        RunCancelled,
        RunFailed,
        RunNotActive,
        StaleToken,
        StepFailed,
        StoreUnavailable,
        UpdateFailed,
        WorkflowNotFound,
    )
    from pyrula.workflows.inline import InlineWorkflowRunner
    from pyrula.workflows.limits import Limit, Rate
    from pyrula.workflows.projections import projection
    from pyrula.workflows.records import RunHandle, RunInfo, RunStatus
    from pyrula.workflows.stores import store_from_url
    from pyrula.workflows.stores.archive import (
        ArchivingStore,
        PostgresArchive,
        make_archiving_postgres,
    )
    from pyrula.workflows.stores.memory import MemoryStore
    from pyrula.workflows.stores.sqlite import SQLiteStore
    from pyrula.workflows.stores.valkey import ValkeyStore
    from pyrula.workflows.triggers import BatchTrigger
    from pyrula.workflows.worker import WorkerOptions, WorkflowWorker

#: Each public name and the module it comes from.
_SOURCES = {
    "ArchiveSchemaMismatch": "pyrula.workflows.errors",
    "ArchivingStore": "pyrula.workflows.stores.archive",
    "BatchTrigger": "pyrula.workflows.triggers",
    "ChildFailed": "pyrula.workflows.errors",
    "ChildHandle": "pyrula.workflows.children",
    "ConfigurationError": "pyrula.workflows.errors",
    "InlineWorkflowRunner": "pyrula.workflows.inline",
    "Limit": "pyrula.workflows.limits",
    "MemoryStore": "pyrula.workflows.stores.memory",
    "NonDeterminismError": "pyrula.workflows.errors",
    "PayloadTooLarge": "pyrula.workflows.errors",
    "PostgresArchive": "pyrula.workflows.stores.archive",
    "ProjectionNotFound": "pyrula.workflows.errors",
    "QueryFailed": "pyrula.workflows.errors",
    "Rate": "pyrula.workflows.limits",
    "RunCancelled": "pyrula.workflows.errors",
    "RunFailed": "pyrula.workflows.errors",
    "RunHandle": "pyrula.workflows.records",
    "RunInfo": "pyrula.workflows.records",
    "RunNotActive": "pyrula.workflows.errors",
    "RunStatus": "pyrula.workflows.records",
    "SQLiteStore": "pyrula.workflows.stores.sqlite",
    "StaleToken": "pyrula.workflows.errors",
    "StepFailed": "pyrula.workflows.errors",
    "StepInfo": "pyrula.workflows.definition",
    "StoreUnavailable": "pyrula.workflows.errors",
    "SyncWorkflowClient": "pyrula.workflows.client",
    "UpdateFailed": "pyrula.workflows.errors",
    "WorkflowClient": "pyrula.workflows.client",
    "WorkflowContext": "pyrula.workflows.context",
    "ValkeyStore": "pyrula.workflows.stores.valkey",
    "WorkerOptions": "pyrula.workflows.worker",
    "WorkflowNotFound": "pyrula.workflows.errors",
    "WorkflowWorker": "pyrula.workflows.worker",
    "make_archiving_postgres": "pyrula.workflows.stores.archive",
    "projection": "pyrula.workflows.projections",
    "step": "pyrula.workflows.definition",
    "step_info": "pyrula.workflows.definition",
    "store_from_url": "pyrula.workflows.stores",
    "workflow": "pyrula.workflows.definition",
}

# A literal list, so that mypy and IDEs read the exports; a unit test keeps it equal to
# the table's keys.
__all__ = [
    "ArchiveSchemaMismatch",
    "ArchivingStore",
    "BatchTrigger",
    "ChildFailed",
    "ChildHandle",
    "ConfigurationError",
    "InlineWorkflowRunner",
    "Limit",
    "MemoryStore",
    "NonDeterminismError",
    "PayloadTooLarge",
    "PostgresArchive",
    "ProjectionNotFound",
    "QueryFailed",
    "Rate",
    "RunCancelled",
    "RunFailed",
    "RunHandle",
    "RunInfo",
    "RunNotActive",
    "RunStatus",
    "SQLiteStore",
    "StaleToken",
    "StepFailed",
    "StepInfo",
    "StoreUnavailable",
    "SyncWorkflowClient",
    "UpdateFailed",
    "WorkflowClient",
    "WorkflowContext",
    "ValkeyStore",
    "WorkerOptions",
    "WorkflowNotFound",
    "WorkflowWorker",
    "make_archiving_postgres",
    "projection",
    "step",
    "step_info",
    "store_from_url",
    "workflow",
]


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
