"""The score of the last ``mutmut run`` per mutated module (``make mutate``).

Reads mutmut's results under ``mutants/`` and prints, for each module named in
``[tool.mutmut] only_mutate``, the mutants the tests killed (a timeout counts: the tests
noticed the mutant never finishing) out of all its mutants, and each one that was not
killed. Exits 1 when a module scores under ``--min`` percent.

    python -m tests.mutation_score [--min 90]
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code

NOTICED = {"killed", "timeout", "caught by type check"}


def modules(pyproject: Path) -> list[str]:
    config = tomllib.loads(pyproject.read_text())["tool"]["mutmut"]
    return list(config["only_mutate"])


def statuses(results: Path, module: str) -> dict[str, str]:
    """mutant name -> status, for the mutants of ``module`` (a path under src/)."""
    meta = results / f"{module}.meta"
    if not meta.exists():
        return {}
    exit_codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: status_by_exit_code[code] for name, code in exit_codes.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min", type=float, default=90.0, help="lowest score per module, %%")
    parser.add_argument("--results", type=Path, default=Path("mutants"))
    args = parser.parse_args(argv)
    low = []
    for module in modules(Path("pyproject.toml")):
        found = statuses(args.results, module)
        counts = Counter(found.values())
        noticed = sum(counts[s] for s in NOTICED)
        total = len(found) - counts["skipped"]
        score = 100.0 * noticed / total if total else 0.0
        others = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()) if s not in NOTICED)
        print(f"{module}: {noticed}/{total} killed ({score:.1f} %)"
              + (f"; {others}" if others else ""))
        for name, status in sorted(found.items()):
            if status not in NOTICED and status != "skipped":
                print(f"    {status}: {name}")
        if score < args.min:
            low.append(module)
    if low:
        print(f"under {args.min:g} %: {', '.join(low)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
