"""``@workflow`` and ``@step``, and the registry a worker snapshots.

A ``@step`` called inside a running workflow is journaled: its call returns an awaitable
that the engine resolves from the journal (replay) or by running the function (and
recording the result). Called anywhere else it is the plain function, so it can be unit
tested directly.
"""

from __future__ import annotations

import functools
import inspect
import threading
import unicodedata
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, overload

if TYPE_CHECKING:
    from pyrula.workflows.context import WorkflowContext
    from pyrula.workflows.limits import Limit, LimitKeys, Rate, WorkflowLimits
    from pyrula.workflows.triggers import BatchTrigger

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R")


class StepCaller(Protocol):
    """What the engine offers a ``@step`` wrapper called inside a workflow."""

    def call_step(self, spec: StepSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ...


#: The engine of the workflow whose code is running in this task, if any.
current_engine: ContextVar[StepCaller | None] = ContextVar("pyrula_current_engine", default=None)


@dataclass(frozen=True, slots=True)
class StepInfo:
    """Which execution of which journaled step is running (see :func:`step_info`).

    ``(run_id, call)`` names the step itself and is the same on every attempt that runs
    it, so a service the step calls can use it to drop a duplicate: the one key to hand
    downstream. ``attempt`` (the run's attempt, its fencing token) and ``step_attempt``
    (1 for the first try of the step, more on its retries) say which execution this is.
    """

    run_id: str
    workflow: str
    step: str
    call: int
    attempt: int
    step_attempt: int

    @property
    def idempotency_key(self) -> str:
        """``<run_id>:<call>``, stable across attempts and retries of this step."""
        return f"{self.run_id}:{self.call}"


current_step: ContextVar[StepInfo | None] = ContextVar("pyrulacurrent_step", default=None)


def step_info() -> StepInfo | None:
    """The step executing in this task or thread, or None outside a journaled step (a
    step function called directly, in a unit test say)."""
    return current_step.get()


@dataclass(frozen=True, slots=True)
class StepSpec:
    name: str
    fn: Callable[..., Any]
    is_async: bool
    timeout: float | None = None
    retries: int = 0
    retry_backoff: float = 1.0
    retry_backoff_max: float = 60.0

    def backoff(self, retry: int) -> float:
        """Nominal delay in seconds before retry number ``retry`` (1-based), before jitter."""
        if self.retry_backoff <= 0:
            return 0.0
        return float(min(self.retry_backoff * 2 ** (retry - 1), self.retry_backoff_max))


@dataclass(frozen=True, slots=True)
class WorkflowSpec:
    name: str
    fn: Callable[..., Awaitable[Any]]
    timeout: float | None = None
    #: Starts a run per batch of a topic's events (a ``BatchTrigger``), or None.
    trigger: BatchTrigger | None = None
    #: At most ``max`` runs per key at once (``pyrula.workflows.limits``), or None.
    concurrency: Limit | None = None
    #: At most ``per_second`` starts per key, or None.
    rate: Rate | None = None

    @property
    def limits(self) -> WorkflowLimits | None:
        """What a store enforces for this workflow; None when it has no limit."""
        from pyrula.workflows.limits import limits_of

        return limits_of(self.concurrency, self.rate)

    def limit_keys(self, params: Any) -> LimitKeys | None:
        """The keys of a run with ``params`` (None without limits); LimitKeyFailed if a
        key function fails."""
        from pyrula.workflows.limits import compute_keys

        if self.concurrency is None and self.rate is None:
            return None
        return compute_keys(self.name, self.concurrency, self.rate, params)


class Registry:
    """Names to definitions. Registering a name again replaces it (the last import wins)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workflows: dict[str, WorkflowSpec] = {}
        self._steps: dict[str, StepSpec] = {}

    def add_workflow(self, spec: WorkflowSpec) -> None:
        with self._lock:
            self._workflows[spec.name] = spec

    def add_step(self, spec: StepSpec) -> None:
        with self._lock:
            self._steps[spec.name] = spec

    def workflow(self, name: str) -> WorkflowSpec:
        try:
            return self._workflows[name]
        except KeyError:
            from pyrula.workflows.errors import WorkflowNotFound

            raise WorkflowNotFound(f"no workflow registered under the name {name!r}") from None

    def find(self, name: str) -> WorkflowSpec | None:
        """The definition registered under ``name``, or None (one dict read: no copy)."""
        return self._workflows.get(name)

    def workflows(self) -> dict[str, WorkflowSpec]:
        with self._lock:
            return dict(self._workflows)

    def steps(self) -> dict[str, StepSpec]:
        with self._lock:
            return dict(self._steps)


REGISTRY = Registry()


def _check_positive(what: str, value: float | None, *, allow_zero: bool = True) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{what} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


class _StepDecorator(Protocol):
    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> Callable[P, Coroutine[Any, Any, R]]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> Callable[P, Any]: ...


@overload
def step(
    fn: Callable[P, Coroutine[Any, Any, R]], /
) -> Callable[P, Coroutine[Any, Any, R]]: ...


@overload
def step(fn: Callable[P, R], /) -> Callable[P, Any]: ...


@overload
def step(
    *,
    name: str | None = None,
    timeout: float | None = None,
    retries: int = 0,
    retry_backoff: float = 1.0,
    retry_backoff_max: float = 60.0,
) -> _StepDecorator: ...


def step(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    timeout: float | None = None,
    retries: int = 0,
    retry_backoff: float = 1.0,
    retry_backoff_max: float = 60.0,
) -> Any:
    """Declare a journaled step: ``@step`` or ``@step(timeout=30, retries=3, retry_backoff=1.0)``.

    Inside a workflow, calling a step (sync or async) returns an awaitable; anywhere else
    it is the plain function. A sync step is typed as returning ``Any`` for that reason.

    ``retries=N`` allows N more attempts after the first; the delay before retry k is
    ``retry_backoff * 2**(k-1)`` seconds, capped at ``retry_backoff_max``, with jitter.
    """
    _check_positive("timeout", timeout, allow_zero=False)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, got {retries!r}")
    _check_positive("retry_backoff", retry_backoff)
    _check_positive("retry_backoff_max", retry_backoff_max)

    def decorate(func: F) -> F:
        if not callable(func):
            raise TypeError(f"@step needs a function, got {type(func).__name__}")
        spec = StepSpec(
            name=name or func.__qualname__,
            fn=func,
            is_async=inspect.iscoroutinefunction(func),
            timeout=float(timeout) if timeout is not None else None,
            retries=retries,
            retry_backoff=float(retry_backoff),
            retry_backoff_max=float(retry_backoff_max),
        )
        REGISTRY.add_step(spec)
        return _step_wrapper(func, spec)  # type: ignore[return-value]

    if fn is not None:
        return decorate(fn)
    return decorate


def _step_wrapper(func: Callable[..., Any], spec: StepSpec) -> Callable[..., Any]:
    """What ``@step`` returns, for a sync or an async ``func`` alike: inside a workflow a
    call is the engine's (an awaitable), anywhere else the plain function's."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        engine = current_engine.get()
        if engine is None:
            return func(*args, **kwargs)
        return engine.call_step(spec, args, kwargs)

    wrapper.__pyrula_step__ = spec  # type: ignore[attr-defined]
    return wrapper


WorkflowFn = Callable[["WorkflowContext", Any], Awaitable[Any]]


@overload
def workflow(fn: F, /) -> F: ...


@overload
def workflow(
    *, name: str | None = None, timeout: float | None = None,
    trigger: BatchTrigger | None = None, concurrency: Limit | None = None,
    rate: Rate | None = None,
) -> Callable[[F], F]: ...


def workflow(
    fn: F | None = None, /, *, name: str | None = None, timeout: float | None = None,
    trigger: BatchTrigger | None = None, concurrency: Limit | None = None,
    rate: Rate | None = None,
) -> F | Callable[[F], F]:
    """Declare a workflow: ``async def wf(ctx: WorkflowContext, params) -> result``.

    ``name`` defaults to the function's ``__name__``; ``timeout`` (seconds) bounds the
    whole run from its first start, sleeps and waits included. ``trigger`` (a
    ``BatchTrigger``) starts a run per batch of a topic's events (docs/triggers.md).
    ``concurrency`` (a ``Limit``) and ``rate`` (a ``Rate``) bound how many runs per key
    run at once and start per second (``pyrula.workflows.limits``).
    """
    _check_positive("timeout", timeout, allow_zero=False)
    _check_trigger(trigger)
    _check_limits(concurrency, rate)

    def decorate(func: F) -> F:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(
                f"@workflow needs an async function (async def {getattr(func, '__name__', func)}"
                "(ctx, params)); steps may be sync"
            )
        spec = WorkflowSpec(
            name=check_workflow_name(func.__name__ if name is None else name),
            fn=func,
            timeout=float(timeout) if timeout is not None else None,
            trigger=trigger,
            concurrency=concurrency,
            rate=rate,
        )
        REGISTRY.add_workflow(spec)
        func.__pyrula_workflow__ = spec  # type: ignore[attr-defined]
        return func

    if fn is not None:
        return decorate(fn)
    return decorate


def _check_limits(concurrency: Any, rate: Any) -> None:
    from pyrula.workflows.limits import Limit, Rate

    if concurrency is not None and not isinstance(concurrency, Limit):
        raise TypeError(
            f"concurrency must be a Limit(key=..., max=...) or None, got "
            f"{type(concurrency).__name__}"
        )
    if rate is not None and not isinstance(rate, Rate):
        raise TypeError(
            f"rate must be a Rate(key=..., per_second=...) or None, got {type(rate).__name__}"
        )


def _check_trigger(trigger: Any) -> None:
    from pyrula.workflows.triggers import BatchTrigger

    if trigger is not None and not isinstance(trigger, BatchTrigger):
        raise TypeError(f"trigger must be a BatchTrigger or None, got {type(trigger).__name__}")


#: The longest workflow name, in characters.
MAX_NAME_LENGTH = 200


def check_workflow_name(name: Any) -> str:
    """``name`` if it may name a workflow, else ValueError saying why: a str of 1 to
    MAX_NAME_LENGTH characters, any of them but control characters (a newline, a tab, NUL)
    and lone surrogates (which no UTF-8 store can hold)."""
    return check_name("workflow name", name, MAX_NAME_LENGTH)


def check_name(what: str, name: Any, longest: int) -> str:
    """``name`` if it may be a ``what`` (a workflow name, a topic): a str of 1 to
    ``longest`` characters, none a control character or a lone surrogate; else ValueError
    naming ``what`` and saying why."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {what} must be a non-empty str, got {name!r}")
    if len(name) > longest:
        raise ValueError(f"{what} {name[:40]!r}... is {len(name)} characters, above "
                         f"the limit of {longest}")
    for char in name:
        if unicodedata.category(char) in ("Cc", "Cs"):
            raise ValueError(f"{what} {name!r} holds the character {char!r}: control "
                             "characters and lone surrogates are not allowed in names")
    return name


def unknown_name(name: str, served: Sequence[str]) -> str | None:
    """Why ``name`` looks mistyped, or None: ``served`` (the names workers of the store
    have ever served) is known and does not hold it. Names the closest served ones."""
    if not served or name in served:
        return None
    import difflib  # only for this message: off a start's path

    close = difflib.get_close_matches(name, list(served), n=3, cutoff=0.6)
    hint = (f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else
            f"; workers have served {', '.join(repr(s) for s in list(served)[:10])}"
            + (" ..." if len(served) > 10 else ""))
    return f"no worker of this store has ever served workflow {name!r}{hint}"


def workflow_name(fn_or_name: Any) -> str:
    """The registered name of a ``@workflow`` function, or the string itself (checked by
    ``check_workflow_name``)."""
    if isinstance(fn_or_name, str):
        return check_workflow_name(fn_or_name)
    spec = getattr(fn_or_name, "__pyrula_workflow__", None)
    if isinstance(spec, WorkflowSpec):
        return spec.name
    raise TypeError(f"{fn_or_name!r} is not a @workflow function or a workflow name")
