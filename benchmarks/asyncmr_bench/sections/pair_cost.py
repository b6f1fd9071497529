# SPDX-License-Identifier: Apache-2.0
"""Section 1: the cost of one alloc+free pair from Python, every resource a user has, against
the raw floor of the driver calls on the same pools (in process, same rounds) and the C++
program's floor and resource-reference numbers.

Both pinned rows are always there, each with its floor: ``AsyncPinnedMR`` (the default pinned
pool: CUDA 13's, or on a cu12 build asyncmr's process-wide stand-in) and
``AsyncPinnedMR(pool='new')`` (a created pool), so a cu12 and a cu13 run compare directly.
"""

from __future__ import annotations

import gc

from .. import floor
from ..common import (
    ADR, ADR_NEW, AMR, AMR_NEW, APR, APR_NEW, CC_MANAGED, CC_PINNED, CUPY_ASYNC, FLOOR_POOL_OF,
    RMM_ASYNC, RMM_ASYNC_MANAGED, RMM_MANAGED, RMM_PINNED, RMM_POOL_MANAGED, RMM_POOL_PINNED,
    SECTION_TITLES, cell, err_text, floor_of, fmt_size, median_of, print_ratios, print_table,
    ratio,
)
from ..harness import (
    POOL_ADAPTOR_INITIAL, cc_class, pool_adaptor, rmm_async_managed_class, time_pairs,
)


def contenders(ctx):
    """(name, family, factory) of every contender of section 1."""
    am, mr = ctx.asyncmr, ctx.rmm.mr
    return [
        (AMR, "rmm", lambda: am.AsyncManagedMR()),
        (AMR_NEW, "rmm", lambda: am.AsyncManagedMR(pool="new")),
        (APR, "rmm", lambda: am.AsyncPinnedMR()),
        (APR_NEW, "rmm", lambda: am.AsyncPinnedMR(pool="new")),
        (ADR, "rmm", lambda: am.AsyncDeviceMR()),
        (ADR_NEW, "rmm", lambda: am.AsyncDeviceMR(pool="new")),
        (RMM_ASYNC, "rmm", lambda: mr.CudaAsyncMemoryResource()),
        (RMM_ASYNC_MANAGED, "rmm", lambda: rmm_async_managed_class(ctx)()),
        (RMM_MANAGED, "rmm", lambda: mr.ManagedMemoryResource()),
        (RMM_PINNED, "rmm", lambda: mr.PinnedHostMemoryResource()),
        (RMM_POOL_MANAGED, "rmm", lambda: pool_adaptor(ctx, mr.ManagedMemoryResource)),
        (RMM_POOL_PINNED, "rmm", lambda: pool_adaptor(ctx, mr.PinnedHostMemoryResource)),
        (CC_MANAGED, "cuda.core", lambda: cc_class(ctx, "ManagedMemoryResource")()),
        (CC_PINNED, "cuda.core", lambda: cc_class(ctx, "PinnedMemoryResource")()),
        (CUPY_ASYNC, "cupy", lambda: ctx.cupy()[0].cuda.MemoryAsyncPool()),
    ]


def run(cfg, ctx) -> dict:
    results: dict = {}
    built = {}
    for name, family, factory in contenders(ctx):
        results[name] = {}  # rows in contender order
        try:
            built[name] = (family, factory())
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            results[name] = {"error": err_text(e)}

    # The raw floor of each asyncmr resource's own pool (two driver calls in a C++ loop), timed
    # as one more contender: in the same interleaved rounds as the Python resources. The
    # resource stays in `built`, so its pool outlives the rounds.
    lib, why_not = floor.load_floor_library(cfg)
    in_process = {"library": str(lib.path), "optimized": lib.optimized} if lib else why_not
    for name in FLOOR_POOL_OF:
        if lib is not None and name in built:
            results[floor_of(name)] = {}
            built[floor_of(name)] = ("floor", (lib, built[name][1].pool_handle))
        elif lib is None:
            results[floor_of(name)] = dict(why_not)

    for size in cfg.sizes:
        time_pairs(ctx, built, size, cfg.repeats, results, cfg)
        print(f"  [1] {fmt_size(size)} done", flush=True)
    del built
    gc.collect()

    cpp = floor.run_floor(cfg)
    return {
        "sizes": cfg.sizes,
        "results": results,
        "floor_in_process": in_process,
        "cpp": cpp,
        "ratios": ratios(results, cpp, cfg.sizes),
        "notes": [
            "median/p10/p90 over rounds of N pairs on one non-blocking stream; N sized so a "
            f"round lasts about {cfg.round_ms} ms (at least 3 pairs)",
            "raw floor, in process: cudaMallocFromPoolAsync + cudaFreeAsync on the resource's "
            "own pool in a C++ loop (libasyncmr_floor through ctypes), in the same rounds",
            f"PoolMemoryResource adaptors start with initial_pool_size={POOL_ADAPTOR_INITIAL}",
            "cuda.core: Buffer = mr.allocate(size, stream=s); Buffer.close(s). "
            "cupy: MemoryAsyncPool.malloc(size) on a non-blocking CuPy stream, freed when the "
            "MemoryPointer dies",
        ],
    }


def ratios(results: dict, cpp: dict, sizes) -> dict:
    """The ratios of this section, for readers of the JSON. The targets do not read these:
    targets.py recomputes them from the medians above."""
    def med(name, size):
        return median_of(results.get(name, {}).get(str(size)))

    def per_size(num, den):
        return {str(s): ratio(med(num, s), med(den, s)) for s in sizes}

    python_floor = {name: per_size(name, floor_of(name)) for name in FLOOR_POOL_OF}
    out = {
        "AsyncPinnedMR / floor(pinned_default_host)": python_floor[APR],
        "PoolMemoryResource(PinnedHost) / AsyncPinnedMR": per_size(RMM_POOL_PINNED, APR),
        "cuda.core Pinned / AsyncPinnedMR": per_size(CC_PINNED, APR),
        "AsyncManagedMR / rmm experimental managed": per_size(AMR, RMM_ASYNC_MANAGED),
        "PoolMemoryResource(Managed) / AsyncManagedMR": per_size(RMM_POOL_MANAGED, AMR),
        "cuda.core Managed / AsyncManagedMR": per_size(CC_MANAGED, AMR),
        "AsyncDeviceMR / rmm CudaAsyncMemoryResource": per_size(ADR, RMM_ASYNC),
        # A created pinned pool against the default one (CUDA 13's, or cu12's stand-in).
        "AsyncPinnedMR(pool='new') / AsyncPinnedMR": per_size(APR_NEW, APR),
        "python / floor": python_floor,
        "via_ref / floor": {},
    }
    # The C++ program times the floor and the same pools through the reference in alternating
    # rounds and reports the median of the per-round ratios.
    paired = cpp.get("via_ref_over_floor") if isinstance(cpp, dict) else None
    for pool, per in (paired or {}).items():
        out["via_ref / floor"][pool] = {
            str(s): per[str(s)]["median"] if str(s) in per else None for s in sizes}
    return out


def show(res: dict) -> None:
    sizes = res.get("sizes", [])
    header = ["contender (us per pair: median [p10-p90])"] + [fmt_size(s) for s in sizes]
    rows = []
    for name, per in res.get("results", {}).items():
        for why in ("error", "skipped"):
            if why in per:
                rows.append([name, f"{why}: {per[why][:60]}"] + [""] * (len(sizes) - 1))
                break
        else:
            rows.append([name] + [cell(per.get(str(s))) for s in sizes])
    cpp = res.get("cpp", {})
    for way, label in (("floor", "C++ floor"), ("via_ref", "C++ via device_async_resource_ref")):
        for pool, per in (cpp.get(way) or {}).items():
            rows.append([f"{label}: {pool}"] + [cell(per.get(str(s)), digits=3) for s in sizes])
    print_table(SECTION_TITLES[1], header, rows)
    for k in ("skipped", "error"):
        if k in res.get("floor_in_process", {}):
            print(f"  in-process floor {k}: {res['floor_in_process'][k]}")
        if k in cpp:
            print(f"  C++ floor program {k}: {cpp[k]}")
    for pool, msg in (cpp.get("errors") or {}).items():
        print(f"  C++ floor error [{pool}]: {msg}")
    for n, per in res.get("results", {}).items():
        if "error" in per:
            print(f"  error [{n}]: {per['error']}")
    errs = [(n, s, e["error"]) for n, per in res.get("results", {}).items() if "error" not in per
            for s, e in per.items() if isinstance(e, dict) and "error" in e]
    for n, s, e in errs:
        print(f"  error [{n} @ {fmt_size(int(s))}]: {e}")
    print_ratios(res.get("ratios", {}), sizes)
