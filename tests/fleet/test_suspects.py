"""A poison run among bystanders, in a real fleet: once its first crash made suspects of the
runs it shared a child with, each suspect runs alone, so the poison's next crashes take no
bystander down with it.

The scenario: one child serving up to 50 runs at a time; a run whose step kills its
process the moment it starts, submitted with 60 runs that spend 0.5 s in a step of their
own. The first crash charges every run the child had in its code (the culprit is not known
yet): those are suspects from then on. A bystander is started by the dead child and once
more, alone or beside ordinary runs, never a third time; the poison is quarantined after
poison_max_retries (3) + 1 crashes.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pyrula.workflows import RunFailed, SyncWorkflowClient, ValkeyStore
from tests.fleet.fleetprocs import QUICK, STORE_URL, Fleets

BYSTANDERS = 60
DWELL_S = 0.5


def _started(client: SyncWorkflowClient, run_id: str) -> int:
    return sum(1 for e in client.events(run_id) if e["type"] == "run:started")


def _scenario(fleets: Fleets, client: SyncWorkflowClient, *options: str,
              store: str) -> None:
    poison = client.submit("fa_poison", {"tag": "p"})
    bystanders = {f"b{i}": client.submit("fa_dwell", {"tag": f"b{i}", "seconds": DWELL_S})
                  for i in range(BYSTANDERS)}
    began = time.monotonic()
    fleet = fleets.start("-n", "1", "--max-concurrent-runs", "50", *options, *QUICK,
                         store=store)

    with pytest.raises(RunFailed) as failed:
        client.result(poison.run_id, timeout=40)
    quarantined = time.monotonic() - began
    assert failed.value.error["code"] == "max_retries"
    assert len(fleets.ran("die", "p")) == 4  # poison_max_retries (3) + 1
    for tag, run in bystanders.items():
        assert client.result(run.run_id, timeout=40) == f"{tag} dwelt {DWELL_S:g} s", tag
    took = time.monotonic() - began

    starts = {tag: _started(client, run.run_id) for tag, run in bystanders.items()}
    shared = sorted(tag for tag, n in starts.items() if n > 1)
    print(f"poison among {BYSTANDERS} bystanders: quarantined after {quarantined:.1f} s, "
          f"all done after {took:.1f} s; "
          f"starts per bystander: {sorted(starts.values())}")
    assert max(starts.values()) <= 2, {t: n for t, n in starts.items() if n > 2}
    assert shared, "the poison's first crash took no bystander down: no suspect was made"
    errors = [e for e in client.events(poison.run_id) if e["type"] == "run:error"]
    assert [e["code"] for e in errors] == ["max_retries"]
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def test_a_poison_run_costs_each_bystander_at_most_one_crash_on_sqlite(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    _scenario(fleets, client, store=STORE_URL)


@contextmanager
def _valkey_client(url: str, namespace: str) -> Iterator[SyncWorkflowClient]:
    store = ValkeyStore(url=url, namespace=namespace)
    try:
        yield SyncWorkflowClient(store)
    finally:
        store.close()


def test_a_poison_run_costs_each_bystander_at_most_one_crash_on_valkey(
    fleets: Fleets, valkey_url: str, valkey_namespace: str
) -> None:
    with _valkey_client(valkey_url, valkey_namespace) as client:
        _scenario(fleets, client, "--namespace", valkey_namespace, store=valkey_url)

