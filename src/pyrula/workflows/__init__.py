"""The public API of pyrula's workflow engine. Re-exports only."""

from pyrula.workflows.client import SyncWorkflowClient, WorkflowClient
from pyrula.workflows.context import WorkflowContext
from pyrula.workflows.definition import StepInfo, step, step_info, workflow
from pyrula.workflows.errors import (
    ArchiveSchemaMismatch,
    ConfigurationError,
    NonDeterminismError,
    PayloadTooLarge,
    RunCancelled,
    RunFailed,
    RunNotActive,
    StaleToken,
    StepFailed,
    StoreUnavailable,
    WorkflowNotFound,
)
from pyrula.workflows.inline import InlineWorkflowRunner
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
from pyrula.workflows.worker import WorkerOptions, WorkflowWorker

__all__ = [
    "ArchiveSchemaMismatch",
    "ArchivingStore",
    "ConfigurationError",
    "InlineWorkflowRunner",
    "MemoryStore",
    "NonDeterminismError",
    "PayloadTooLarge",
    "PostgresArchive",
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
    "WorkflowClient",
    "WorkflowContext",
    "ValkeyStore",
    "WorkerOptions",
    "WorkflowNotFound",
    "WorkflowWorker",
    "make_archiving_postgres",
    "step",
    "step_info",
    "store_from_url",
    "workflow",
]
