"""What the generative tests draw: workflow names (anything a name may hold), owners,
idempotency keys and JSON payloads, and the private registries their workers serve."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import Phase
from hypothesis import strategies as st

from pyrula.workflows import WorkflowContext
from pyrula.workflows.definition import MAX_NAME_LENGTH, Registry, WorkflowSpec
from pyrula.workflows.events import BUILD_SIGNAL, INTERRUPT_SIGNAL

#: The phases of a generative test: under CI=true, no shrinking. A failing example waits
#: out the settle bound at each shrink step (and a per-test timeout, raised inside the
#: example, reads to Hypothesis as one more failure to shrink), so CI reports the example
#: as found, with what replays it, instead of running out its time; elsewhere a failure
#: is shrunk to its shortest form.
PHASES = ([Phase.explicit, Phase.reuse, Phase.generate] if os.environ.get("CI") == "true"
          else list(Phase))

#: Any character a name may hold: all but control characters and lone surrogates.
NAME_CHARS = st.characters(blacklist_categories=("Cc", "Cs"))

#: Names as users write them (dotted, snake case) and anything else a name may hold.
names = st.one_of(
    st.from_regex(r"[a-z][a-z0-9_]{0,12}(\.[a-z][a-z0-9_]{0,12}){0,2}", fullmatch=True),
    st.text(NAME_CHARS, min_size=1, max_size=12),
    st.text(NAME_CHARS, min_size=MAX_NAME_LENGTH - 2, max_size=MAX_NAME_LENGTH),
)

#: Owners and idempotency keys: non-empty strings of the same characters.
tokens = st.text(NAME_CHARS, min_size=1, max_size=16)

#: Signal names a client may send (the engine's own are refused by ``client.signal``).
signal_names = tokens.filter(lambda s: s not in (INTERRUPT_SIGNAL, BUILD_SIGNAL))

#: JSON values as params and payloads (floats that JSON keeps exactly).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False, width=32) | st.text(NAME_CHARS, max_size=20),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(NAME_CHARS, max_size=8), inner, max_size=4),
    max_leaves=8,
)


def echo_registry(workflow_names: list[str]) -> Registry:
    """A registry of its own (the global one is left alone) where each name is a workflow
    returning its name and params."""
    registry = Registry()
    for name in workflow_names:
        async def echo(ctx: WorkflowContext, params: Any, _name: str = name) -> Any:
            return {"name": _name, "params": params}

        registry.add_workflow(WorkflowSpec(name=name, fn=echo))
    return registry
