"""``pyrula-fleet start`` starts its fork server from a quick read of its arguments, before
its CLI is imported. The quick read must read ``--app``, ``--workflow`` and ``--store``
(and their variables) as the CLI's own parser does, for any command line a user writes:
where the two disagree the fork server is started twice, and where the quick read is
wrong and nobody checks, children would fork from the wrong app.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from pyrula.cli.fleet_commands import start
from pyrula.config.fleet import resolve_store_url
from pyrula.supervisor.prestart import quick_read

NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,8}(\.[a-z][a-z0-9_]{0,6})?", fullmatch=True)
URLS = st.sampled_from(["sqlite:///pyrula.db", "sqlite:////tmp/x.db", "redis://127.0.0.1:6379",
                        "valkeys://u:p@h:1/0", "memory://"])
#: Other options of ``start`` with values they accept, which the quick read must step over.
OTHERS = st.sampled_from([["-n", "3"], ["--namespace", "ns-1"], ["--health-port", "0"],
                          ["--log-level", "DEBUG"], ["--cluster"], ["--no-cluster"],
                          ["--max-concurrent-runs", "7"], ["--project", "billing"],
                          ["--dashboard-actions"], ["--log-format=json"]])


@st.composite
def command_lines(draw: Any) -> tuple[list[str], dict[str, str]]:
    parts: list[list[str]] = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["--app", "--workflow", "--store", "other"]))
        if kind == "other":
            parts.append(draw(OTHERS))
            continue
        value = draw(URLS) if kind == "--store" else draw(NAMES)
        if kind == "--workflow":
            value += ":" + draw(NAMES)
        joined = draw(st.booleans())
        parts.append([f"{kind}={value}"] if joined else [kind, value])
    env: dict[str, str] = {}
    if draw(st.booleans()):
        env["PYRULA_APP"] = " ".join(draw(st.lists(NAMES, max_size=3)))
    if draw(st.booleans()):
        env["PYRULA_STORE_URL"] = draw(URLS)
    return ["start", *[arg for part in parts for arg in part]], env


def clicks_reading(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """What the CLI's own parser reads from ``argv`` with only ``env`` set of these."""
    kept = {k: v for k, v in os.environ.items() if k not in ("PYRULA_APP", "PYRULA_STORE_URL")}
    with mock.patch.dict(os.environ, {**kept, **env}, clear=True):
        context = start.make_context("start", argv[1:])
        params = context.params
        return {"apps": list(params["apps"]), "workflows": list(params["workflows"]),
                "store_url": resolve_store_url(params["store"])}


@settings(max_examples=300, deadline=None)
@given(command_lines())
def test_the_quick_read_reads_what_the_cli_reads(line: tuple[list[str], dict[str, str]]
                                                 ) -> None:
    argv, env = line
    assert quick_read(argv, env) == clicks_reading(argv, env)


def test_other_commands_and_help_are_not_read() -> None:
    assert quick_read([], {}) is None
    assert quick_read(["status"], {}) is None
    assert quick_read(["bench", "--store", "x"], {}) is None
    assert quick_read(["start", "--app", "a", "--help"], {}) is None


def test_the_fork_server_is_started_before_the_cli_is_imported() -> None:
    # The point of the quick read: the fork server's imports and the CLI's run side by
    # side. At the moment the entry point starts it, click is not loaded yet.
    script = (
        "import sys\n"
        "import pyrula.supervisor.prestart as prestart\n"
        "def noted(argv):\n"
        "    print('click loaded' if 'click' in sys.modules else 'click not loaded', argv)\n"
        "    raise SystemExit(0)\n"
        "prestart.start_early = noted\n"
        "sys.argv = ['pyrula-fleet', 'start', '--app', 'x']\n"
        "from pyrula.cli.fleet import main\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "click not loaded ['start', '--app', 'x']"


def test_a_start_refused_by_the_cli_leaves_no_scratch_directory(tmp_path: Any) -> None:
    # The quick read started a fork server with a scratch directory for its report; the
    # CLI then refuses the command line: nothing of that start stays behind.
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", "from pyrula.cli.fleet import main; main()", "start",
         "--app", "nosuchapp", "--no-such-flag"],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 2, done.stderr
    assert "--no-such-flag" in done.stderr
    assert list(tmp_path.glob("pyrula-fleet-*")) == []
