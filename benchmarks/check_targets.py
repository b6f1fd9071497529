#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Recompute every benchmark target from the raw numbers in results.json files.

Never trusts the flags a file stores: each target is computed again from the medians and
rounds of its section (``asyncmr_bench/targets.py``), and a target with a missing cell is
reported as not met, naming the cell. Standard library only: it runs anywhere the JSON is
(no GPU, no asyncmr).

    python benchmarks/check_targets.py [--strict] [-v] [RESULTS.json ...]

With no file it checks every results.json under benchmarks/results/. Exit status: 0, or with
--strict 1 when any target of a section that ran is not met; 2 when a file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from asyncmr_bench.targets import compute_targets, print_targets, tally  # noqa: E402

RESULTS = HERE / "results"


def check(path: Path, verbose: bool) -> tuple:
    """Prints the report of one file; returns (met, counted) or None when unreadable."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"check_targets: cannot read {path}: {e}")
        return None
    meta = doc.get("meta") or {}
    versions = meta.get("versions") or {}
    driver = meta.get("driver", meta.get("cuda_driver_api", "?"))
    variant = meta.get("variant") or f"runtime {meta.get('cuda_runtime_asyncmr', '?')}"
    print(f"{path}: {meta.get('gpu', '?')}, driver {driver}, asyncmr {variant}, "
          f"{meta.get('date', '?')}; rmm {versions.get('rmm')}, cupy {versions.get('cupy')}, "
          f"cuda-core {versions.get('cuda-core')}, quick={(doc.get('params') or {}).get('quick')}")
    targets = compute_targets(doc)
    print_targets(targets, verbose=verbose, stored=doc.get("targets"))
    met, counted, _ = tally(targets)
    return met, counted


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="*",
                        help="results.json files of bench runs (default: every results.json "
                        f"under {RESULTS})")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also print every cell of each target")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when any target of a section that ran is not met")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.results] or sorted(RESULTS.rglob("results.json"))
    if not paths:
        print(f"check_targets: no results.json under {RESULTS}")
        return 2
    status = 0
    for i, path in enumerate(paths):
        if i:
            print()
        got = check(path, args.verbose)
        if got is None:
            status = 2
        elif args.strict and got[0] < got[1] and status == 0:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
