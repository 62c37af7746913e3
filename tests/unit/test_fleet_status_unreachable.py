"""``pyrula-fleet status`` (and ``upgrade``) when nothing answers at the URL: one line in
words, not urllib's ``<urlopen error ...>``, and exit 1."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from pyrula.cli.fleet_control import status, upgrade


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("command", [status, upgrade], ids=["status", "upgrade"])
def test_a_fleet_not_running_is_said_in_words(command: object) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    done = CliRunner().invoke(command, ["--url", url])  # type: ignore[arg-type]
    assert done.exit_code == 1
    assert (f"cannot reach the fleet at {url}: connection refused (is it running? "
            "pass --url)") in done.stderr, done.stderr
    assert "urlopen" not in done.output and "Errno" not in done.output
