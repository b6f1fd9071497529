# SPDX-License-Identifier: Apache-2.0
"""Pair costs of two builds of asyncmr measured in one run, side by side, as ratios.

    python benchmarks/compare_builds.py --before B1.json B2.json --after A1.json A2.json \
        [--reference "rmm CudaAsyncMemoryResource"] [--out compare.json]

Each file is a benchmark results file (``python -m asyncmr_bench --sections 1,11``) of one
build; ci/gpu.sh's ``compare`` stage runs the same harness against the code before a change and
after it, alternating (before, after, before, after), on one machine. For every resource and
size of section 1 (and the Python pairs of section 11, when there) the table gives the median
of each build's medians, and after / before.

The machine drifts between runs (clocks, the other tenants): one run can come out 40% faster
than the three around it for every resource, RMM's and CuPy's as much as ours. So each
row also gives after / before *against the reference*: every cell divided by the reference
resource's cell of the same section and size in the same run, then the median of those per
build, after over before. The reference (``--reference``, default RMM's
``CudaAsyncMemoryResource``) is code neither build changes, so what drift it shares with our
rows cancels. Exit status 0 when the files could be read; the verdict (within noise or not) is
for the reader: the spread of each build's own runs is printed beside it. Standard library
only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def _cells(doc: dict) -> dict[tuple[str, str, str], float]:
    """(section, resource, size) -> median microseconds, for the pair-cost cells of one run."""
    out: dict[tuple[str, str, str], float] = {}
    sections = doc.get("sections") or {}
    pairs = (sections.get("1_pair_cost") or {}).get("results") or {}
    cache = ((sections.get("11_front_cache") or {}).get("python") or {}).get("results") or {}
    for section, table in (("1", pairs), ("11", cache)):
        for resource, sizes in table.items():
            if not isinstance(sizes, dict):
                continue
            for size, entry in sizes.items():
                value = entry.get("median_us") if isinstance(entry, dict) else None
                if isinstance(value, (int, float)):
                    out[(section, resource, size)] = float(value)
    return out


def _runs(paths: list[str]) -> list[dict[tuple[str, str, str], float]]:
    return [_cells(json.loads(Path(p).read_text())) for p in paths]


DEFAULT_REFERENCE = "rmm CudaAsyncMemoryResource"


def _against(runs: list[dict], key: tuple[str, str, str], reference: str) -> list[float]:
    """The cell over the reference's cell of the same section and size, run by run (runs that
    lack either are left out)."""
    ref = (key[0], reference, key[2])
    return [r[key] / r[ref] for r in runs if key in r and r.get(ref)]


def compare(before: list[str], after: list[str],
            reference: str = DEFAULT_REFERENCE) -> list[dict]:
    b_runs, a_runs = _runs(before), _runs(after)
    keys = sorted(set().union(*b_runs, *a_runs), key=lambda k: (int(k[0]), k[1], int(k[2])))
    rows = []
    for key in keys:
        b = [r[key] for r in b_runs if key in r]
        a = [r[key] for r in a_runs if key in r]
        row = {"section": key[0], "resource": key[1], "bytes": int(key[2]),
               "before_us": statistics.median(b) if b else None,
               "after_us": statistics.median(a) if a else None,
               "before_runs_us": b, "after_runs_us": a}
        row["after_over_before"] = (row["after_us"] / row["before_us"]
                                    if b and a and row["before_us"] else None)
        b_rel, a_rel = _against(b_runs, key, reference), _against(a_runs, key, reference)
        row["before_against_reference"], row["after_against_reference"] = b_rel, a_rel
        row["after_over_before_against_reference"] = (
            statistics.median(a_rel) / statistics.median(b_rel)
            if b_rel and a_rel and key[1] != reference else None)
        rows.append(row)
    return rows


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _times(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec) + "x"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", nargs="+", required=True, help="results files of the old build")
    ap.add_argument("--after", nargs="+", required=True, help="results files of the new build")
    ap.add_argument("--reference", default=DEFAULT_REFERENCE,
                    help="the resource every cell is also divided by, run by run "
                         f"(default: {DEFAULT_REFERENCE})")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    try:
        rows = compare(args.before, args.after, args.reference)
    except (OSError, ValueError) as e:
        print(f"compare_builds: {e}", file=sys.stderr)
        return 2
    print(f"against: {args.reference}, the same section and size, in the same run")
    print("| section | resource | bytes | before (us) | after (us) | after/before "
          "| after/before against | runs before | runs after | against, before | against, after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        spread = lambda xs: " ".join(f"{x:.3f}" for x in xs) or "-"  # noqa: E731
        print(f"| {r['section']} | {r['resource']} | {r['bytes']} | {_fmt(r['before_us'], '.3f')} | "
              f"{_fmt(r['after_us'], '.3f')} | {_times(r['after_over_before'], '.2f')} | "
              f"{_times(r['after_over_before_against_reference'], '.3f')} | "
              f"{spread(r['before_runs_us'])} | {spread(r['after_runs_us'])} | "
              f"{spread(r['before_against_reference'])} | {spread(r['after_against_reference'])} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"before": args.before, "after": args.after,
                                              "reference": args.reference, "rows": rows},
                                             indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
