"""Every exception a user of ``pyrula.workflows`` can catch.

They are defined in the leaf module ``pyrula.errors`` (which imports nothing), so the
configuration layer can raise them without importing the engine.
"""

from pyrula.errors import (
    ArchiveSchemaMismatch,
    ChildFailed,
    ConfigurationError,
    ContinueAsNew,
    ControlFlow,
    JournalCorrupt,
    NonDeterminismError,
    PayloadTooLarge,
    ProjectionNotFound,
    PyrulaError,
    QueryFailed,
    RunCancelled,
    RunFailed,
    RunNotActive,
    ScheduleNotFound,
    StaleToken,
    StepFailed,
    StoreUnavailable,
    UpdateFailed,
    WorkflowNotFound,
)

__all__ = [
    "ArchiveSchemaMismatch",
    "ChildFailed",
    "ConfigurationError",
    "ContinueAsNew",
    "ControlFlow",
    "JournalCorrupt",
    "NonDeterminismError",
    "PayloadTooLarge",
    "PyrulaError",
    "QueryFailed",
    "RunCancelled",
    "RunFailed",
    "RunNotActive",
    "ProjectionNotFound",
    "ScheduleNotFound",
    "StaleToken",
    "StepFailed",
    "StoreUnavailable",
    "UpdateFailed",
    "WorkflowNotFound",
]
