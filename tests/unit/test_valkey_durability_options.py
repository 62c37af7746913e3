"""``durability`` of the Valkey store, from its constructor and from its URL: the names it
takes, the defaults, and the values refused (a ConfigurationError naming the option)."""

from __future__ import annotations

from typing import Any

import pytest

from pyrula.workflows import ConfigurationError, ValkeyStore
from pyrula.workflows.stores import store_from_url
from pyrula.workflows.stores.valkey.resp import REPLICA_TIMEOUT, Durability
from pyrula.workflows.stores.valkey.router import Router, _replicated

URL = "redis://127.0.0.1:1"


def test_the_default_is_async() -> None:
    store = ValkeyStore(URL)
    assert store.durability is Durability.ASYNC
    assert store.connection.link_options.replica_timeout == REPLICA_TIMEOUT


@pytest.mark.parametrize("url, expected", [
    (URL + "?durability=replicated", Durability.REPLICATED),
    (URL + "/3?durability=REPLICATED", Durability.REPLICATED),
    (URL + "?durability=async", Durability.ASYNC),
    ("valkeys://127.0.0.1:1?durability=replicated&ssl_cert_reqs=none", Durability.REPLICATED),
])
def test_the_url_names_it(url: str, expected: Durability) -> None:
    store = store_from_url(url)
    assert isinstance(store, ValkeyStore)
    assert store.durability is expected


def test_the_constructor_names_it_and_wins_over_the_url() -> None:
    assert ValkeyStore(URL, durability="replicated").durability is Durability.REPLICATED
    store = ValkeyStore(URL + "?durability=replicated&replica_timeout=0.5", durability="async")
    assert store.durability is Durability.ASYNC
    assert store.connection.link_options.replica_timeout == 0.5
    assert ValkeyStore(URL, replica_timeout=3).connection.link_options.replica_timeout == 3.0


def test_the_replica_timeout_stays_below_a_short_socket_timeout() -> None:
    store = ValkeyStore(URL, durability="replicated", socket_timeout=1.0)
    assert store.connection.link_options.replica_timeout == 0.5


@pytest.mark.parametrize("options", [
    {"durability": "sync"}, {"durability": ""}, {"durability": 1},
    {"replica_timeout": 0}, {"replica_timeout": -1}, {"replica_timeout": 10.0},
    {"replica_timeout": True}, {"replica_timeout": "soon"}, {"replica_timeout": float("nan")},
])
def test_bad_values_are_refused_by_name(options: dict[str, Any]) -> None:
    (name, value), = options.items()
    with pytest.raises(ConfigurationError, match=f"{name}={value!r}"):
        ValkeyStore(URL, **options)


@pytest.mark.parametrize("query, name", [
    ("durability=sometimes", "durability"), ("durability=", "durability"),
    ("replica_timeout=0", "replica_timeout"), ("replica_timeout=2s", "replica_timeout"),
])
def test_bad_url_values_are_refused_by_name(query: str, name: str) -> None:
    with pytest.raises(ConfigurationError, match=f"url .*{name}="):
        store_from_url(f"{URL}?{query}")


def test_only_a_replicated_store_ends_its_writes_with_wait() -> None:
    assert ValkeyStore(URL).connection._thread_router()._wait is None
    router: Router = ValkeyStore(URL + "?durability=replicated&replica_timeout=0.25"
                                 ).connection._thread_router()
    assert router._wait == ("WAIT", 1, 250)


def test_a_write_no_replica_acknowledged_is_unavailable_but_an_error_stays() -> None:
    from pyrula.workflows import StoreUnavailable
    from pyrula.workflows.stores.valkey.resp import Endpoint, ReplyError

    where, wait = Endpoint("h", 1), ("WAIT", 1, 100)
    stale = ReplyError("STALE 4")
    assert _replicated(["OK", stale, 1], wait, where) == ["OK", stale]
    done = _replicated(["OK", stale, 0], wait, where)
    assert isinstance(done[0], StoreUnavailable) and "0 of 1 replicas" in str(done[0])
    assert done[1] is stale
    refused = _replicated(["OK", ReplyError("ERR WAIT cannot be used")], wait, where)
    assert isinstance(refused[0], StoreUnavailable) and "WAIT refused" in str(refused[0])
