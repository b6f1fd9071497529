#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Renders every figure README.md quotes from the committed benchmark results, into the
README's marked blocks (``<!-- figures:NAME -->`` ... ``<!-- /figures:NAME -->``).

    python benchmarks/render_readme.py            # rewrite the blocks from the results
    python benchmarks/render_readme.py --check    # exit 1 if a block or a stray figure differs

The results are the files RESULTS names; ``--check`` (tests/test_benchmarks.py runs it in CI)
also fails on a measured figure (a number with a time, bandwidth or ratio unit) written in the
README outside a block: such a figure would come from no results file. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from asyncmr_bench import targets as targets_mod  # noqa: E402
from asyncmr_bench.common import (  # noqa: E402
    ADR, AMR, APR, APR_CACHED, APR_CACHED_DEFAULT, APR_NEW, CC_MANAGED, CC_PINNED, CUPY_PINNED,
    RMM_ASYNC, RMM_ASYNC_MANAGED, RMM_MANAGED, RMM_PINNED, RMM_POOL_MANAGED, RMM_POOL_PINNED,
    floor_of, median_of, with_release_gil,
)

#: The committed runs the README quotes.
RESULTS = {"cu13": HERE / "results" / "cu13" / "quick-h200" / "results.json",
           "cu12": HERE / "results" / "cu12" / "quick-h200" / "results.json"}
README = ROOT / "README.md"
BLOCK = re.compile(r"(<!-- figures:(?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /figures:(?P=name) -->)",
                   re.S)
# A measured figure: a number with the unit of a time, a bandwidth or a ratio.
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:us|µs|ns|ms|GB/s|x)(?![\w])")


def load(variant: str) -> dict:
    return json.loads(RESULTS[variant].read_text())


def us(doc: dict, name: str, size: int = 4096) -> float | None:
    """Section 1's median pair cost of ``name`` at ``size``, us."""
    entry = ((doc["sections"].get("1_pair_cost") or {}).get("results") or {}).get(name) or {}
    return median_of(entry.get(str(size)))


def fmt(value, digits: int = 2, unit: str = "") -> str:
    if value is None:
        return "n/a"
    text = f"{value:.{digits}f}" if value < 100 else f"{value:.0f}"
    return f"{text}{unit}"


def run_date(doc: dict) -> str:
    meta = doc.get("meta") or {}
    return (f"{meta.get('gpu', '?')}, driver {meta.get('driver', '?')}, "
            f"{str(meta.get('date', '?'))[:16].replace('T', ' ')} UTC")


# ---- the blocks --------------------------------------------------------------------------------


def why(docs: dict) -> str:
    d = docs["cu13"]
    return (
        "| you need | today | asyncmr |\n|---|---|---|\n"
        f"| managed memory | `ManagedMemoryResource`: synchronous `cudaMallocManaged`, "
        f"{fmt(us(d, RMM_MANAGED), 1)} us a pair | `AsyncManagedMR`: CUDA 13 managed pool, "
        f"stream-ordered, {fmt(us(d, AMR))} us a pair |\n"
        f"| pinned host memory | `PinnedHostMemoryResource`: synchronous `cudaHostAlloc`, "
        f"{fmt(us(d, RMM_PINNED), 0)} us a pair | `AsyncPinnedMR`: host pool (CUDA 12.6+), "
        f"stream-ordered, {fmt(us(d, APR))} us a pair |\n"
        "| bounded, observable pools | `PoolMemoryResource` over either: fragments, never gives "
        "memory back | `release_threshold`, `trim_to()`, peaks per phase, `reuse_*` |\n\n"
        f"(4 KiB alloc+free pairs from Python, medians of the committed run: {run_date(d)}; "
        "see [Benchmarks](#benchmarks).)\n")


def cuda12(docs: dict) -> str:
    d = docs["cu12"]
    return (f"its pair costs are committed in `benchmarks/results/cu12/`: through CUDA 13's "
            f"default pinned pool (`AsyncPinnedMR()`) {fmt(us(d, APR))} us and through a created "
            f"one (`AsyncPinnedMR(pool=\"new\")`) {fmt(us(d, APR_NEW))} us at 4 KiB "
            f"({run_date(d)}).\n")


def gil(docs: dict) -> str:
    g = docs["cu13"]["sections"].get("7_gil") or {}
    stall = (g.get("stall") or {}).get("results") or {}

    def gap(mode):
        e = stall.get(with_release_gil(APR_NEW, mode)) or {}
        return ((e.get("longest_gap") or {}).get("median_ms"))

    th = g.get("threads") or {}
    n = str(max(th.get("thread_counts") or [8]))
    tres = th.get("results") or {}

    def agg(name):
        return ((tres.get(name) or {}).get(n) or {}).get("median_pairs_per_s")

    ours, theirs = agg(with_release_gil(ADR, "auto")), agg(RMM_ASYNC)
    pair = g.get("pair_cost") or {}
    ratios = [((e or {}).get("auto_over_never") or {}).get("median_ratio")
              for e in (pair.get("results") or {}).values()]
    ratios = [r for r in ratios if isinstance(r, (int, float))]
    grow = (g.get("stall") or {}).get("grow_bytes") or (2 << 30)
    return (f"On the H200 a Python thread's longest stall while another grew a new pinned pool by "
            f"{grow >> 30} GiB was {fmt(gap('auto'), 1)} ms (held through it: "
            f"{fmt(gap('never'), 0)} ms); {n} threads made "
            f"{fmt(ours / theirs if ours and theirs else None, 1)}x the pairs of rmm's "
            f"`CudaAsyncMemoryResource`; a single thread's pair costs "
            f"{fmt(max(ratios) if ratios else None)}x holding the GIL always (`\"never\"`, worst "
            "pool kind).\n")


def benchmarks(docs: dict) -> str:
    d = docs["cu13"]
    s = d["sections"]
    ts = targets_mod.compute_targets(d)
    met, counted, not_run = targets_mod.tally(ts)
    out = [f"The committed run ({run_date(d)}, {'quick' if d['params'].get('quick') else 'full'}"
           f" mode, {d['meta'].get('variant', 'cu13')} build, "
           "`benchmarks/results/cu13/quick-h200/`) meets "
           f"{met} of its {counted} targets"
           + (f" ({not_run} not run)" if not_run else "") + ":\n"]
    rows = [("AsyncDeviceMR / AsyncPinnedMR / AsyncManagedMR", (ADR, APR, AMR)),
            ("the driver calls alone on the same pools (same process and rounds)",
             (floor_of(ADR), floor_of(APR), floor_of(AMR))),
            ("rmm CudaAsyncMemoryResource / experimental CudaAsyncManagedMemoryResource",
             (RMM_ASYNC, RMM_ASYNC_MANAGED)),
            ("rmm PoolMemoryResource over ManagedMemoryResource / PinnedHostMemoryResource",
             (RMM_POOL_MANAGED, RMM_POOL_PINNED)),
            ("cuda.core ManagedMemoryResource / PinnedMemoryResource", (CC_MANAGED, CC_PINNED)),
            ("rmm ManagedMemoryResource / PinnedHostMemoryResource", (RMM_MANAGED, RMM_PINNED))]
    out.append("| alloc+free pair from Python, 4 KiB | us |\n|---|---|")
    for label, names in rows:
        out.append(f"| {label} | {' / '.join(fmt(us(d, n)) for n in names)} |")
    out.append("")
    lines = []
    cp = (s.get("8_cupy_pinned_staging") or {}).get("results") or {}
    if cp:
        am = next((v for k, v in cp.items() if k.startswith("asyncmr")), {})
        cu = cp.get(CUPY_PINNED) or {}

        def gbps(e, direction):
            return (e.get(direction) or {}).get("GBps")

        lines.append(
            f"- **CuPy staging** (section 8): asyncmr's pool as CuPy's pinned allocator moves "
            f"{fmt(gbps(am, 'H2D'), 1)} / {fmt(gbps(am, 'D2H'), 1)} GB/s (H2D / D2H), CuPy's "
            f"`PinnedMemoryPool` {fmt(gbps(cu, 'H2D'), 1)} / {fmt(gbps(cu, 'D2H'), 1)} GB/s; pinned "
            f"bytes held after release: {am.get('held_after_release_bytes')} / "
            f"{cu.get('held_after_release_bytes')}.")
    pa = (s.get("9_pinned_arrays") or {}).get("ratios") or {}
    if pa:
        lines.append("- **Pinned NumPy arrays** (section 9): `pinned_empty` copies at "
                     f"{fmt(min(pa.values()), 4)}x the bandwidth of `cudaHostAlloc` memory.")
    cd = s.get("10_cudf_parquet") or {}
    if cd.get("results"):
        res = cd["results"]
        default = res.get("cuDF default pinned resource") or {}
        ours = next((v for k, v in res.items() if k.startswith("asyncmr")), {})

        def ms(e, what):
            v = (e.get(what) or {}).get("median_s")
            return v * 1e3 if isinstance(v, (int, float)) else None

        table = cd.get("table") or {}
        lines.append(
            f"- **cuDF Parquet** (section 10, {table.get('rows', 0) / 1e6:.1f} M rows, write then "
            f"read): cuDF's default pinned resource {fmt(ms(default, 'write'), 1)} / "
            f"{fmt(ms(default, 'read'), 1)} ms, asyncmr's pool {fmt(ms(ours, 'write'), 1)} / "
            f"{fmt(ms(ours, 'read'), 1)} ms; the data read back equal: "
            f"{bool(default.get('data_equal')) and bool(ours.get('data_equal'))}.")
    fc = ((s.get("11_front_cache") or {}).get("python") or {}).get("results") or {}
    if fc:
        def pair_us(name):
            return fmt(((fc.get(name) or {}).get('4096') or {}).get('median_us'))

        default = ""
        if (fc.get(APR_CACHED_DEFAULT) or {}).get("4096"):
            default = f", {pair_us(APR_CACHED_DEFAULT)} us on the default (legacy) stream"
        lines.append(
            f"- **Front cache** (section 11): a cached `AsyncPinnedMR` pair "
            f"{pair_us(APR_CACHED)} us on a created stream{default}; CuPy's `PinnedMemoryPool` "
            f"{pair_us(CUPY_PINNED)} us (4 KiB).")
    if lines:
        out.append("The doors and the front cache, in the same run:")
        out.extend(lines)
        out.append("")
    misses = [t for t in ts if t.get("status") == targets_mod.NOT_MET]
    if misses:
        out.append("Not met (the reasons: `benchmarks/README.md`):")
        for t in misses:
            v = t.get("value")
            shown = (fmt(v, 3) if isinstance(v, float) else v) if v is not None else \
                "not measured in this run"
            out.append(f"- {t['name']}: {shown} (wanted {t['target']})")
        out.append("")
    return "\n".join(out)


RENDER = {"why": why, "cuda12": cuda12, "gil": gil, "benchmarks": benchmarks}


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
    docs = {v: load(v) for v in RESULTS}
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
