"""The peers of ``python -m benchmarks.peers``: one driver module per system, the shared
harness (the private Redis server, worker processes, figures), and the app modules the
peers' own worker commands import (``dramatiq_app``, ``saq_app``)."""
