#!/usr/bin/env python3
"""The results store's command line (benchmarks/results_store.py): render docs/benchmarks.md's
sections (and docs/bench.md's, docs/optimize.md's) and the README's results table from
benchmarks/results/*.json, check that they agree, and list stale figures.

    python scripts/gen_results.py render          # write the docs and the README table
    python scripts/gen_results.py check           # mismatch: exit 1; stale: a WARNING list
    python scripts/gen_results.py check --strict  # stale fails too (MILLISERVE_RESULTS_STRICT=1)
    python scripts/gen_results.py stale           # the stale list alone
    python scripts/gen_results.py import          # seed entries for doc sections the store lacks
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from results_store import main

if __name__ == "__main__":
    sys.exit(main())
