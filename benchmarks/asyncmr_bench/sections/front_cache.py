# SPDX-License-Identifier: Apache-2.0
"""Section 11: the per-stream front cache (``cache=`` on the resources), measured in
one run:

1. **From Python**, alloc+free pairs at 4 KiB and 64 KiB on one stream, in interleaved rounds:
   ``AsyncPinnedMR(pool="new", cache=64 MiB)`` (every pair after the first is a hit),
   the same called with no stream (RMM's default stream, the legacy stream: what a Python user
   types, and the stream whose puts set no marker), ``AsyncPinnedMR(pool="new")`` (the driver
   pool), CuPy's ``PinnedMemoryPool`` (a host-side free list, not stream-ordered:
   ``pool.malloc(n)`` dropped at once is one pair), and the raw floor
   of the uncached pool in process when ``libasyncmr_floor.so`` is built. Then the cache's
   ``cache_info`` (hits, bytes against the cap), and the bytes left after ``release_cache()``.
2. **The C++ program** ``cache_bench`` (``benchmarks/cpp``): a hit pair through
   ``rmm::device_async_resource_ref`` against the uncached resource and the raw floor on the same
   pool (pinned, device, managed), the driver calls a hit makes, each alone
   (``cuStreamIsCapturing``, ``cuStreamGetId``, ``cuEventRecord``: the put's marker; the bare
   cache's take+put; and ``cuStreamQuery``, which a put does not make: whether the stream is
   idle, the one sound way to skip the marker), and 8 threads on
   8 streams against one thread on one cached pinned resource. Skipped, with the reason, when the
   program is not built: the Python half still runs.

   Also from Python: ``AsyncDeviceMR(pool="new", cache=64 MiB)`` against PyTorch's caching
   allocator (``torch.cuda.caching_allocator_alloc`` / ``caching_allocator_delete`` on a torch
   stream: what PyTorch users compare against), and 8 Python threads on their own streams
   against one on a cached pinned resource.

Targets (targets.py), from the raw rounds: the cached pinned pair from Python <= 0.45x CuPy's
and the cached device pair <= 0.25x PyTorch's (median of per-round ratios at 4 KiB and
64 KiB); a pinned hit through the reference <= 150 ns (C++, both sizes); 8 threads >= 4x one
thread in C++ and >= 3x from Python (cached pinned, 4 KiB, median of per-round ratios).
"""

from __future__ import annotations

import gc

from .. import floor
from ..common import (
    ADR_CACHED, APR_CACHED, APR_CACHED_DEFAULT, APR_NEW, CUPY_PINNED, FRONT_CACHE_BYTES, KiB,
    SECTION_TITLES, TORCH_CACHING, cell, err_text, floor_of, fmt_ratio, fmt_size, median_difference,
    median_ratio, percentile, print_table,
)
from ..harness import thread_round, time_pairs

SIZES = (4 * KiB, 64 * KiB)


def _torch():
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("PyTorch sees no CUDA device")
    return torch


def _python_threads(cfg, ctx, nthreads: int = 8, size: int = 4 * KiB) -> dict:
    """Aggregate pairs/s of ``nthreads`` Python threads on their own streams against one thread,
    on one cached pinned resource, in alternating rounds (the per-round ratio is the figure)."""
    am = ctx.asyncmr
    try:
        mr = am.AsyncPinnedMR(pool="new", cache=FRONT_CACHE_BYTES)
        streams = [ctx.new_stream() for _ in range(nthreads)]
        pairs = 20000 if cfg.quick else 100000
        thread_round(mr, size, 1, pairs // 10, streams)  # warm every thread's bucket
        thread_round(mr, size, nthreads, pairs // 10, streams)
        one, many, released = [], [], []
        for _ in range(cfg.cache_rounds):
            one.append(thread_round(mr, size, 1, pairs, streams))
            many.append(thread_round(mr, size, nthreads, pairs, streams))
            # The same threads with the GIL released around every call: what a design that
            # lets threads overlap their C++ halves would reach (reported, no target).
            mr.release_gil = "always"
            try:
                released.append(thread_round(mr, size, nthreads, pairs, streams))
            finally:
                mr.release_gil = "auto"
        return {"threads": nthreads, "bytes": size, "pairs_per_thread": pairs,
                "rounds_pairs_per_s": {"1": one, str(nthreads): many,
                                       f"{nthreads} release_gil=always": released},
                "scaling_per_round": [b / a for a, b in zip(one, many) if a]}
    except Exception as e:  # noqa: BLE001 - recorded
        return {"error": err_text(e)}


def _python_pairs(cfg, ctx) -> dict:
    am = ctx.asyncmr
    contenders = [
        (APR_CACHED, "rmm", lambda: am.AsyncPinnedMR(pool="new", cache=FRONT_CACHE_BYTES)),
        (APR_CACHED_DEFAULT, "rmm_default",
         lambda: am.AsyncPinnedMR(pool="new", cache=FRONT_CACHE_BYTES)),
        (APR_NEW, "rmm", lambda: am.AsyncPinnedMR(pool="new")),
        (CUPY_PINNED, "cupy", lambda: ctx.cupy()[0].cuda.PinnedMemoryPool()),
        (ADR_CACHED, "rmm", lambda: am.AsyncDeviceMR(pool="new", cache=FRONT_CACHE_BYTES)),
        (TORCH_CACHING, "torch", _torch),
    ]
    results: dict = {}
    built: dict = {}
    for name, family, factory in contenders:
        results[name] = {}
        try:
            built[name] = (family, factory())
        except Exception as e:  # noqa: BLE001 - recorded, the others go on
            results[name] = {"error": err_text(e)}
    lib, why_not = floor.load_floor_library(cfg)
    if lib is not None and APR_NEW in built:
        results[floor_of(APR_NEW)] = {}
        built[floor_of(APR_NEW)] = ("floor", (lib, built[APR_NEW][1].pool_handle))
    elif lib is None:
        results[floor_of(APR_NEW)] = dict(why_not)

    for size in SIZES:
        time_pairs(ctx, built, size, cfg.cache_rounds, results, cfg, keep_rounds=True)
        print(f"  [11] Python pairs {fmt_size(size)} done", flush=True)

    cache = _cache_accounting(built.get(APR_CACHED, (None, None))[1], ctx)
    del built
    gc.collect()
    threads = _python_threads(cfg, ctx)
    print("  [11] Python threads done", flush=True)
    return {"results": results, "cache_info": cache, "threads": threads,
            "floor_in_process": {"library": str(lib.path)} if lib else why_not}


def _cache_accounting(mr, ctx) -> dict:
    """The cached resource's ``cache_info`` after the run, and what ``release_cache`` leaves."""
    if mr is None:
        return {"error": "the cached resource was not built"}
    try:
        ctx.stream.synchronize()
        info = dict(mr.cache_info)
        out = {"after_run": info,
               "hits_positive": info.get("hits", 0) > 0,
               "bytes_within_cap": info.get("bytes", 0) <= info.get("cap", 0),
               "charged_high_within_cap": info.get("charged_high", 0) <= info.get("cap", 0)}
        used_before = mr.attributes.used_mem_current
        mr.release_cache()
        after = mr.cache_info
        out["after_release_cache"] = {
            "bytes": after.get("bytes"), "blocks": after.get("blocks"),
            "pool_used_mem_current_before": used_before,
            "pool_used_mem_current": mr.attributes.used_mem_current}
        return out
    except Exception as e:  # noqa: BLE001
        return {"error": err_text(e)}


def run(cfg, ctx) -> dict:
    python = _python_pairs(cfg, ctx)
    cpp = floor.run_cache_bench(cfg, SIZES, FRONT_CACHE_BYTES)
    print("  [11] C++ cache_bench " + ("done" if "pairs" in cpp else
                                       f"{'skipped' if 'skipped' in cpp else 'failed'}"),
          flush=True)
    return {
        "sizes": list(SIZES),
        "cache_bytes": FRONT_CACHE_BYTES,
        "rounds": cfg.cache_rounds,
        "python": python,
        "cpp": cpp,
        "notes": [
            "Python: median/p10/p90 over interleaved rounds (order rotated each round) of N pairs "
            f"on one non-blocking stream, N sized so a round lasts about {cfg.round_ms} ms; "
            "rounds_us holds every round; the target reads the median of per-round ratios",
            "cupy PinnedMemoryPool: pool.malloc(n) dropped at once (a host-side free list, not "
            "stream-ordered)",
            "C++ (cache_bench): ns per pair through rmm::device_async_resource_ref; 'floor' is "
            "cudaMallocFromPoolAsync + cudaFreeAsync on the same owned pool; a hit makes "
            "the driver's cuStreamIsCapturing and cuStreamGetId once in allocate and once in "
            "deallocate, cuEventRecord once (the put's marker: the stream's order, taken while "
            "the stream is surely alive), plus the cache's take and put; cuStreamQuery is timed "
            "beside them and not made (whether the stream is idle: the one sound way to skip "
            "the marker, if it were cheaper than the marker)",
            "the legacy default stream (Python: no stream given; C++: 'cached_legacy') outlives "
            "the cache, so a put there sets no marker: its order is taken when its blocks leave "
            "the cache, by an event on a blocking stream of the cache's own",
        ],
    }


# ---- tables ---------------------------------------------------------------------------------


def _ns(entry, unit: str = "ns", digits: int = 1) -> str:
    return cell(entry, unit, digits)


def show(res: dict) -> None:
    sizes = res.get("sizes", list(SIZES))
    py = res.get("python", {})
    results = py.get("results", {})
    rows = []
    for name, per in results.items():
        for why in ("error", "skipped"):
            if why in per:
                rows.append([name, f"{why}: {per[why][:70]}"] + [""] * (len(sizes) - 1))
                break
        else:
            rows.append([name] + [cell(per.get(str(s)), digits=3) for s in sizes])
    print_table(f"{SECTION_TITLES[11]} -- 1. from Python (us per pair: median [p10-p90])",
                ["contender"] + [fmt_size(s) for s in sizes], rows)

    def rounds(name, size):
        return (results.get(name, {}).get(str(size)) or {}).get("rounds_us") or []

    ratio_rows = []
    for num, den in ((APR_CACHED, CUPY_PINNED), (APR_CACHED_DEFAULT, CUPY_PINNED),
                     (APR_CACHED, APR_NEW),
                     (ADR_CACHED, TORCH_CACHING)):
        vals = []
        for s in sizes:
            vals.append(fmt_ratio(median_ratio(rounds(num, s), rounds(den, s))))
        ratio_rows.append([f"{num} / {den}"] + vals)
    print_table("  ratios (median of per-round ratios)", ["ratio"] + [fmt_size(s) for s in sizes],
                ratio_rows)
    for name, per in results.items():
        for s, e in per.items():
            if isinstance(e, dict) and "error" in e:
                print(f"  error [{name} @ {fmt_size(int(s))}]: {e['error']}")
    pt = py.get("threads", {})
    if "error" in pt:
        print(f"  Python threads: error: {pt['error']}")
    elif pt:
        sc = pt.get("scaling_per_round") or []
        print(f"  Python: {pt.get('threads')} threads on their own streams, cached pinned "
              f"{fmt_size(pt.get('bytes', 4096))} pairs: "
              f"{fmt_ratio(percentile(sc, 0.5) if sc else None)}x one thread (median per round)")
        by_way = pt.get("rounds_pairs_per_s") or {}
        one = by_way.get("1") or []
        freed = by_way.get(f"{pt.get('threads')} release_gil=always") or []
        both = [b / a for a, b in zip(one, freed) if a]
        if both:
            print(f"  the same threads with release_gil='always': "
                  f"{fmt_ratio(percentile(both, 0.5))}x one thread (reported, no target)")
    ci = py.get("cache_info", {})
    if "error" in ci:
        print(f"  cache_info: error: {ci['error']}")
    elif ci:
        a, r = ci.get("after_run", {}), ci.get("after_release_cache", {})
        print(f"  cache_info after the run: {a.get('hits')} hits, {a.get('misses')} misses, "
              f"{a.get('bytes')} B in {a.get('blocks')} blocks (cap {a.get('cap')} B; within "
              f"cap: {ci.get('bytes_within_cap')}), charged_high {a.get('charged_high')} B; after "
              f"release_cache: {r.get('bytes')} B cached, pool used_mem_current "
              f"{r.get('pool_used_mem_current')} B")

    cpp = res.get("cpp", {})
    for k in ("skipped", "error"):
        if k in cpp:
            print(f"  C++ cache_bench {k}: {cpp[k]}")
    if "pairs" not in cpp:
        return
    rows = []
    for kind, per in cpp.get("pairs", {}).items():
        for way, label in (("floor", "raw floor"), ("uncached", "no cache, via ref"),
                           ("cached", "cache hit, via ref"),
                           ("cached_legacy", "cache hit, via ref, legacy stream")):
            rows.append([f"{kind}: {label}"] + [_ns((per.get(str(s)) or {}).get(way))
                                                for s in sizes])
        rows.append([f"{kind}: hit / floor (median per round)"] + [
            fmt_ratio(((per.get(str(s)) or {}).get("cached_over_floor") or {}).get("median"))
            for s in sizes])
    meta = cpp.get("meta", {})
    print_table(f"  2. C++ cache_bench on {meta.get('gpu', '?')} (ns per pair: median [p10-p90])",
                ["pool: way"] + [fmt_size(s) for s in sizes], rows)
    calls = cpp.get("calls", {})
    times = cpp.get("calls_per_hit_pair", {})
    recorded = cpp.get("calls_per_recorded_pair", {})
    candidates = cpp.get("recording_candidates", [])
    hit_calls = {name: e for name, e in calls.items()
                 if name not in recorded and name not in candidates}
    rows = [[name, _ns(e), str(times.get(name, ""))] for name, e in hit_calls.items()]
    accounted = sum(e.get("median_ns", 0) * times.get(name, 0) for name, e in hit_calls.items()
                    if isinstance(e, dict))
    print_table("  what a hit pair is made of (ns per call: median [p10-p90])",
                ["call", "ns", "per hit pair"], rows)
    first = (cpp.get("pairs", {}).get("pinned") or {}).get(str(sizes[0])) or {}
    hit = first.get("cached")
    if hit_calls and isinstance(hit, dict):
        print(f"  these calls account for {accounted:.1f} ns of the {hit['median_ns']:.1f} ns "
              f"pinned {fmt_size(sizes[0])} hit pair (the rest: the resource reference's "
              "dispatch and asyncmr's checks)")
    rec_calls = {name: calls[name] for name in recorded if isinstance(calls.get(name), dict)}
    if rec_calls:
        clocksource = meta.get("clocksource") or "?"
        stamp = meta.get("history_stamp") or "?"
        print_table(f"  what recording adds to a pair, per event (ns per call: median [p10-p90]; "
                    f"clocksource {clocksource}, stamped with {stamp})",
                    ["call", "ns", "per recorded pair"],
                    [[name, _ns(e), str(recorded[name])] for name, e in rec_calls.items()]
                    + [[name, _ns(calls[name]), "not made"] for name in candidates
                       if isinstance(calls.get(name), dict)])
        floor = sum(e.get("median_ns", 0) * recorded[name] for name, e in rec_calls.items())
        rn = first.get("rounds_ns") or {}
        for way in ("uncached", "cached"):
            added = median_difference(rn.get(f"{way}_recording") or [], rn.get(way) or [])
            if added is not None:  # as the history targets take it
                print(f"  recording adds {added:.1f} ns to a pinned {fmt_size(sizes[0])} {way} "
                      f"pair (median of per-round differences); the stamps and ring writes "
                      f"alone are {floor:.1f} ns of it")
        split = {way: (percentile(rn[way], 0.5) if rn.get(way) else None,
                       median_difference(rn.get(f"{way}_recording") or [], rn.get(way) or []))
                 for way in ("hits", "puts")}
        if all(m is not None and a is not None for m, a in split.values()):
            (hit_ns, hit_added), (put_ns, put_added) = split["hits"], split["puts"]
            print(f"  a cached hit and its put timed apart (64 hits, then their 64 frees): "
                  f"{hit_ns:.1f} ns a hit, {put_ns:.1f} ns a put; recording adds "
                  f"{hit_added:.1f} ns to the hit and {put_added:.1f} ns to the put")
        stamped = median_difference(rn.get("cached_stamped") or [], rn.get("cached") or [])
        written = median_difference(rn.get("cached_stamped_written") or [],
                                    rn.get("cached") or [])
        if stamped is not None and written is not None:
            print(f"  made beside a cached pair by the loop, not by the resource: the two "
                  f"stamps add {stamped:.1f} ns, the stamps and ring writes {written:.1f} ns "
                  "(the rest of what recording adds: the resource's bookkeeping of each event)")
        plain = median_difference(rn.get("uncached_stamped_written") or [],
                                  rn.get("uncached") or [])
        if plain is not None:
            print(f"  the stamps and ring writes beside an uncached pair add {plain:.1f} ns")
    th = cpp.get("threads", {})
    n = str(th.get("threads", 8))
    rows = []
    for group, unit, label in (("results", "pairs_per_s", "hit pairs"),
                               ("calls", "calls_per_s", "calls alone")):
        for way, e in th.get(group, {}).items():
            one, many = (e.get("1") or {}), (e.get(n) or {})
            rows.append([f"{way} ({label})", f"{one.get(f'median_{unit}', 0) / 1e6:.2f}",
                         f"{many.get(f'median_{unit}', 0) / 1e6:.2f}",
                         fmt_ratio((e.get("scaling") or {}).get("median"))])
    print_table(f"  3. {n} threads on {n} streams, one {th.get('kind', 'pinned')} resource, "
                f"{fmt_size(th.get('bytes', 4096))} pairs (millions per second, median)",
                ["way", "1 thread", f"{n} threads", "scaling (median per round)"], rows)
    print(f"  control: pure arithmetic on {n} threads scales {fmt_ratio(th.get('control_scaling'))}"
          f"x here (hardware_concurrency {meta.get('hardware_concurrency')})")
    for k, v in (cpp.get("errors") or {}).items():
        print(f"  C++ error [{k}]: {v}")
