#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Renders every figure README.md quotes from the committed benchmark results, into the
README's marked blocks (``<!-- figures:NAME -->`` ... ``<!-- /figures:NAME -->``).

    python benchmarks/render_readme.py            # rewrite the blocks from the results
    python benchmarks/render_readme.py --check    # exit 1 if a block or a stray figure differs

The results are the newest committed runs (``asyncmr_bench.committed``); ``--check``
(tests/test_benchmarks.py runs it in CI) also fails on a measured figure (a number with a time,
bandwidth or ratio unit) written in the README outside a block: such a figure would come from no
results file. The documentation's benchmark pages render the rest (docs/_ext/bench_results.py).
Standard library only.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from asyncmr_bench import committed  # noqa: E402
from asyncmr_bench.common import (  # noqa: E402
    ADR, AMR, APR, CC_MANAGED, CC_PINNED, RMM_ASYNC, RMM_ASYNC_MANAGED, RMM_MANAGED, RMM_PINNED,
    RMM_POOL_MANAGED, RMM_POOL_PINNED, median_of,
)

README = ROOT / "README.md"
BLOCK = re.compile(r"(<!-- figures:(?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /figures:(?P=name) -->)",
                   re.S)
# A measured figure: a number with the unit of a time, a bandwidth or a ratio.
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:us|µs|ns|ms|GB/s|x)(?![\w])")


def load() -> dict:
    """The runs the blocks quote: the newest cu13 run that measured section 1."""
    run = committed.newest("cu13", 1)
    if run is None:
        raise SystemExit(f"no committed cu13 run with section 1 under {committed.RESULTS}")
    return {"pairs": run}


def us(doc: dict, name: str, size: int = 4096) -> float | None:
    """Section 1's median pair cost of ``name`` at ``size``, us."""
    entry = ((doc["sections"].get("1_pair_cost") or {}).get("results") or {}).get(name) or {}
    return median_of(entry.get(str(size)))


def fmt(value, digits: int = 2, unit: str = "") -> str:
    if value is None:
        return "n/a"
    text = f"{value:.{digits}f}" if value < 100 else f"{value:.0f}"
    return f"{text}{unit}"


# ---- the blocks --------------------------------------------------------------------------------


def why(runs: dict) -> str:
    run = runs["pairs"]
    d = run.doc

    def cell(label, name):
        return f"{label} {fmt(us(d, name))}"

    return (
        "| 4 KiB alloc+free from Python, us | RMM | RMM's `PoolMemoryResource` over it "
        "| cuda.core (not an RMM resource) | asyncmr |\n|---|---|---|---|---|\n"
        f"| managed | {cell('`ManagedMemoryResource`', RMM_MANAGED)}; "
        f"{cell('`experimental.CudaAsyncManagedMemoryResource`', RMM_ASYNC_MANAGED)} "
        f"| {fmt(us(d, RMM_POOL_MANAGED))} | {cell('`ManagedMemoryResource`', CC_MANAGED)} "
        f"| {cell('`AsyncManagedMR`', AMR)} |\n"
        f"| pinned | {cell('`PinnedHostMemoryResource`', RMM_PINNED)} "
        f"| {fmt(us(d, RMM_POOL_PINNED))} | {cell('`PinnedMemoryResource`', CC_PINNED)} "
        f"| {cell('`AsyncPinnedMR`', APR)} |\n"
        f"| device | {cell('`CudaAsyncMemoryResource`', RMM_ASYNC)} | | "
        f"| {cell('`AsyncDeviceMR`', ADR)} |\n\n"
        f"Medians of the newest committed run of benchmark section 1 ({run.describe()}); every "
        "section's tables and plots: [Benchmarks](docs/benchmarks/results.md).\n")


RENDER = {"why": why}


def render(text: str, docs: dict) -> str:
    def one(m):
        fn = RENDER.get(m.group("name"))
        if fn is None:
            raise SystemExit(f"README.md: unknown figures block {m.group('name')!r}")
        return m.group(1) + fn(docs) + m.group(4)

    return BLOCK.sub(one, text)


def stray_figures(text: str) -> list[str]:
    """Measured figures outside the blocks and outside code (which may hold any number)."""
    outside = BLOCK.sub("", text)
    outside = re.sub(r"```.*?```", "", outside, flags=re.S)
    outside = re.sub(r"`[^`\n]*`", "", outside)
    return [f"line ~{outside[:m.start()].count(chr(10)) + 1}: {m.group(0)!r}"
            for m in FIGURE.finditer(outside)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when README.md differs from the render, or holds a figure "
                             "outside a block")
    parser.add_argument("--readme", type=Path, default=README)
    args = parser.parse_args(argv)
    docs = load()
    text = args.readme.read_text()
    names = {m.group("name") for m in BLOCK.finditer(text)}
    missing = set(RENDER) - names
    rendered = render(text, docs)
    if not args.check:
        args.readme.write_text(rendered)
        print(f"rendered {sorted(names)} into {args.readme}")
        return 0
    problems = [f"no <!-- figures:{n} --> block" for n in sorted(missing)]
    if rendered != text:
        problems.append("a figures block differs from the committed results "
                        "(python benchmarks/render_readme.py rewrites them)")
    problems += [f"a figure outside the blocks, from no results file: {s}"
                 for s in stray_figures(text)]
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
