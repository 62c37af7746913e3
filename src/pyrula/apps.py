"""Loading a user's app: the ``--app`` modules and the ``--workflow MODULE:FUNCTION`` targets.

One loader for ``pyrula worker``, ``pyrula dev``, the fleet's fork server and its children,
so a mistake reads the same wherever it is made. What it refuses is an ``AppError``: a
``ConfigurationError`` (exit 2) whose first line names the flag and what was expected and,
when the app's own code raised at import, the app's frames after it — never pyrula's or the
import machinery's, which say nothing about the app.

It looks at ``__pyrula_workflow__`` / ``__pyrula_step__`` by name and imports nothing of the
engine itself, so the fork server can use it before it forks a child.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from pyrula.errors import ConfigurationError

_PYRULA_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_IMPORTLIB_INIT = os.path.join("importlib", "__init__.py")


class AppError(ConfigurationError):
    """The app cannot be loaded as named. ``str()`` is the one-line reason; ``frames`` the
    app's own traceback lines and exception (empty when no app code ran)."""

    def __init__(self, message: str, frames: str = "") -> None:
        super().__init__(message)
        self.frames = frames

    def render(self) -> str:
        """What a command prints: ``error: <reason>``, then the app's frames if any."""
        return f"error: {self}" + (f"\n{self.frames}" if self.frames else "")


def importable_from(directory: str) -> None:
    """Make ``directory`` (the current one, for the CLI) importable, as ``python -m`` does."""
    if directory not in sys.path:
        sys.path.insert(0, directory)


def load(apps: Sequence[str], workflows: Sequence[str]) -> list[Any] | None:
    """Import every ``--app`` module and resolve every ``--workflow``; return the workflow
    functions (None: none named, serve every registered one). Raises AppError."""
    for app in apps:
        import_module("--app", app, app)
    if not workflows:
        _some_workflow_registered(apps)
        return None
    return [workflow_target(target) for target in workflows]


def _some_workflow_registered(apps: Sequence[str]) -> None:
    """Serving every registered workflow needs one (or a ``@projection`` to fold): an
    ``--app`` that defines neither is the wrong module (said here, before a worker or a
    fleet's children start on nothing)."""
    registry = sys.modules.get("pyrula.workflows.definition")
    projections = sys.modules.get("pyrula.workflows.projections")
    if projections is not None and projections.PROJECTIONS.all():
        return  # a worker that only folds projections
    if apps and (registry is None or not registry.REGISTRY.workflows()):
        raise AppError(f"--app {' '.join(apps)}: no @workflow is registered by importing "
                       f"{'it' if len(apps) == 1 else 'them'}; name the module that "
                       "defines your workflows")


def workflow_target(target: str) -> Any:
    """The @workflow function ``MODULE:FUNCTION`` names."""
    flag = f"--workflow {target}"
    module_name, colon, attr = target.partition(":")
    if not colon or not module_name or not attr:
        raise AppError(f"{flag}: expected MODULE:FUNCTION naming a @workflow")
    module = import_module("--workflow", target, module_name)
    try:
        found = getattr(module, attr)
    except AttributeError:
        raise AppError(f"{flag}: module {module_name!r} has no attribute {attr!r}") from None
    if getattr(found, "__pyrula_workflow__", None) is not None:
        return found
    if getattr(found, "__pyrula_step__", None) is not None:
        raise AppError(f"{flag} is a @step, not a @workflow")
    raise AppError(f"{flag} is not a @workflow (a function decorated with @workflow)")


def import_module(flag: str, target: str, module_name: str) -> Any:
    """Import ``module_name`` for ``flag target``; AppError if it is missing or its code
    raises."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and _is_prefix(exc.name, module_name):
            raise AppError(
                f"{flag} {target}: no module named {exc.name!r} (run from the directory "
                f"that holds it, now {os.getcwd()}, or install it)"
            ) from None
        raise _raised(flag, target, exc) from None
    except Exception as exc:  # the app's own code raised at import
        raise _raised(flag, target, exc) from None


def _is_prefix(missing: str, module_name: str) -> bool:
    """Whether ``missing`` is ``module_name`` or one of its parent packages (the module
    asked for is not there), rather than something its code imports."""
    return module_name == missing or module_name.startswith(missing + ".")


def _raised(flag: str, target: str, exc: BaseException) -> AppError:
    frames = app_frames(exc.__traceback__)
    where = _location(exc, frames)
    summary = f"{type(exc).__name__}: {exc}"
    lines = [*traceback.format_list(frames), *traceback.format_exception_only(exc)]
    return AppError(f"{flag} {target} raised at import: {where}{summary}",
                    "".join(lines).rstrip("\n"))


def app_frames(tb: TracebackType | None) -> traceback.StackSummary:
    """The frames of ``tb`` that belong to the app: pyrula's own and the import
    machinery's left out."""
    return traceback.StackSummary.from_list([
        frame for frame in traceback.extract_tb(tb)
        if not frame.filename.startswith("<frozen importlib")
        and not frame.filename.endswith(_IMPORTLIB_INIT)
        and not os.path.abspath(frame.filename).startswith(_PYRULA_DIR)
    ])


def _location(exc: BaseException, frames: traceback.StackSummary) -> str:
    """``file:line: `` of the error: the innermost app frame, or where a SyntaxError is."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{_shown(exc.filename)}:{exc.lineno}: "
    if frames:
        return f"{_shown(frames[-1].filename)}:{frames[-1].lineno}: "
    return ""


def _shown(path: str) -> str:
    """``path`` relative to the current directory when it is under it."""
    absolute = os.path.abspath(path)
    cwd = os.getcwd() + os.sep
    return absolute[len(cwd):] if absolute.startswith(cwd) else absolute
