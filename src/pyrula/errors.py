"""Every exception a user of pyrula can catch (re-exported by ``pyrula.workflows``).

Engine control flow (continue-as-new, a run standing down) derives from ``BaseException``
so that a workflow's ``except Exception`` cannot swallow it.
"""

from __future__ import annotations

from typing import Any


class PyrulaError(Exception):
    """Base class of pyrula's own errors."""


class ConfigurationError(PyrulaError, ValueError):
    """An option, URL or environment variable has a value pyrula cannot use."""


class StoreUnavailable(PyrulaError):
    """The store could not be reached (connection refused, timed out, gone away)."""


class ArchiveSchemaMismatch(PyrulaError):
    """The Postgres archive schema is missing or from a different baseline."""


class WorkflowNotFound(PyrulaError, LookupError):
    """No run with this id, or no workflow registered under this name."""


class ScheduleNotFound(WorkflowNotFound):
    """No schedule with this id (pause, resume or run_now of an unknown schedule)."""


class ProjectionNotFound(WorkflowNotFound):
    """No projection of this name was ever folded in this store (rebuild of an unknown
    projection)."""


class RunNotActive(PyrulaError, ValueError):
    """A signal, resume or cancel was sent to a run that has already ended."""


class PayloadTooLarge(PyrulaError, ValueError):
    """Params, a step result or a signal payload exceeds ``max_payload_bytes``."""


class JournalCorrupt(PyrulaError):
    """An entry of a run's journal is not an event pyrula wrote (forged, truncated or
    overwritten in the store behind its back). The worker that meets it fails the run
    (``run:error`` code ``corrupt_journal``); readers of the journal get this error.
    """

    def __init__(self, run_id: str, seq: int, reason: str) -> None:
        self.run_id = run_id
        self.seq = seq
        self.reason = reason
        super().__init__(f"run {run_id}: journal entry {seq} {reason}")


class StaleToken(PyrulaError):
    """A write carried a fencing token that is no longer the run's current attempt.

    The store refuses the write inside the same atomic step; the attempt that sent it
    has lost its lock (another worker recovered the run) and must stand down.
    """

    def __init__(self, run_id: str, token: int, current: int | None = None) -> None:
        self.run_id = run_id
        self.token = token
        self.current = current
        super().__init__(
            f"run {run_id}: write with stale fencing token {token}"
            + (f" (current attempt is {current})" if current is not None else "")
        )


class QueryFailed(PyrulaError):
    """``client.query()`` could not answer: the run ended or is unknown to this process's
    registry, it has no query handler of that name, or the handler raised (then
    ``error_type`` and ``message`` are the handler's error)."""

    def __init__(
        self, run_id: str, query: str, message: str, *, error_type: str = "QueryFailed"
    ) -> None:
        self.run_id = run_id
        self.query = query
        self.error_type = error_type
        self.message = message
        super().__init__(f"query {query!r} of run {run_id}: {error_type}: {message}")


class UpdateFailed(PyrulaError):
    """``client.update()`` was refused: the update handler raised (``error_type`` and
    ``message`` are its error), the run has no update handler of that name, or the run
    ended before it applied the update."""

    def __init__(self, run_id: str, update: str, error_type: str, message: str) -> None:
        self.run_id = run_id
        self.update = update
        self.error_type = error_type
        self.message = message
        super().__init__(f"update {update!r} of run {run_id} failed: {error_type}: {message}")


class RunFailed(PyrulaError):
    """``client.result()`` of a run that failed; ``.error`` holds the run's error dict."""

    def __init__(self, run_id: str, error: dict[str, Any]) -> None:
        self.run_id = run_id
        self.error = error
        super().__init__(
            f"run {run_id} failed [{error.get('code')}] "
            f"{error.get('error_type')}: {error.get('message')}"
        )


class RunCancelled(PyrulaError):
    """``client.result()`` of a run that was cancelled."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id} was cancelled")


class StepFailed(PyrulaError):
    """A step failed on its last attempt; raised into the workflow at the step's call.

    ``error_type`` and ``message`` describe the step's own exception; ``traceback`` is its
    traceback (the step's own frames), when the failure happened in this attempt.
    """

    def __init__(self, step: str, error_type: str, message: str, attempts: int,
                 traceback: str | None = None) -> None:
        self.step = step
        self.error_type = error_type
        self.message = message
        self.attempts = attempts
        self.traceback = traceback
        plural = "s" if attempts != 1 else ""
        super().__init__(
            f"step {step!r} failed after {attempts} attempt{plural}: {error_type}: {message}"
        )


class ChildFailed(PyrulaError):
    """A child workflow did not complete; raised into its parent where it is awaited.

    ``run_id`` is the child's run; ``status`` how it ended (``failed`` or ``cancelled``);
    ``error_type`` and ``message`` its error (``RunInfo.error``), ``code`` that error's
    machine-readable cause.
    """

    def __init__(self, run_id: str, name: str, status: str, error_type: str, message: str,
                 code: str | None = None) -> None:
        self.run_id = run_id
        self.name = name
        self.status = status
        self.error_type = error_type
        self.message = message
        self.code = code
        super().__init__(
            f"child workflow {name!r} run {run_id} {status}: {error_type}: {message}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.name, self.status, self.error_type,
                             self.message, self.code))


class NonDeterminismError(PyrulaError):
    """The workflow's code no longer matches the journal recorded for the run."""


class ControlFlow(BaseException):
    """Engine control flow; never raise or catch it in workflow code."""


class ContinueAsNew(ControlFlow):
    """Raised by ``ctx.continue_as_new(params)`` to end the run and queue its successor."""

    def __init__(self, params: Any) -> None:
        self.params = params
        super().__init__("continue_as_new")
