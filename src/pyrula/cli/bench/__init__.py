"""``pyrula-fleet bench``: load a fleet with runs of ``pyrula.examples.bench`` and measure it.

One concern per module: ``config`` (what was asked, validated), ``load`` (submitting and
waiting for runs), ``control`` (the fleet: started, attached, its children killed),
``measure`` (percentiles, verification, shares, shards, store commands, the progress line),
``report`` (the text report) and ``runner`` (one bench from start to end).
"""

from pyrula.cli.bench.config import BenchConfig, BenchError
from pyrula.cli.bench.report import render
from pyrula.cli.bench.runner import run_bench

__all__ = ["BenchConfig", "BenchError", "render", "run_bench"]
