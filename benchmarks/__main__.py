"""``python -m benchmarks`` (``make bench``): load scenarios; prints one JSON line each.

Speed is measured and reported here, never asserted by a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from benchmarks import valkey


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--concurrency", type=int, default=50,
                        help="max_concurrent_runs of each worker process")
    parser.add_argument("--samples", type=int, default=300, help="latency samples")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    args = parser.parse_args()
    results = asyncio.run(valkey.main_async(args))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
