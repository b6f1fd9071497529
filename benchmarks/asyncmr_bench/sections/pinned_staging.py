# SPDX-License-Identifier: Apache-2.0
"""Section 5: pinned staging, host-to-device in chunks (each chunk allocated, copied, freed)
from asyncmr's pinned pool, RMM's pinned resources and a preallocated cudaHostAlloc buffer (the
ideal); then one large copy each way from pinned-pool memory vs cudaHostAlloc memory."""

from __future__ import annotations

import time

from ..common import (
    APR, HOSTALLOC_MEMORY, POOL_MEMORY, RMM_PINNED, RMM_POOL_PINNED, SECTION_TITLES, STAGING_IDEAL,
    MiB, copy_row, err_text, fmt_size, median_of, print_ratio_values, print_table, ratio,
    seconds_row, summarize,
)
from ..harness import cuda_check, pool_adaptor


def run(cfg, ctx) -> dict:
    from cuda.bindings import runtime as cudart

    am, mr = ctx.asyncmr, ctx.rmm.mr
    s = ctx.stream
    sh = ctx.handle(s)
    H2D = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
    D2H = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
    total, chunk = cfg.staging_total, cfg.staging_chunk
    nchunks = total // chunk
    total = nchunks * chunk
    out: dict = {"staging": {}, "large_copy": {}}
    owned = []  # (free function, pointer) to release at the end, whatever happens

    def release_all():
        cudart.cudaStreamSynchronize(sh)  # frees below must not race the copies
        while owned:
            fn, p = owned.pop()
            try:
                fn(p)
            except Exception:  # noqa: BLE001, S110 - best effort at cleanup
                pass

    try:
        dst = int(cuda_check(cudart.cudaMalloc(max(total, cfg.big_copy)), "cudaMalloc"))
        owned.append((cudart.cudaFree, dst))

        def copy(dst_ptr, src_ptr, n, kind=H2D):
            cuda_check(cudart.cudaMemcpyAsync(dst_ptr, src_ptr, n, kind, sh), "cudaMemcpyAsync")

        # -- staging variants: each chunk allocated, copied, freed --
        variants = {}
        try:
            pinned_mr = am.AsyncPinnedMR()

            def stage_async(k, _mr=pinned_mr):
                for i in range(k):
                    p = _mr.allocate(chunk, s)
                    copy(dst + i * chunk, p, chunk)
                    _mr.deallocate(p, chunk, s)  # stream-ordered: after the copy

            variants[APR] = stage_async
        except Exception as e:  # noqa: BLE001
            out["staging"][APR] = {"error": err_text(e)}
        try:
            host_mr = mr.PinnedHostMemoryResource()

            def stage_host(k, _mr=host_mr):
                for i in range(k):
                    p = _mr.allocate(chunk, s)
                    copy(dst + i * chunk, p, chunk)
                    # cudaFreeHost is not stream-ordered: correct code waits for the copy.
                    s.synchronize()
                    _mr.deallocate(p, chunk, s)

            variants[RMM_PINNED] = stage_host
        except Exception as e:  # noqa: BLE001
            out["staging"][RMM_PINNED] = {"error": err_text(e)}
        try:
            pool_mr = pool_adaptor(ctx, mr.PinnedHostMemoryResource, initial=64 * MiB)

            def stage_pool(k, _mr=pool_mr):
                for i in range(k):
                    p = _mr.allocate(chunk, s)
                    copy(dst + i * chunk, p, chunk)
                    _mr.deallocate(p, chunk, s)

            variants[RMM_POOL_PINNED] = stage_pool
        except Exception as e:  # noqa: BLE001
            out["staging"][RMM_POOL_PINNED] = {"error": err_text(e)}
        ideal = STAGING_IDEAL
        try:
            hbuf = int(cuda_check(cudart.cudaHostAlloc(chunk, cudart.cudaHostAllocDefault),
                                   "cudaHostAlloc"))
            owned.append((cudart.cudaFreeHost, hbuf))

            def stage_ideal(k, _p=hbuf):
                for i in range(k):
                    copy(dst + i * chunk, _p, chunk)

            variants[ideal] = stage_ideal
        except Exception as e:  # noqa: BLE001
            out["staging"][ideal] = {"error": err_text(e)}

        samples = {name: [] for name in variants}
        for name, fn in list(variants.items()):  # warm-up
            try:
                fn(min(nchunks, 16))
                cuda_check(cudart.cudaStreamSynchronize(sh), "cudaStreamSynchronize")
            except Exception as e:  # noqa: BLE001
                out["staging"][name] = {"error": err_text(e)}
                del variants[name]
        for r in range(cfg.staging_repeats):
            names = list(variants)
            k = r % max(len(names), 1)
            for name in names[k:] + names[:k]:
                try:
                    t0 = time.perf_counter_ns()
                    variants[name](nchunks)
                    cuda_check(cudart.cudaStreamSynchronize(sh), "cudaStreamSynchronize")
                    samples[name].append(time.perf_counter_ns() - t0)
                except Exception as e:  # noqa: BLE001
                    out["staging"][name] = {"error": err_text(e)}
                    del variants[name]
        for name in variants:
            e = summarize(samples[name], "s", 1e-9)
            e["GBps"] = total / e["median_s"] / 1e9
            out["staging"][name] = e
        out["staging_params"] = {"total_bytes": total, "chunk_bytes": chunk,
                                 "chunks": nchunks, "repeats": cfg.staging_repeats}
        print("  [5] staging done", flush=True)

        # -- one large copy: pinned-pool memory vs cudaHostAlloc memory --
        big = cfg.big_copy
        sources = {}
        try:
            pmr = am.AsyncPinnedMR()
            p = pmr.allocate(big, s)
            owned.append((lambda q, _m=pmr, _b=big: _m.deallocate(q, _b, s), p))
            sources[POOL_MEMORY] = p
        except Exception as e:  # noqa: BLE001
            out["large_copy"][POOL_MEMORY] = {"error": err_text(e)}
        try:
            hp = int(cuda_check(cudart.cudaHostAlloc(big, cudart.cudaHostAllocDefault),
                                 "cudaHostAlloc"))
            owned.append((cudart.cudaFreeHost, hp))
            sources[HOSTALLOC_MEMORY] = hp
        except Exception as e:  # noqa: BLE001
            out["large_copy"][HOSTALLOC_MEMORY] = {"error": err_text(e)}
        ev0 = cuda_check(cudart.cudaEventCreate(), "cudaEventCreate")
        ev1 = cuda_check(cudart.cudaEventCreate(), "cudaEventCreate")
        try:
            for direction, kind in (("H2D", H2D), ("D2H", D2H)):
                times = {name: [] for name in sources}
                for src in sources.values():  # warm-up
                    a, b = (dst, src) if direction == "H2D" else (src, dst)
                    copy(a, b, big, kind)
                cuda_check(cudart.cudaStreamSynchronize(sh), "cudaStreamSynchronize")
                for r in range(cfg.copy_repeats):
                    names = list(sources)
                    k = r % max(len(names), 1)
                    for name in names[k:] + names[:k]:
                        src = sources[name]
                        a, b = (dst, src) if direction == "H2D" else (src, dst)
                        cuda_check(cudart.cudaEventRecord(ev0, sh), "cudaEventRecord")
                        copy(a, b, big, kind)
                        cuda_check(cudart.cudaEventRecord(ev1, sh), "cudaEventRecord")
                        cuda_check(cudart.cudaEventSynchronize(ev1), "cudaEventSynchronize")
                        ms = cuda_check(cudart.cudaEventElapsedTime(ev0, ev1),
                                         "cudaEventElapsedTime")
                        times[name].append(big / (ms * 1e-3) / 1e9)
                for name, vals in times.items():
                    out["large_copy"].setdefault(name, {})[direction] = summarize(vals, "GBps")
        finally:
            cudart.cudaEventDestroy(ev0)
            cudart.cudaEventDestroy(ev1)
        out["large_copy_params"] = {"bytes": big, "repeats": cfg.copy_repeats,
                                    "timing": "CUDA events around one cudaMemcpyAsync"}
    finally:
        release_all()
    st = out["staging"]
    lc = out["large_copy"]
    out["ratios"] = {
        "staging time AsyncPinnedMR / ideal": ratio(
            median_of(st.get(APR), "s"), median_of(st.get(ideal), "s")),
        "staging time PinnedHostMemoryResource / AsyncPinnedMR": ratio(
            median_of(st.get(RMM_PINNED), "s"), median_of(st.get(APR), "s")),
        "staging time PoolMemoryResource(PinnedHost) / AsyncPinnedMR": ratio(
            median_of(st.get(RMM_POOL_PINNED), "s"), median_of(st.get(APR), "s")),
        "H2D bandwidth pinned pool / cudaHostAlloc": ratio(
            median_of(lc.get(POOL_MEMORY, {}).get("H2D"), "GBps"),
            median_of(lc.get(HOSTALLOC_MEMORY, {}).get("H2D"), "GBps")),
        "D2H bandwidth pinned pool / cudaHostAlloc": ratio(
            median_of(lc.get(POOL_MEMORY, {}).get("D2H"), "GBps"),
            median_of(lc.get(HOSTALLOC_MEMORY, {}).get("D2H"), "GBps")),
    }
    out["ideal_name"] = ideal
    out["notes"] = [
        "staging: per chunk allocate, cudaMemcpyAsync H2D into one device buffer, free; "
        "timed from the first allocation to the stream synchronize after the last copy",
        "PinnedHostMemoryResource frees with cudaFreeHost, which is not stream-ordered: the "
        "loop synchronizes before each free, as correct code must",
        "the ideal reuses one preallocated chunk-sized cudaHostAlloc buffer (no allocation)",
    ]
    return out


def show(res: dict) -> None:
    p = res.get("staging_params", {})
    rows = []
    for name, e in res.get("staging", {}).items():
        rows.append(seconds_row(name, e, f"{e.get('GBps', 0):.2f}"))
    print_table(f"{SECTION_TITLES[5]} -- {fmt_size(p.get('total_bytes', 0))} in "
                f"{fmt_size(p.get('chunk_bytes', 0))} chunks",
                ["chunk source", "total ms (median)", "[p10-p90]", "GB/s"], rows)
    q = res.get("large_copy_params", {})
    rows = [copy_row(name, e) for name, e in res.get("large_copy", {}).items()]
    print_table(f"  one {fmt_size(q.get('bytes', 0))} copy (GB/s: median [p10-p90])",
                ["host memory", "H2D", "D2H"], rows)
    print_ratio_values(res.get("ratios", {}))
