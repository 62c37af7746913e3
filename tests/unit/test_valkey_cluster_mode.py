"""Which Valkey client a store uses, decided from the host and the ``cluster`` flag before
anything connects: an ElastiCache Serverless host is always a cluster (no INFO probe), the
flag overrides, anything else is detected on the first call."""

from __future__ import annotations

import pytest

from pyrula.workflows import ValkeyStore
from pyrula.workflows.stores.valkey.connection import cluster_mode

SERVERLESS = "my-cache-abc123.serverless.use1.cache.amazonaws.com"


@pytest.mark.parametrize(
    ("host", "flag", "mode"),
    [
        pytest.param(SERVERLESS, None, True, id="serverless-detected-without-probe"),
        pytest.param(SERVERLESS.upper(), None, True, id="serverless-any-case"),
        pytest.param(SERVERLESS + ".", None, True, id="serverless-fqdn-dot"),
        pytest.param("a.b.serverless.euw2.cache.amazonaws.com", None, True,
                     id="serverless-more-labels"),
        pytest.param(SERVERLESS, True, True, id="serverless-flag-true"),
        pytest.param(SERVERLESS, False, False, id="serverless-flag-false-is-obeyed"),
        pytest.param("localhost", None, None, id="plain-host-probes"),
        pytest.param("127.0.0.1", None, None, id="address-probes"),
        pytest.param("localhost", True, True, id="flag-true-forces-cluster"),
        pytest.param("localhost", False, False, id="flag-false-forces-plain"),
        pytest.param("my-rg.abc123.ng.0001.use1.cache.amazonaws.com", None, None,
                     id="node-based-elasticache-probes"),
        pytest.param("clustercfg.my-rg.abc123.use1.cache.amazonaws.com", None, None,
                     id="elasticache-configuration-endpoint-probes"),
        pytest.param("serverless.use1.cache.amazonaws.com", None, None,
                     id="no-cache-name-label"),
        pytest.param("x.serverless.use1.cache.amazonaws.com.evil.example", None, None,
                     id="suffix-must-end-the-host"),
        pytest.param("x.serverless.cache.amazonaws.com", None, None, id="no-region-label"),
    ],
)
def test_cluster_mode(host: str, flag: bool | None, mode: bool | None) -> None:
    assert cluster_mode(host, flag) is mode


def test_a_serverless_store_knows_it_is_a_cluster_before_connecting() -> None:
    serverless = ValkeyStore(url=f"rediss://{SERVERLESS}:6379")
    assert serverless.connection.is_cluster is True
    assert serverless.cluster is None  # the flag as given: not passed
    assert ValkeyStore(url="redis://localhost:6379").connection.is_cluster is None
