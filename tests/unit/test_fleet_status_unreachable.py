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


def test_status_names_the_workflows_whose_shards_are_not_leased_yet() -> None:
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    body = {"status": "starting", "children": [], "restarts": 0, "shards": {"fa_load": 0},
            "unleased": ["fa_load"]}

    class Status(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            raw = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Status)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        done = CliRunner().invoke(status, ["--url", f"http://127.0.0.1:{server.server_port}"])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines()[0].startswith("fleet starting  restarts=0")
    assert "no shards leased yet of: fa_load" in done.stdout
