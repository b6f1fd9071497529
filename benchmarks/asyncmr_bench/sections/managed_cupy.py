# SPDX-License-Identifier: Apache-2.0
"""Section 6: a managed-memory CuPy pipeline with many short-lived temporaries, through
``rmm_cupy_allocator`` on each managed resource (and CuPy's own device pool for reference)."""

from __future__ import annotations

import gc
import math
import time

from ..common import (
    AMR, CUPY_DEFAULT, RMM_ASYNC_MANAGED, RMM_MANAGED, RMM_POOL_MANAGED, SECTION_TITLES, err_text,
    median_of, print_ratio_values, print_table, ratio, seconds_row, summarize,
)
from ..harness import pool_adaptor, rmm_async_managed_class


def _cupy_pipeline(cp, iters: int, n: int) -> float:
    """Elementwise work and reductions that leave ~12 temporaries per iteration
    (n-sized, half-sized, small and scalar)."""
    x = cp.arange(n, dtype=cp.float32) * (1.0 / n)
    acc = cp.zeros((), dtype=cp.float32)
    half = n // 2
    for i in range(iters):
        a = x * 1.0001 + float(i % 13)
        b = cp.sin(a) * cp.cos(a)
        c = b[:half] + b[half:]
        small = cp.ones(256 + (i % 7) * 128, dtype=cp.float32)
        d = cp.sqrt(cp.abs(c)) + small.sum()
        acc += d.mean()
    return float(acc)  # copies to the host: the work is done


def run(cfg, ctx) -> dict:
    cp, cstream = ctx.cupy()
    from rmm.allocators.cupy import rmm_cupy_allocator

    am, mr = ctx.asyncmr, ctx.rmm.mr
    contenders = [
        (AMR, lambda: am.AsyncManagedMR()),
        (RMM_MANAGED, lambda: mr.ManagedMemoryResource()),
        (RMM_POOL_MANAGED, lambda: pool_adaptor(ctx, mr.ManagedMemoryResource)),
        (RMM_ASYNC_MANAGED, lambda: rmm_async_managed_class(ctx)()),
        (CUPY_DEFAULT, None),
    ]
    get_alloc = getattr(cp.cuda, "get_allocator", None) or cp.cuda.memory.get_allocator
    previous_allocator = get_alloc()
    previous_mr = mr.get_current_device_resource()
    results: dict = {}
    checks = {}
    try:
        for name, factory in contenders:
            try:
                if factory is None:
                    cp.cuda.set_allocator(cp.get_default_memory_pool().malloc)
                else:
                    mr.set_current_device_resource(factory())
                    cp.cuda.set_allocator(rmm_cupy_allocator)
                with cstream:
                    _cupy_pipeline(cp, max(cfg.cupy_iters // 10, 5), cfg.cupy_elems)  # warm-up
                    times = []
                    for _ in range(cfg.cupy_repeats):
                        cstream.synchronize()
                        t0 = time.perf_counter_ns()
                        value = _cupy_pipeline(cp, cfg.cupy_iters, cfg.cupy_elems)
                        cstream.synchronize()
                        times.append(time.perf_counter_ns() - t0)
                e = summarize(times, "s", 1e-9)
                e["ms_per_iteration"] = e["median_s"] * 1e3 / cfg.cupy_iters
                results[name] = e
                checks[name] = value
            except Exception as e:  # noqa: BLE001
                results[name] = {"error": err_text(e)}
            finally:
                cp.cuda.set_allocator(previous_allocator)
                mr.set_current_device_resource(previous_mr)
                gc.collect()
                if factory is None:
                    cp.get_default_memory_pool().free_all_blocks()
            print(f"  [6] {name} done", flush=True)
    finally:
        cp.cuda.set_allocator(previous_allocator)
        mr.set_current_device_resource(previous_mr)
    ref = checks.get(AMR)
    agree = {n: (ref is not None and math.isclose(v, ref, rel_tol=1e-4)) for n, v in checks.items()}
    return {
        "results": results,
        "ratios": {
            f"{n} / {AMR} (wall time)": ratio(median_of(results.get(n), "s"),
                                                 median_of(results.get(AMR), "s"))
            for n in (RMM_MANAGED, RMM_POOL_MANAGED, RMM_ASYNC_MANAGED, CUPY_DEFAULT)
        },
        "pipeline": {"iterations": cfg.cupy_iters, "elements": cfg.cupy_elems,
                     "dtype": "float32", "temporaries_per_iteration": 12,
                     "result_values": checks, "results_agree_with_AsyncManagedMR": agree},
        "notes": [
            "CuPy allocates through rmm.allocators.cupy.rmm_cupy_allocator with each resource "
            "as RMM's current device resource, on a non-blocking CuPy stream",
            f"{CUPY_DEFAULT}: CuPy's own caching pool of device memory, for reference "
            "(not managed memory)",
        ],
    }


def show(res: dict) -> None:
    p = res.get("pipeline", {})
    rows = []
    for name, e in res.get("results", {}).items():
        rows.append(seconds_row(name, e, f"{e.get('ms_per_iteration', 0):.3f}"))
    print_table(f"{SECTION_TITLES[6]} -- {p.get('iterations')} iterations of "
                f"{p.get('elements')} float32",
                ["allocator", "wall ms (median)", "[p10-p90]", "ms/iteration"], rows)
    print_ratio_values(res.get("ratios", {}))
    bad = [n for n, ok in p.get("results_agree_with_AsyncManagedMR", {}).items() if not ok]
    if bad:
        print(f"  WARNING: pipeline results differ from AsyncManagedMR's for: {', '.join(bad)}")
