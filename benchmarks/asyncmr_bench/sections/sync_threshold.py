# SPDX-License-Identifier: Apache-2.0
"""Section 2: rounds of one alloc+free pair and a stream synchronize, with the pool's release
threshold at 0 and at the maximum. At 0 every synchronize may return the memory and the next
allocation maps it again: this is what asyncmr's threshold policy buys."""

from __future__ import annotations

import gc
import time

from ..common import (
    ADR, AMR, APR, RMM_ASYNC, SECTION_TITLES, UINT64_MAX, cell, err_text, fmt_size, median_of,
    print_ratios, print_table, ratio, summarize,
)
from ..harness import trim_to


def _sync_rounds(mr, size: int, stream, cfg) -> list:
    """ns of rounds of one alloc+free pair followed by a stream synchronize."""
    alloc, dealloc, sync = mr.allocate, mr.deallocate, stream.synchronize
    ns = time.perf_counter_ns
    for _ in range(3):  # warm-up
        dealloc(alloc(size, stream), size, stream)
        sync()
    samples = []
    start = time.perf_counter()
    enabled = gc.isenabled()
    gc.disable()
    try:
        while len(samples) < cfg.sync_rounds and (
                len(samples) < 5 or time.perf_counter() - start < cfg.sync_budget_s):
            t0 = ns()
            dealloc(alloc(size, stream), size, stream)
            sync()
            samples.append(ns() - t0)
    finally:
        if enabled:
            gc.enable()
    return samples


def run(cfg, ctx) -> dict:
    am, mr = ctx.asyncmr, ctx.rmm.mr
    s = ctx.stream
    results: dict = {}
    ratios: dict = {}
    reserved_after: dict = {}

    # Baseline: what a synchronize of an idle stream costs alone.
    samples = []
    for _ in range(max(cfg.sync_rounds, 20)):
        t0 = time.perf_counter_ns()
        s.synchronize()
        samples.append(time.perf_counter_ns() - t0)
    results["stream.synchronize() alone"] = {"any": summarize(samples, "us", 1e-3)}

    # Ours: the default pools, the ones the threshold policy acts on. The attribute is
    # process-wide, so the original value is restored afterwards.
    for base, cls in ((AMR, am.AsyncManagedMR), (APR, am.AsyncPinnedMR), (ADR, am.AsyncDeviceMR)):
        try:
            res = cls()
        except Exception as e:  # noqa: BLE001
            results[base] = {"error": err_text(e)}
            continue
        attrs = res.attributes
        original = attrs.release_threshold
        try:
            for label, value in (("0", 0), ("max", UINT64_MAX)):
                name = f"{base} threshold={label}"
                attrs.release_threshold = value
                s.synchronize()
                trim_to(res, 0)  # start each setting from an empty pool
                for size in cfg.sizes:
                    try:
                        results.setdefault(name, {})[str(size)] = summarize(
                            _sync_rounds(res, size, s, cfg), "us", 1e-3)
                        reserved_after.setdefault(name, {})[str(size)] = \
                            attrs.reserved_mem_current
                    except Exception as e:  # noqa: BLE001
                        results.setdefault(name, {})[str(size)] = {"error": err_text(e)}
        except Exception as e:  # noqa: BLE001
            results.setdefault(base, {})["error"] = err_text(e)
        finally:
            try:
                attrs.release_threshold = original
            except Exception as e:  # noqa: BLE001
                results.setdefault(base, {})["restore_error"] = err_text(e)
        ratios[base] = {str(sz): ratio(
            median_of(results.get(f"{base} threshold=0", {}).get(str(sz))),
            median_of(results.get(f"{base} threshold=max", {}).get(str(sz))))
            for sz in cfg.sizes}
        del res
        print(f"  [2] {base} done", flush=True)

    # RMM's device resource owns its pool and takes the threshold as an argument.
    for label, kwargs in (("0", {"release_threshold": 0}), ("max", {})):
        name = f"{RMM_ASYNC} threshold={label}"
        try:
            res = mr.CudaAsyncMemoryResource(**kwargs)
        except Exception as e:  # noqa: BLE001
            results[name] = {"error": err_text(e)}
            continue
        for size in cfg.sizes:
            try:
                results.setdefault(name, {})[str(size)] = summarize(
                    _sync_rounds(res, size, s, cfg), "us", 1e-3)
            except Exception as e:  # noqa: BLE001
                results.setdefault(name, {})[str(size)] = {"error": err_text(e)}
        del res
    ratios[RMM_ASYNC] = {str(sz): ratio(
        median_of(results.get(f"{RMM_ASYNC} threshold=0", {}).get(str(sz))),
        median_of(results.get(f"{RMM_ASYNC} threshold=max", {}).get(str(sz))))
        for sz in cfg.sizes}
    gc.collect()
    return {
        "sizes": cfg.sizes,
        "results": results,
        "ratios": {"threshold 0 / threshold max (round time)": ratios},
        "reserved_after_round_bytes": reserved_after,
        "notes": [
            "a round = allocate, deallocate, stream.synchronize(), timed together; "
            f"up to {cfg.sync_rounds} rounds or {cfg.sync_budget_s} s per contender and size",
            "ours run on the default pools with release_threshold set to 0, then to the "
            "maximum, then restored; at 0 every synchronize may hand the memory back, and the "
            "next allocation maps it again",
        ],
    }


def show(res: dict) -> None:
    sizes = res.get("sizes", [])
    header = ["contender (us per round: median [p10-p90])"] + [fmt_size(s) for s in sizes]
    rows = []
    for name, per in res.get("results", {}).items():
        if "any" in per:
            rows.append([name] + [cell(per["any"])] * len(sizes))
        elif "error" in per and len(per) == 1:
            rows.append([name, f"error: {per['error'][:60]}"] + [""] * (len(sizes) - 1))
        else:
            rows.append([name] + [cell(per.get(str(s))) for s in sizes])
    print_table(SECTION_TITLES[2], header, rows)
    print_ratios(res.get("ratios", {}), sizes)
