"""cloud_config: what a connector is started with, and every value it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyrula.config.cloud import DEFAULT_URL, cloud_config, default_outbox
from pyrula.errors import ConfigurationError

KEY = "pyr_prod_" + "a" * 32


def test_no_key_is_no_connector() -> None:
    assert cloud_config(environ={}) is None
    assert cloud_config(False, environ={"PYRULA_CLOUD_API_KEY": KEY}) is None


def test_a_key_gives_its_environment_and_the_defaults() -> None:
    config = cloud_config(environ={"PYRULA_CLOUD_API_KEY": KEY, "HOME": "/h"})
    assert config is not None
    assert (config.environment, config.url, config.drain_deadline_s) == ("prod", DEFAULT_URL,
                                                                        5.0)
    assert config.outbox == default_outbox({})
    assert config.reconcile_s == 30.0


def test_outbox_off_and_a_path() -> None:
    off = cloud_config(environ={"PYRULA_CLOUD_API_KEY": KEY, "PYRULA_CLOUD_OUTBOX_PATH": "off"})
    assert off is not None and off.outbox is None
    there = cloud_config(environ={"PYRULA_CLOUD_API_KEY": KEY,
                                  "PYRULA_CLOUD_OUTBOX_PATH": "/x/y"})
    assert there is not None and there.outbox == Path("/x/y")


@pytest.mark.parametrize(("environ", "named"), [
    ({"PYRULA_CLOUD_API_KEY": "pk_test_123"}, "PYRULA_CLOUD_API_KEY"),
    ({"PYRULA_CLOUD_API_KEY": "pyr_Prod_" + "a" * 32}, "PYRULA_CLOUD_API_KEY"),
    ({"PYRULA_CLOUD_API_KEY": KEY, "PYRULA_CLOUD_DRAIN_DEADLINE_S": "5s"},
     "PYRULA_CLOUD_DRAIN_DEADLINE_S"),
    ({"PYRULA_CLOUD_DRAIN_DEADLINE_S": "5s"}, "PYRULA_CLOUD_DRAIN_DEADLINE_S"),
    ({"PYRULA_CLOUD_DRAIN_DEADLINE_S": "-1"}, "PYRULA_CLOUD_DRAIN_DEADLINE_S"),
    ({"PYRULA_CLOUD_API_KEY": KEY, "PYRULA_CLOUD_URL": "ftp://x"}, "PYRULA_CLOUD_URL"),
    ({"PYRULA_CLOUD_API_KEY": KEY, "PYRULA_CLOUD_RECONCILE_S": "0"},
     "PYRULA_CLOUD_RECONCILE_S"),
    ({"PYRULA_CLOUD_RECONCILE_S": "30s"}, "PYRULA_CLOUD_RECONCILE_S"),
    ({"PYRULA_CLOUD_URL": "http://:99999"}, "PYRULA_CLOUD_URL"),
])
def test_unusable_values_are_named(environ: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        cloud_config(environ=environ)
