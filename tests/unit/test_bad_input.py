"""Bad input is refused at the call, naming what is wrong: payloads that are not JSON,
namespaces outside the allowed alphabet, store URLs that cannot name a server. Pure checks,
made before anything is sent (the stores here are constructed, never connected)."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
from pathlib import Path
from typing import Any

import pytest

from pyrula.config.fleet import FleetOptions
from pyrula.config.parse import redact_url
from pyrula.workflows import (
    ConfigurationError,
    MemoryStore,
    SyncWorkflowClient,
    ValkeyStore,
    WorkflowClient,
    store_from_url,
)
from pyrula.workflows.errors import PayloadTooLarge
from pyrula.workflows.schedules import Schedule


@dataclasses.dataclass
class Point:
    x: int = 1


class Opaque:
    pass


NOT_JSON = [
    pytest.param({1, 2}, "builtins.set", id="set"),
    pytest.param(datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC), "datetime.datetime",
                 id="datetime"),
    pytest.param(datetime.date(2024, 1, 1), "datetime.date", id="date"),
    pytest.param(b"raw", "builtins.bytes", id="bytes"),
    pytest.param({"nested": [Opaque()]}, "Opaque", id="object"),
    pytest.param(Point(), "Point", id="dataclass"),
    pytest.param(decimal.Decimal("1.5"), "decimal.Decimal", id="decimal"),
    pytest.param({"x": float("nan")}, "NaN", id="nan"),
    pytest.param([1.0, float("inf")], "Infinity", id="infinity"),
    pytest.param(-float("inf"), "Infinity", id="minus-infinity"),
    pytest.param(2**64, "64-bit", id="huge-int"),
]


@pytest.mark.parametrize(("params", "named"), NOT_JSON)
async def test_params_that_are_not_json_are_refused_at_submit(params: Any, named: str) -> None:
    store = MemoryStore()
    client = WorkflowClient(store)
    with pytest.raises(ValueError, match=named) as refused:
        await client.submit("orders.process", params)
    assert "params for workflow 'orders.process'" in str(refused.value)
    assert await store.list_runs(limit=10) == []  # nothing was written


@pytest.mark.parametrize(("params", "named"), NOT_JSON)
def test_the_sync_client_refuses_them_too(params: Any, named: str) -> None:
    store = MemoryStore()
    client = SyncWorkflowClient(store)
    with pytest.raises(ValueError, match=named):
        client.submit("orders.process", params)
    assert list(client.list_runs(limit=10)) == []


BAD_PRIORITIES = [
    pytest.param(-1, ValueError, "-1", id="negative"),
    pytest.param(10, ValueError, "10", id="above-9"),
    pytest.param(True, TypeError, "True", id="bool"),
    pytest.param(2.0, TypeError, "2.0", id="float"),
    pytest.param("5", TypeError, "'5'", id="str"),
    pytest.param(None, TypeError, "None", id="none"),
]


@pytest.mark.parametrize(("priority", "error", "shown"), BAD_PRIORITIES)
async def test_a_bad_priority_is_refused_at_submit_naming_it(
    priority: Any, error: type[Exception], shown: str
) -> None:
    store = MemoryStore()
    with pytest.raises(error, match=r"priority must be an int from 0 to 9, got ") as refused:
        await WorkflowClient(store).submit("orders.process", {}, priority=priority)
    assert shown in str(refused.value)
    assert await store.list_runs(limit=10) == []  # nothing was written


@pytest.mark.parametrize(("priority", "error", "shown"), BAD_PRIORITIES)
def test_the_sync_client_refuses_a_bad_priority_too(
    priority: Any, error: type[Exception], shown: str
) -> None:
    client = SyncWorkflowClient(MemoryStore())
    with pytest.raises(error, match="priority"):
        client.submit("orders.process", {}, priority=priority)
    assert list(client.list_runs(limit=10)) == []


def test_the_sync_client_submits_with_a_priority() -> None:
    client = SyncWorkflowClient(MemoryStore())
    handle = client.submit("orders.process", {}, priority=3)
    assert client.get(handle.run_id).priority == 3


async def test_signal_and_resume_payloads_that_are_not_json_are_refused() -> None:
    store = MemoryStore()
    client = WorkflowClient(store)
    run = await client.submit("orders.process", {"ok": None})  # a null is JSON
    with pytest.raises(ValueError, match=r"payload of signal 'go' is .*NaN"):
        await client.signal(run.run_id, "go", float("nan"))
    with pytest.raises(ValueError, match=r"resume value is .*builtins.set"):
        await client.resume(run.run_id, {1})
    for name in ("", None, 7, b"go"):
        with pytest.raises(ValueError, match="signal name must be a non-empty str"):
            await client.signal(run.run_id, name, 1)  # type: ignore[arg-type]
    assert [e["type"] for e in await client.events(run.run_id)] == ["run:submitted"]


async def test_payloads_over_the_limit_are_refused_naming_it() -> None:
    store = MemoryStore()
    client = WorkflowClient(store, max_payload_bytes=1000)
    with pytest.raises(PayloadTooLarge, match=r"above max_payload_bytes \(1000\)"):
        await client.submit("orders.process", "x" * 1000)
    assert await store.list_runs(limit=10) == []
    run = await client.submit("orders.process", "x" * 900)
    with pytest.raises(PayloadTooLarge, match=r"payload of signal 'go' is \d+ bytes, above "
                                              r"max_payload_bytes \(1000\)"):
        await client.signal(run.run_id, "go", ["y" * 1000])
    assert len(await client.events(run.run_id)) == 1


def test_schedule_params_that_are_not_json_are_refused() -> None:
    with pytest.raises(ValueError, match="NaN"):
        Schedule.create("report", "* * * * *", {"ratio": float("nan")})
    with pytest.raises(ValueError, match="datetime"):
        Schedule.create("report", "* * * * *", {"at": datetime.datetime.now()})


# --- namespaces -----------------------------------------------------------------------

BAD_NAMESPACES = ["", " ", "two words", " padded", "padded ", "{tag}", "a{b", "a}b", "a*b",
                  "*", "a?b", "a[b", "a]b", "[a-z]", "a:b", "line\nbreak", "tab\there",
                  "nul\x00", "bell\x07", "back\\slash", "é", "x" * 101]


@pytest.mark.parametrize("namespace", BAD_NAMESPACES)
def test_a_namespace_outside_the_alphabet_is_refused_at_construction(namespace: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        ValkeyStore(url="redis://127.0.0.1:6379", namespace=namespace)
    message = str(refused.value)
    assert repr(namespace) in message
    assert "A-Z a-z 0-9 . _ -" in message  # the rule


@pytest.mark.parametrize("namespace", ["a*b", "a b", "a:b", "{x}"])
def test_a_bad_namespace_in_the_environment_is_refused_naming_the_variable(
    namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYRULA_VALKEY_NAMESPACE", namespace)
    with pytest.raises(ConfigurationError, match="PYRULA_VALKEY_NAMESPACE") as refused:
        ValkeyStore(url="redis://127.0.0.1:6379")
    assert repr(namespace) in str(refused.value)
    with pytest.raises(ConfigurationError, match="PYRULA_VALKEY_NAMESPACE"):
        store_from_url("valkey://127.0.0.1:6379")


def test_the_fleet_refuses_a_bad_namespace_naming_the_flag() -> None:
    with pytest.raises(ConfigurationError, match=r"--namespace .*'a\*b'"):
        FleetOptions(apps=("app",), namespace="a*b")


@pytest.mark.parametrize("namespace", ["default", "staging", "prod-eu.1", "T_0", "x" * 100])
def test_namespaces_of_the_alphabet_are_kept_as_given(namespace: str) -> None:
    assert ValkeyStore(url="redis://127.0.0.1:6379", namespace=namespace).namespace == namespace


# --- store URLs -----------------------------------------------------------------------

BAD_URLS = [
    ("ftp://127.0.0.1:6379", "unknown store URL scheme 'ftp'"),
    ("127.0.0.1:6379", "no scheme"),
    ("redis://127.0.0.1:99999", "Port out of range"),
    ("redis://127.0.0.1:port", "Port could not be cast"),
    ("redis://127.0.0.1:0", "port 0"),
    ("redis://", "no host"),
    ("redis://:6379", "no host"),
    ("valkey:///0", "no host"),
    ("redis://127.0.0.1:6379/zero", "database 'zero'"),
    ("redis://127.0.0.1:6379?ssl_ca_cert=x.pem", "unknown query option 'ssl_ca_cert'"),
    ("rediss://127.0.0.1:6379?ssl_cert_reqs=maybe", "ssl_cert_reqs='maybe'"),
    ("rediss://127.0.0.1:6379?ssl_check_hostname=perhaps", "ssl_check_hostname='perhaps'"),
    ("rediss://127.0.0.1:6379?ssl_ca_certs=/nonexistent/ca.pem", "cannot load the TLS files"),
    ("sqlite://", "names no SQLite file"),
]


@pytest.mark.parametrize(("url", "message"), BAD_URLS)
def test_a_store_url_that_names_no_server_is_refused(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("?", r"\?")):
        store_from_url(url)


def test_a_password_in_a_refused_url_is_not_repeated() -> None:
    with pytest.raises(ConfigurationError) as refused:
        store_from_url("redis://user:hunter2@127.0.0.1:99999")
    assert "hunter2" not in str(refused.value)
    assert "redis://user:***@127.0.0.1:99999" in str(refused.value)
    assert redact_url("rediss://hunter2@h:1/0") == "rediss://:***@h:1/0"
    assert redact_url("redis://h:1") == "redis://h:1"


def test_tls_options_build_a_verifying_context(tmp_path: Path) -> None:
    import ssl

    store = ValkeyStore(url="rediss://127.0.0.1:6390")
    assert store.tls
    context = store.connection.link_options.tls
    assert context is not None
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    relaxed = ValkeyStore(url="valkeys://127.0.0.1:6390?ssl_check_hostname=false")
    assert relaxed.connection.link_options.tls is not None
    assert relaxed.connection.link_options.tls.verify_mode is ssl.CERT_REQUIRED
    assert not relaxed.connection.link_options.tls.check_hostname
    assert ValkeyStore(url="redis://127.0.0.1:6390").connection.link_options.tls is None
