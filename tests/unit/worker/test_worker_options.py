"""WorkerOptions: every option with its default, PYRULA_* variables, validation, Cloud."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pyrula.workflows import (
    ConfigurationError,
    MemoryStore,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from tests.unit.worker.worker_support import fast_options, serving


@workflow(name="wopt_echo")
async def wopt_echo(ctx: WorkflowContext, params: Any) -> Any:
    return params


#: Every WorkerOptions field with its documented default (docs/operations.md).
DEFAULTS: dict[str, Any] = {
    "max_concurrent_runs": 50,
    "claim_poll_interval": 0.1,
    "timer_poll_interval_s": 5.0,
    "timer_max_batch": 100,
    "orphan_scan_interval": 60.0,
    "shutdown_grace": 30.0,
    "cancel_timeout": 5.0,
    "shard_lease_interval": 10.0,
    "event_buffer_size": 64,
    "step_boundary_durability": True,
    "reconcile_interval": 60.0,
    "projection_interval": 60.0,
    "journal_cache_events": 50000,
    "lock_ttl": 15.0,
    "shard_lease_ttl": 30.0,
    "poison_max_retries": 3,
    "poison_retry_ttl_s": 3600.0,
    "stranded_policy": "wait",
    "stranded_timeout": 86400.0,
    "schedule_interval": 30.0,
    "trigger_interval": 1.0,
    "child_recheck": 60.0,
    "projection_grace": 10.0,
    "max_payload_bytes": 16 * 1024 * 1024,
    "health_port": None,
    "health_host": "127.0.0.1",
    "poison_counts_loop_blocked": True,
    "project": None,
    "environment": None,
    "journal_cache_verify": False,
    "store_wait": None,
}

#: For each option: a value for ``PYRULA_<OPTION>`` unlike the default, and what it means.
ENV_VALUES: dict[str, tuple[str, Any]] = {
    "max_concurrent_runs": ("7", 7),
    "claim_poll_interval": ("0.25", 0.25),
    "timer_poll_interval_s": ("2", 2.0),
    "timer_max_batch": ("9", 9),
    "orphan_scan_interval": ("30.5", 30.5),
    "shutdown_grace": ("3", 3.0),
    "cancel_timeout": ("2", 2.0),
    "shard_lease_interval": ("5", 5.0),
    "event_buffer_size": ("8", 8),
    "step_boundary_durability": ("false", False),
    "reconcile_interval": ("300", 300.0),
    "projection_interval": ("120", 120.0),
    "journal_cache_events": ("0", 0),
    "lock_ttl": ("4.5", 4.5),
    "shard_lease_ttl": ("12", 12.0),
    "poison_max_retries": ("5", 5),
    "poison_retry_ttl_s": ("60", 60.0),
    "stranded_policy": ("fail", "fail"),
    "stranded_timeout": ("600", 600.0),
    "schedule_interval": ("60", 60.0),
    "trigger_interval": ("0.5", 0.5),
    "projection_grace": ("2.5", 2.5),
    "max_payload_bytes": ("1MiB", 1024 * 1024),
    "health_port": ("8099", 8099),
    "health_host": ("0.0.0.0", "0.0.0.0"),
    "poison_counts_loop_blocked": ("0", False),
    "project": ("shop", "shop"),
    "environment": ("staging", "staging"),
    "journal_cache_verify": ("1", True),
    "store_wait": ("7.5", 7.5),
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No PYRULA_* variable of the machine leaks into these tests."""
    import os

    for name in list(os.environ):
        if name.startswith("PYRULA_"):
            monkeypatch.delenv(name)


def make_worker(options: WorkerOptions | None = None, **kwargs: Any) -> WorkflowWorker:
    return WorkflowWorker(store=MemoryStore(), workflows=[wopt_echo], options=options, **kwargs)


def test_every_option_exists_with_its_default() -> None:
    options = WorkerOptions()
    assert {f.name for f in dataclasses.fields(WorkerOptions)} == set(DEFAULTS)
    assert {name: getattr(options, name) for name in DEFAULTS} == DEFAULTS


def test_the_worker_shows_the_defaults_when_nothing_is_set() -> None:
    worker = make_worker()
    assert {name: getattr(worker.options, name) for name in DEFAULTS} == DEFAULTS


@pytest.mark.parametrize("option", sorted(ENV_VALUES))
def test_each_option_comes_from_its_environment_variable(
    option: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, expected = ENV_VALUES[option]
    assert expected != DEFAULTS[option]
    monkeypatch.setenv(f"PYRULA_{option.upper()}", raw)
    assert getattr(make_worker().options, option) == expected


@pytest.mark.parametrize(
    ("variable", "option", "raw", "expected"),
    [
        ("PYRULA_WORKER_HEALTH_PORT", "health_port", "0", 0),
        ("PYRULA_WORKER_HEALTH_HOST", "health_host", "0.0.0.0", "0.0.0.0"),
        ("PYRULA_JOURNAL_CACHE_VERIFY", "journal_cache_verify", "1", True),
    ],
)
def test_the_reference_variable_names_apply(
    variable: str, option: str, raw: str, expected: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, raw)
    assert getattr(make_worker().options, option) == expected


def test_the_reference_health_variables_win_over_the_generic_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYRULA_HEALTH_PORT", "8100")
    monkeypatch.setenv("PYRULA_WORKER_HEALTH_PORT", "8101")
    assert make_worker().options.health_port == 8101


def test_a_value_given_in_code_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYRULA_MAX_CONCURRENT_RUNS", "7")
    monkeypatch.setenv("PYRULA_CLAIM_POLL_INTERVAL", "0.5")
    monkeypatch.setenv("PYRULA_WORKER_HEALTH_PORT", "8081")
    monkeypatch.setenv("PYRULA_TIMER_MAX_BATCH", "9")
    # claim_poll_interval is given in code at its default value: code still wins.
    options = WorkerOptions(max_concurrent_runs=3, claim_poll_interval=0.1, health_port=0)
    effective = make_worker(options).options
    assert effective.max_concurrent_runs == 3
    assert effective.claim_poll_interval == 0.1
    assert effective.health_port == 0
    assert effective.timer_max_batch == 9  # not given in code: the environment applies


def test_code_values_are_parsed_and_shown_as_effective_values() -> None:
    worker = make_worker(WorkerOptions(lock_ttl=2, max_payload_bytes="2MB", health_port=0))
    assert worker.options.lock_ttl == 2.0 and isinstance(worker.options.lock_ttl, float)
    assert worker.options.max_payload_bytes == 2 * 1024 * 1024
    assert worker.options.health_port == 0


#: (option, a bad value from code, a bad value from the environment).
BAD_VALUES: list[tuple[str, Any, str]] = [
    ("claim_poll_interval", "5s", "5s"),
    ("orphan_scan_interval", -1.0, "-1"),
    ("lock_ttl", 0, "0"),
    ("max_concurrent_runs", 1.5, "1.5"),
    ("max_concurrent_runs", 0, "0"),
    ("stranded_policy", "maybe", "maybe"),
    ("step_boundary_durability", "perhaps", "perhaps"),
    ("health_port", 70000, "70000"),
    ("max_payload_bytes", "lots", "lots"),
]


@pytest.mark.parametrize(("option", "value", "raw"), BAD_VALUES)
def test_a_bad_value_in_code_raises_naming_the_option(option: str, value: Any, raw: str) -> None:
    with pytest.raises(ConfigurationError, match=option):
        WorkerOptions(**{option: value})


@pytest.mark.parametrize(("option", "value", "raw"), BAD_VALUES)
def test_a_bad_environment_value_raises_at_worker_construction(
    option: str, value: Any, raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    variable = f"PYRULA_{option.upper()}"
    monkeypatch.setenv(variable, raw)
    options = WorkerOptions()  # nothing is read from the environment yet
    with pytest.raises(ConfigurationError) as caught:
        make_worker(options)
    assert option in str(caught.value) and variable in str(caught.value)


def test_a_bad_reference_variable_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYRULA_WORKER_HEALTH_PORT", "eighty")
    with pytest.raises(ConfigurationError, match="PYRULA_WORKER_HEALTH_PORT"):
        make_worker()


def test_a_bad_environment_value_is_ignored_when_code_gives_the_option(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYRULA_CLAIM_POLL_INTERVAL", "5s")
    assert make_worker(WorkerOptions(claim_poll_interval=0.2)).options.claim_poll_interval == 0.2


async def test_a_cloud_key_that_does_not_parse_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYRULA_CLOUD_API_KEY", "pk_test_123")
    worker = make_worker(fast_options(health_port=0))  # the key is checked at start
    with pytest.raises(ConfigurationError, match="PYRULA_CLOUD_API_KEY is not a pyrula Cloud"):
        await worker.run()
    assert worker.health_address is None  # refused before anything was started


async def test_a_bad_cloud_drain_deadline_refuses_to_start_even_without_a_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYRULA_CLOUD_API_KEY", raising=False)
    monkeypatch.setenv("PYRULA_CLOUD_DRAIN_DEADLINE_S", "5s")
    worker = make_worker(fast_options(health_port=0))
    with pytest.raises(ConfigurationError, match="PYRULA_CLOUD_DRAIN_DEADLINE_S.*'5s'"):
        await worker.run()
    assert worker.health_address is None


async def test_cloud_false_ignores_the_key_and_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYRULA_CLOUD_API_KEY", "pk_test_123")
    worker = make_worker(fast_options(), cloud=False)
    async with serving(worker):
        run = await worker.client.submit(wopt_echo, {"x": 1})
        assert await worker.client.result(run.run_id, timeout=10) == {"x": 1}
