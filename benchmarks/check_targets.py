#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Print each target of an ``asyncmr bench`` results.json as PASS or FAIL.

A report, not a test: it always exits 0. Needs only the standard library, so it runs anywhere
the JSON is (no GPU, no asyncmr).

    python benchmarks/check_targets.py [benchmarks/results/results.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent / "results" / "results.json"


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default=str(DEFAULT),
                        help=f"results.json of a bench run (default: {DEFAULT})")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also print each target's per-size detail")
    args = parser.parse_args(argv)

    try:
        doc = json.loads(Path(args.results).read_text())
    except (OSError, ValueError) as e:
        print(f"check_targets: cannot read {args.results}: {e}")
        return 0

    meta = doc.get("meta", {})
    versions = meta.get("versions", {})
    driver = meta.get("driver", meta.get("cuda_driver_api", "?"))
    print(f"{args.results}: {meta.get('gpu', '?')}, driver {driver}, {meta.get('date', '?')}; "
          f"rmm {versions.get('rmm')}, cupy {versions.get('cupy')}, "
          f"cuda-core {versions.get('cuda-core')}, quick={doc.get('params', {}).get('quick')}")
    targets = doc.get("targets") or []
    if not targets:
        print("no targets in this file (did the run finish?)")
        return 0

    width = max(len(t.get("name", "")) for t in targets)
    met = 0
    for t in targets:
        ok = bool(t.get("met"))
        met += ok
        value = t.get("value")
        status = "PASS" if ok else "FAIL"
        name = t.get("name", "?")
        line = f"{status}  {name:<{width}}  {_fmt(value):>8}  wanted {t.get('target')}"
        if value is None:
            line += f"  ({t.get('note', 'not measured')})"
        print(line)
        if args.verbose and isinstance(t.get("detail"), dict):
            print("        " + ", ".join(f"{k}: {_fmt(v)}" for k, v in t["detail"].items()))
    # Deliberately not "N passed, M failed": this is a report, and CI must not read it as tests.
    print(f"targets met: {met} of {len(targets)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
