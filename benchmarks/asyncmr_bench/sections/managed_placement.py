# SPDX-License-Identifier: Apache-2.0
"""Section 12: moving managed memory before a kernel needs it.

a. Host-written data read by a kernel: faults, ``asyncmr.prefetch`` before the kernel, and
   RMM's adaptor stack (``PrefetchResourceAdaptor(PoolMemoryResource(ManagedMemoryResource))``,
   which prefetches at allocation, before the host writes).
b. Pool memory last touched by the host, then reused by a new allocation and read by a kernel:
   ``AsyncManagedMR()`` (no prefetch), ``AsyncManagedMR(prefetch="device")`` (the old contents
   migrate), ``AsyncManagedMR(prefetch="device", discard=True)`` (they are dropped: CUDA 13
   build), RMM's stack.
c. Many small ranges already on the device, prefetched again: a loop of
   ``cudaMemPrefetchAsync``, one ``cudaMemPrefetchBatchAsync`` (CUDA 13), ``asyncmr.prefetch``.
d. Memory about to be overwritten on the device: ``asyncmr.prefetch`` against
   ``asyncmr.discard_and_prefetch``.
Times are per round (ms), from the first placement call to the end of the kernel, rounds of
the ways interleaved. Targets (targets.py): a. faults / asyncmr.prefetch >= 4; b. none /
prefetch=, discard=True >= 10 and prefetch= (either way) / RMM's stack <= 1.1; c.
asyncmr.prefetch / the faster of loop and batch <= 1.1 (medians of per-round ratios).
"""

from __future__ import annotations

import ctypes
import time

from ..common import MiB, SECTION_TITLES, err_text, print_ratio_values, print_table, ratio, summarize

RANGE_BYTES = 64 << 10
FAULTS, PREFETCH, RMM_STACK = "faults", "asyncmr.prefetch", "rmm PrefetchResourceAdaptor stack"
NONE, OPTION = "AsyncManagedMR()", "AsyncManagedMR(prefetch='device')"
DISCARDING = "AsyncManagedMR(prefetch='device', discard=True)"
LOOP, BATCH = "loop of cudaMemPrefetchAsync", "cudaMemPrefetchBatchAsync"
DISCARD = "asyncmr.discard_and_prefetch"


def _view(cp, ptr: int, n: int):
    mem = cp.cuda.UnownedMemory(ptr, n, None)
    return cp.ndarray((n,), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(mem, 0))


def _rounds(ways: dict, repeats: int) -> dict:
    """{way: [ms per round]}: each way's callable returns its own round time; interleaved."""
    out: dict = {w: [] for w in ways}
    for r in range(repeats):
        names = list(ways)
        for i in range(len(names)):
            w = names[(r + i) % len(names)]
            if isinstance(out[w], dict):
                continue  # failed before
            try:
                out[w].append(ways[w]())
            except Exception as e:  # noqa: BLE001 - recorded
                out[w] = {"error": err_text(e)}
    return out


def _summaries(rounds: dict) -> dict:
    return {w: (r if isinstance(r, dict) else {**summarize(r, "ms"), "rounds_ms": r})
            for w, r in rounds.items()}


def _rmm_stack(ctx, n: int):
    mr = ctx.rmm.mr
    return mr.PrefetchResourceAdaptor(mr.PoolMemoryResource(mr.ManagedMemoryResource(),
                                                            initial_pool_size=2 * n))


def run(cfg, ctx) -> dict:
    cp, cs = ctx.cupy()
    am = ctx.asyncmr
    from rmm.pylibrmm.stream import Stream

    rs = Stream(obj=cs)
    n = cfg.placement_bytes
    device = am.pinned.current_device()

    def kernel(ptr, nbytes):
        with cs:
            _view(cp, ptr, nbytes).sum()
        cs.synchronize()

    def timed(setup_after_host_write, ptr, nbytes):
        ctypes.memset(ptr, 1, nbytes)  # the host writes: the pages move to the host
        t0 = time.perf_counter_ns()
        setup_after_host_write()
        kernel(ptr, nbytes)
        return (time.perf_counter_ns() - t0) * 1e-6

    # a. host-written data
    plain = am.AsyncManagedMR(pool="new")
    a_ptr = plain.allocate(n, rs)
    stack = _rmm_stack(ctx, n)
    buf = ctx.rmm.DeviceBuffer(size=n, stream=rs, mr=stack)
    cp.cuda.runtime.deviceSynchronize()  # the adaptor prefetched at allocation
    a = _rounds({
        FAULTS: lambda: timed(lambda: None, a_ptr, n),
        PREFETCH: lambda: timed(lambda: am.prefetch((a_ptr, n), to=device, stream=rs), a_ptr, n),
        RMM_STACK: lambda: timed(lambda: None, buf.ptr, n),
    }, cfg.placement_repeats)
    plain.deallocate(a_ptr, n, rs)
    del buf

    # b. reused pool memory last touched by the host
    def reuse(mr_or_stack, is_rmm):
        def one():
            if is_rmm:
                b1 = ctx.rmm.DeviceBuffer(size=n, stream=rs, mr=mr_or_stack)
                cp.cuda.runtime.deviceSynchronize()  # its prefetch at allocation
                ctypes.memset(b1.ptr, 1, n)
                del b1
                cp.cuda.runtime.deviceSynchronize()
                t0 = time.perf_counter_ns()
                b2 = ctx.rmm.DeviceBuffer(size=n, stream=rs, mr=mr_or_stack)
                kernel(b2.ptr, n)
                dt = time.perf_counter_ns() - t0
                del b2
                cp.cuda.runtime.deviceSynchronize()
                return dt * 1e-6
            p = mr_or_stack.allocate(n, rs)
            cs.synchronize()
            ctypes.memset(p, 1, n)
            mr_or_stack.deallocate(p, n, rs)
            t0 = time.perf_counter_ns()
            q = mr_or_stack.allocate(n, rs)
            kernel(q, n)
            dt = time.perf_counter_ns() - t0
            mr_or_stack.deallocate(q, n, rs)
            cs.synchronize()
            return dt * 1e-6
        return one

    ways_b = {
        NONE: reuse(am.AsyncManagedMR(pool="new"), False),
        OPTION: reuse(am.AsyncManagedMR(pool="new", prefetch="device"), False),
        RMM_STACK: reuse(_rmm_stack(ctx, n), True),
    }
    if am.can_discard():
        ways_b[DISCARDING] = reuse(am.AsyncManagedMR(pool="new", prefetch="device",
                                                     discard=True), False)
    b = _rounds(ways_b, cfg.placement_repeats)

    # c. many small ranges, already on the device
    from cuda.bindings import runtime as cudart

    many = am.AsyncManagedMR(pool="new")
    ptrs = [many.allocate(RANGE_BYTES, rs) for _ in range(cfg.placement_ranges)]
    am.prefetch([(p, RANGE_BYTES) for p in ptrs], to=device, stream=rs)
    cs.synchronize()

    def loc():
        l = cudart.cudaMemLocation()
        l.type = cudart.cudaMemLocationType.cudaMemLocationTypeDevice
        l.id = device
        return l

    def loop():
        t0 = time.perf_counter_ns()
        for p in ptrs:
            if am.runtime_version() >= 13000:
                cudart.cudaMemPrefetchAsync(p, RANGE_BYTES, loc(), 0, cs.ptr)
            else:
                cudart.cudaMemPrefetchAsync(p, RANGE_BYTES, device, cs.ptr)
        cs.synchronize()
        return (time.perf_counter_ns() - t0) * 1e-6

    def batch():
        if not hasattr(cudart, "cudaMemPrefetchBatchAsync"):
            raise RuntimeError("this cuda-bindings has no cudaMemPrefetchBatchAsync (CUDA 13)")
        t0 = time.perf_counter_ns()
        (err,) = cudart.cudaMemPrefetchBatchAsync(ptrs, [RANGE_BYTES] * len(ptrs), len(ptrs),
                                                  [loc()], [0], 1, 0, cs.ptr)
        if int(err) != 0:
            raise RuntimeError(f"cudaMemPrefetchBatchAsync: {err}")
        cs.synchronize()
        return (time.perf_counter_ns() - t0) * 1e-6

    def ours():
        t0 = time.perf_counter_ns()
        am.prefetch([(p, RANGE_BYTES) for p in ptrs], to=device, stream=rs)
        cs.synchronize()
        return (time.perf_counter_ns() - t0) * 1e-6

    c = _rounds({LOOP: loop, BATCH: batch, PREFETCH: ours}, cfg.placement_repeats)
    for p in ptrs:
        many.deallocate(p, RANGE_BYTES, rs)

    # d. memory about to be overwritten on the device
    d_mr = am.AsyncManagedMR(pool="new")
    d_ptr = d_mr.allocate(n, rs)
    cs.synchronize()

    def overwrite(place):
        def one():
            ctypes.memset(d_ptr, 1, n)
            t0 = time.perf_counter_ns()
            place()
            cp.cuda.runtime.memsetAsync(d_ptr, 2, n, cs.ptr)
            cs.synchronize()
            return (time.perf_counter_ns() - t0) * 1e-6
        return one

    ways_d = {PREFETCH: overwrite(lambda: am.prefetch((d_ptr, n), to=device, stream=rs))}
    if am.can_discard():
        ways_d[DISCARD] = overwrite(
            lambda: am.discard_and_prefetch((d_ptr, n), to=device, stream=rs))
    d = _rounds(ways_d, cfg.placement_repeats)
    d_mr.deallocate(d_ptr, n, rs)
    cs.synchronize()

    return {
        "bytes": n, "ranges": cfg.placement_ranges, "range_bytes": RANGE_BYTES,
        "rounds": cfg.placement_repeats,
        "host_written": _summaries(a), "reused": _summaries(b), "small_ranges": _summaries(c),
        "overwrite": _summaries(d),
        "notes": ["ms per round from the first placement call to the end of the kernel; the "
                  "ways' rounds interleaved", "never more managed memory than 3x bytes at once"],
    }


def _median(entry):
    return entry.get("median_ms") if isinstance(entry, dict) and "error" not in entry else None


def show(res: dict) -> None:
    for key, what in (("host_written", "a. host-written data, then a kernel"),
                      ("reused", "b. reused pool memory last touched by the host"),
                      ("small_ranges", f"c. {res.get('ranges')} ranges of 64 KiB on the device"),
                      ("overwrite", "d. memory about to be overwritten on the device")):
        rows = []
        for way, e in (res.get(key) or {}).items():
            rows.append([way, f"error: {e['error'][:60]}" if "error" in e else
                         f"{e['median_ms']:.2f}", "" if "error" in e else
                         f"[{e['p10_ms']:.2f}-{e['p90_ms']:.2f}]"])
        print_table(f"{SECTION_TITLES[12]} -- {what}", ["way", "ms (median)", "[p10-p90]"], rows)
    a, b = res.get("host_written") or {}, res.get("reused") or {}
    print_ratio_values({
        "a. faults / asyncmr.prefetch": ratio(_median(a.get(FAULTS)), _median(a.get(PREFETCH))),
        "b. none / prefetch=": ratio(_median(b.get(NONE)), _median(b.get(OPTION))),
        "b. none / prefetch=, discard=True": ratio(_median(b.get(NONE)),
                                                   _median(b.get(DISCARDING))),
        "b. prefetch= / rmm stack": ratio(_median(b.get(OPTION)), _median(b.get(RMM_STACK))),
    })


__all__ = ["run", "show", "MiB"]
