"""What a user needs of an exception raised in their code: its traceback without pyrula's
own frames (nor the event loop's and thread pool's that ran the code), and the frame it
was raised in, ``path:line in function``, for one-line logs."""

from __future__ import annotations

import os
import re
import traceback

import pyrula

#: The longest traceback text kept in a journal (its innermost part).
MAX_TRACEBACK_CHARS = 4000

_PYRULA_DIR = os.path.dirname(os.path.abspath(pyrula.__file__)) + os.sep
_RUNNERS = tuple(os.sep + os.path.join(*p) + os.sep
                 for p in (("asyncio",), ("concurrent", "futures")))
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)', re.M)


def _theirs(frame: traceback.FrameSummary) -> bool:
    name = frame.filename
    return not name.startswith(_PYRULA_DIR) and not any(r in name for r in _RUNNERS)


_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def user_traceback(exc: BaseException) -> str:
    """``exc``'s traceback, chained causes included, with only the frames of code that is
    not pyrula's or the event loop's (all of them where none is left); its innermost
    MAX_TRACEBACK_CHARS characters."""
    chain: list[tuple[traceback.TracebackException, str]] = []
    link: traceback.TracebackException | None = traceback.TracebackException.from_exception(exc)
    joint = ""
    while link is not None:
        chain.append((link, joint))
        if link.__cause__ is not None:
            link, joint = link.__cause__, _CAUSE
        elif link.__context__ is not None and not link.__suppress_context__:
            link, joint = link.__context__, _CONTEXT
        else:
            link = None
    parts: list[str] = []
    for link, joint in reversed(chain):
        frames = [f for f in link.stack if _theirs(f)] or list(link.stack)
        if frames:
            parts.append("Traceback (most recent call last):\n")
            parts.extend(traceback.StackSummary.from_list(frames).format())
        parts.extend(link.format_exception_only())
        parts.append(joint)
    return "".join(parts)[-MAX_TRACEBACK_CHARS:]


def failing_frame(text: str | None) -> str | None:
    """The innermost frame a traceback text names, ``path:line in function``, or None."""
    found = list(_FRAME.finditer(text or ""))
    if not found:
        return None
    last = found[-1]
    return f"{last['path']}:{last['line']} in {last['fn']}"
