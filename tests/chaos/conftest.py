"""Fixtures of the chaos suite: the fleet tests' ``fleets`` (real fleet processes, reaped at
teardown) and ``client``, over the SQLite file in ``tmp_path`` unless a test picks a store."""

from tests.fleet.conftest import client, fleets

__all__ = ["client", "fleets"]
