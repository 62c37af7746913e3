"""The build: a fingerprint of the workflow code a worker serves.

Every ``run:started`` records the build of the worker that claimed it, so a deploy can
tell which code a run started on, and runs started on one build can be kept on it while
another takes new runs. The build is ``PYRULA_BUILD_ID`` where that is set (a release
tag, a commit: the deploy pins it), else a hash over the code itself: the source of every
workflow and step function served, sorted by name, so the same code gives the same build
in every process and any edit to one of them gives another.

The source is what ``inspect.getsource`` reads, where it can (a function's decorator
lines included, so ``retries=`` or ``timeout=`` are part of it); a function without
source (defined in ``exec``, a REPL) is fingerprinted by its compiled code instead
(bytecode, constants and the names it uses, nested functions included). The text of each
function is read once per process and kept with it: the build describes the code loaded,
even if its file changes on disk later. A fleet's fork server reads them as soon as it has
loaded the app (:func:`read_texts`), so its children inherit the texts of the code they
run instead of each reading (and tokenizing) every source file again on its way to its
first run. A process whose modules were imported long before its functions are
fingerprinted, with the files changed meanwhile, should pin ``PYRULA_BUILD_ID``.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import types
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from pyrula.errors import ConfigurationError
from pyrula.workflows.definition import Registry, StepSpec, WorkflowSpec

logger = logging.getLogger(__name__)

#: The variable that pins the build (wins over the fingerprint).
BUILD_ENV = "PYRULA_BUILD_ID"
#: Hex digits of the sha256 kept as the fingerprint.
DIGITS = 12
#: The longest pinned build accepted (it is written into every run:started).
MAX_PINNED = 128

# function -> the text its fingerprint hashes, read once (see the module's docstring).
_TEXTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def build_id(
    specs: Iterable[WorkflowSpec | StepSpec], environ: Mapping[str, str] | None = None
) -> str:
    """``PYRULA_BUILD_ID`` if set (and not blank), else :func:`fingerprint` of ``specs``."""
    env = os.environ if environ is None else environ
    pinned = env.get(BUILD_ENV, "").strip()
    if pinned:
        return check_pinned(pinned, BUILD_ENV)
    return fingerprint(specs)


def serving_build(
    workflows: Iterable[WorkflowSpec], registry: Registry, given: str | None = None
) -> str:
    """The build of a worker serving ``workflows``: ``given`` (code's ``build=``) if not
    None, else :func:`build_id` of those workflows and of every step in ``registry`` (a
    step is not tied to the workflows that call it)."""
    if given is not None:
        return check_pinned(given, "build")
    return build_id([*workflows, *registry.steps().values()])


def check_pinned(value: str, what: str) -> str:
    """A pinned build as given, or ConfigurationError saying what is wrong with it."""
    if len(value) > MAX_PINNED or not value.isprintable() or any(c.isspace() for c in value):
        raise ConfigurationError(
            f"{what} must be at most {MAX_PINNED} printable characters without spaces, "
            f"got {value!r}"
        )
    return value


def fingerprint(specs: Iterable[WorkflowSpec | StepSpec]) -> str:
    """sha256 (first DIGITS hex digits) over each workflow's and step's name, options and
    code text, in name order: workflows and steps apart, so neither hides the other."""
    entries = sorted(_entry(spec) for spec in specs)
    digest = hashlib.sha256()
    for kind, name, options, text in entries:
        for part in (kind, name, options, text):
            digest.update(part.encode("utf-8", "surrogatepass"))
            digest.update(b"\0")
    return digest.hexdigest()[:DIGITS]


def _entry(spec: WorkflowSpec | StepSpec) -> tuple[str, str, str, str]:
    if isinstance(spec, StepSpec):
        options = (f"timeout={spec.timeout!r} retries={spec.retries!r} "
                   f"backoff={spec.retry_backoff!r} backoff_max={spec.retry_backoff_max!r}")
        return "step", spec.name, options, code_text(spec.fn)
    return "workflow", spec.name, f"timeout={spec.timeout!r}", code_text(spec.fn)


def read_texts(registry: Registry) -> None:
    """Read now the text of every workflow and step ``registry`` holds (kept per function:
    see the module's docstring)."""
    specs: list[WorkflowSpec | StepSpec] = [*registry.workflows().values(),
                                            *registry.steps().values()]
    for spec in specs:
        code_text(spec.fn)


def code_text(fn: Any) -> str:
    """The text a function's fingerprint hashes: its source, else its compiled code."""
    try:
        return _TEXTS[fn]
    except (KeyError, TypeError):  # TypeError: not weak-referenceable (a partial...)
        pass
    text = _read(fn)
    try:
        _TEXTS[fn] = text
    except TypeError:
        pass
    return text


def _read(fn: Any) -> str:
    target = inspect.unwrap(fn) if callable(fn) else fn
    try:
        return "source:" + inspect.getsource(target)
    except (OSError, TypeError):  # no file (exec, a REPL), or not a function at all
        pass
    code = getattr(target, "__code__", None)
    if isinstance(code, types.CodeType):
        return "code:" + _code(code)
    kind = type(target)
    return f"object:{kind.__module__}.{kind.__qualname__}:{getattr(target, '__qualname__', '')}"


def _code(code: types.CodeType) -> str:
    """Compiled code as stable text: bytecode, names and constants, nested code objects
    spelt the same way (their repr would carry a memory address), sets in sorted order."""
    consts = [_const(c) for c in code.co_consts]
    return "|".join([code.co_code.hex(), ",".join(code.co_names), ",".join(code.co_varnames),
                     "(" + ";".join(consts) + ")"])


def _const(value: Any) -> str:
    if isinstance(value, types.CodeType):
        return _code(value)
    if isinstance(value, frozenset):  # ``x in {...}``: its order varies with the hash seed
        return "frozenset(" + ",".join(sorted(_const(v) for v in value)) + ")"
    if isinstance(value, tuple):
        return "(" + ",".join(_const(v) for v in value) + ")"
    return repr(value)
