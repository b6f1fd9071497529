# SPDX-License-Identifier: Apache-2.0
"""Section 3: 1, 2, 4, 8 threads, each looping alloc+free on its own stream; the aggregate
pairs per second, asyncmr against RMM's pool adaptors and CudaAsyncMemoryResource."""

from __future__ import annotations

import gc

from ..common import (
    ADR, AMR, APR, RMM_ASYNC, RMM_POOL_DEVICE, RMM_POOL_MANAGED, RMM_POOL_PINNED,
    SECTION_TITLES, err_text, fmt_ratio, fmt_size, median_of, print_table, ratio, summarize,
)
from ..harness import pool_adaptor, thread_round


def run(cfg, ctx) -> dict:
    am, mr = ctx.asyncmr, ctx.rmm.mr
    contenders = [
        (AMR, lambda: am.AsyncManagedMR()),
        (APR, lambda: am.AsyncPinnedMR()),
        (ADR, lambda: am.AsyncDeviceMR()),
        (RMM_POOL_MANAGED, lambda: pool_adaptor(ctx, mr.ManagedMemoryResource)),
        (RMM_POOL_PINNED, lambda: pool_adaptor(ctx, mr.PinnedHostMemoryResource)),
        (RMM_POOL_DEVICE, lambda: pool_adaptor(ctx, mr.CudaMemoryResource)),
        (RMM_ASYNC, lambda: mr.CudaAsyncMemoryResource()),
    ]
    streams = [ctx.new_stream() for _ in range(max(cfg.thread_counts))]
    results: dict = {}
    for name, factory in contenders:
        try:
            res = factory()
        except Exception as e:  # noqa: BLE001
            results[name] = {"error": err_text(e)}
            continue
        for size in cfg.thread_sizes:
            per_size = results.setdefault(name, {}).setdefault(str(size), {})
            try:
                # Warm every stream, then size the rounds from the single-thread cost.
                for st in streams:
                    for _ in range(50):
                        res.deallocate(res.allocate(size, st), size, st)
                    st.synchronize()
                rate1 = thread_round(res, size, 1, 2000, streams)
                pairs = int(min(max(cfg.thread_round_ms * 1e-3 * rate1, 500), 200_000))
            except Exception as e:  # noqa: BLE001
                per_size["error"] = err_text(e)
                continue
            for n in cfg.thread_counts:
                try:
                    rates = [thread_round(res, size, n, pairs, streams)
                             for _ in range(cfg.thread_repeats)]
                    entry = summarize(rates, "pairs_per_s")
                    entry["pairs_per_thread"] = pairs
                    per_size[str(n)] = entry
                except Exception as e:  # noqa: BLE001
                    per_size[str(n)] = {"error": err_text(e)}
        del res
        gc.collect()
        print(f"  [3] {name} done", flush=True)

    def agg(name, size, n):
        return median_of(results.get(name, {}).get(str(size), {}).get(str(n)), "pairs_per_s")

    ratios = {}
    for ours, theirs in ((AMR, RMM_POOL_MANAGED), (APR, RMM_POOL_PINNED), (ADR, RMM_POOL_DEVICE),
                         (ADR, RMM_ASYNC)):
        ratios[f"{ours} / {theirs}"] = {
            str(size): {str(n): ratio(agg(ours, size, n), agg(theirs, size, n))
                        for n in cfg.thread_counts}
            for size in cfg.thread_sizes}
    return {
        "sizes": cfg.thread_sizes,
        "thread_counts": list(cfg.thread_counts),
        "results": results,
        "ratios": ratios,
        "notes": [
            "each thread runs a tight Python loop of allocate/deallocate on its own non-blocking "
            "stream; RMM's Python allocate/deallocate release the GIL around the C++ call, the "
            "loop itself holds it",
            "aggregate = threads x pairs / (last end - first start); median over rounds",
        ],
    }


def fmt_rate(entry) -> str:
    if not isinstance(entry, dict):
        return "-"
    if "error" in entry:
        return "error"
    return (f"{entry['median_pairs_per_s'] / 1e6:.3f} [{entry['p10_pairs_per_s'] / 1e6:.3f}-"
            f"{entry['p90_pairs_per_s'] / 1e6:.3f}]")


def show(res: dict) -> None:
    counts = res.get("thread_counts", [])
    for size in res.get("sizes", []):
        rows = []
        for name, per in res.get("results", {}).items():
            if "error" in per:
                rows.append([name, f"error: {per['error'][:60]}"] + [""] * (len(counts) - 1))
                continue
            ps = per.get(str(size), {})
            if "error" in ps:
                rows.append([name, f"error: {ps['error'][:60]}"] + [""] * (len(counts) - 1))
                continue
            rows.append([name] + [fmt_rate(ps.get(str(n))) for n in counts])
        print_table(f"{SECTION_TITLES[3]} -- {fmt_size(size)} (M pairs/s: median [p10-p90])",
                    ["contender"] + [f"{n} thr" for n in counts], rows)
        rrows = []
        for rname, per in res.get("ratios", {}).items():
            vals = per.get(str(size), {})
            rrows.append([rname] + [fmt_ratio(vals.get(str(n))) for n in counts])
        print_table("  ratios", ["ratio"] + [f"{n} thr" for n in counts], rrows)
