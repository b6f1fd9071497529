# SPDX-License-Identifier: Apache-2.0
"""Section 8: a CuPy staging loop through CuPy's pinned-memory allocator:
CuPy's own ``PinnedMemoryPool`` against asyncmr's pinned pool installed as CuPy's
pinned allocator with ``asyncmr.cupy.pinned_allocator(mr)``.

Each chunk's host buffer comes from ``cupy.cuda.alloc_pinned_memory`` (the allocator under
test); H2D is ``ndarray.set(buf)`` and D2H ``ndarray.get(out=buf, blocking=False)``, both on one
non-blocking CuPy stream. ``stage_depth`` copies stay in flight: a buffer is dropped only once
the event recorded after its copy has completed, as correct code must (CuPy's hook has no
stream, and a pool may hand the block to the next request at once). The host neither fills nor
reads the buffers: the loop times the allocator and the copies.

Reported: GB/s each way, peak pinned bytes (asyncmr: the pool's ``reserved_mem_high``; CuPy:
the bytes its pool took from cudaHostAlloc, counted at its upstream), then the bytes still
held after ``mr.trim_to(0)`` / ``pool.free_all_blocks()``.
"""

from __future__ import annotations

import collections
import gc
import importlib
import time

from ..common import (
    APR_NEW, MiB, SECTION_TITLES, err_text, fmt_size, median_of, print_ratio_values, print_table,
    ratio, summarize,
)
from ..harness import Skip, reset_peaks, trim_to

CUPY_POOL = "cupy PinnedMemoryPool"
ASYNCMR_ALLOC = f"asyncmr.cupy.pinned_allocator({APR_NEW})"


def require_cupy_pinned_allocator(ctx):
    """(cupy, asyncmr.cupy), or Skip saying what is missing."""
    try:
        cp = ctx.cupy()[0]
    except ImportError as e:
        raise Skip(f"CuPy is not installed ({err_text(e)})") from e
    try:
        amcupy = importlib.import_module("asyncmr.cupy")
    except ImportError as e:
        raise Skip(f"this asyncmr has no asyncmr.cupy module ({err_text(e)})"
                   ) from e
    if not callable(getattr(amcupy, "pinned_allocator", None)):
        raise Skip("asyncmr.cupy has no pinned_allocator(mr) context manager")
    return cp, amcupy


class _CountingUpstream:
    """The upstream of a CuPy PinnedMemoryPool: cudaHostAlloc through CuPy, counting the bytes
    the pool holds (live and peak), since the pool itself reports no byte totals."""

    def __init__(self, cp):
        import weakref

        self._cp = cp
        self._finalize = weakref.finalize
        self.live = 0
        self.peak = 0

    def _freed(self, nbytes):
        self.live -= nbytes

    def __call__(self, nbytes):
        pm = self._cp.cuda.pinned_memory
        ptr = pm._malloc(nbytes)  # CuPy's own raw allocator: cudaHostAlloc (portable)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        # The pool keeps ptr.mem; cudaFreeHost runs when that object dies.
        self._finalize(ptr.mem, self._freed, nbytes)
        return ptr


def _stage(cp, stream, dev, nchunks: int, chunk: int, depth: int, direction: str) -> int:
    """ns of one staging pass of nchunks chunks in one direction."""
    import numpy as np

    slots = dev.shape[0]
    inflight = collections.deque()
    alloc = cp.cuda.alloc_pinned_memory
    t0 = time.perf_counter_ns()
    with stream:
        for i in range(nchunks):
            buf = np.frombuffer(alloc(chunk), dtype=np.uint8, count=chunk)
            if direction == "H2D":
                dev[i % slots].set(buf, stream=stream)
            else:
                dev[i % slots].get(out=buf, stream=stream, blocking=False)
            ev = stream.record()
            inflight.append((ev, buf))
            if len(inflight) > depth:
                old_ev, _ = inflight.popleft()
                old_ev.synchronize()  # its copy is done: the buffer may go back
        stream.synchronize()
        inflight.clear()
    return time.perf_counter_ns() - t0


def run(cfg, ctx) -> dict:
    cp, amcupy = require_cupy_pinned_allocator(ctx)
    stream = ctx.cupy()[1]
    chunk, nchunks, depth = cfg.stage_chunk, cfg.stage_chunks, cfg.stage_depth
    total = chunk * nchunks
    with stream:
        dev = cp.empty((depth + 1, chunk), dtype=cp.uint8)
        dev.fill(1)
    stream.synchronize()
    default_pool = cp.get_default_pinned_memory_pool()
    results: dict = {}

    def measure(scope):
        """{direction: summary with GBps} of the staging loop, each pass run inside scope()."""
        samples = {"H2D": [], "D2H": []}
        for d in samples:  # warm-up
            scope(lambda d=d: _stage(cp, stream, dev, min(nchunks, 8), chunk, depth, d))
        for _ in range(cfg.stage_repeats):
            for d in samples:
                samples[d].append(scope(
                    lambda d=d: _stage(cp, stream, dev, nchunks, chunk, depth, d)))
        out = {}
        for d, v in samples.items():
            out[d] = summarize(v, "s", 1e-9)
            out[d]["GBps"] = total / median_of(out[d], "s") / 1e9
        return out

    # CuPy's own pool, over a counting upstream. CuPy has no getter for its current pinned
    # allocator: afterwards the default one (its default pool) is put back, as at import.
    try:
        upstream = _CountingUpstream(cp)
        pool = cp.cuda.PinnedMemoryPool(upstream)
        cp.cuda.set_pinned_memory_allocator(pool.malloc)
        try:
            entry = measure(lambda fn: fn())
        finally:
            cp.cuda.set_pinned_memory_allocator(default_pool.malloc)
        gc.collect()
        entry["peak_pinned_bytes"] = upstream.peak
        entry["held_before_release_bytes"] = upstream.live
        pool.free_all_blocks()
        gc.collect()
        entry["held_after_release_bytes"] = upstream.live
        entry["release"] = "PinnedMemoryPool.free_all_blocks()"
        results[CUPY_POOL] = entry
    except Exception as e:  # noqa: BLE001
        results[CUPY_POOL] = {"error": err_text(e)}
    print("  [8] cupy pool done", flush=True)

    # asyncmr: an owned pool, so its watermarks count this loop only.
    try:
        mr = ctx.asyncmr.AsyncPinnedMR(pool="new")
        reset_peaks(mr)

        def scoped(fn):
            with amcupy.pinned_allocator(mr):
                return fn()

        entry = measure(scoped)
        gc.collect()
        stream.synchronize()
        attrs = mr.attributes
        entry["peak_pinned_bytes"] = attrs.reserved_mem_high
        entry["used_high_bytes"] = attrs.used_mem_high
        entry["held_before_release_bytes"] = attrs.reserved_mem_current
        # CuPy keeps its last staging buffers on its watch list until its next pinned
        # allocation looks at it (without this the pool can still hold 32 MiB after
        # trim_to(0)): a zero-byte request makes CuPy drop them, then the frees run.
        scoped(lambda: cp.cuda.alloc_pinned_memory(0))
        gc.collect()
        cp.cuda.runtime.deviceSynchronize()
        trim_to(mr, 0)
        entry["held_after_release_bytes"] = mr.attributes.reserved_mem_current
        entry["release"] = "cupy.cuda.alloc_pinned_memory(0), then mr.trim_to(0)"
        results[ASYNCMR_ALLOC] = entry
    except Exception as e:  # noqa: BLE001
        results[ASYNCMR_ALLOC] = {"error": err_text(e)}
    print("  [8] asyncmr done", flush=True)

    def gbps(name, d):
        return (results.get(name, {}).get(d) or {}).get("GBps")

    return {
        "params": {"chunk_bytes": chunk, "chunks": nchunks, "total_bytes": total,
                   "in_flight": depth, "repeats": cfg.stage_repeats},
        "results": results,
        "ratios": {f"{d} GB/s asyncmr / cupy": ratio(gbps(ASYNCMR_ALLOC, d), gbps(CUPY_POOL, d))
                   for d in ("H2D", "D2H")},
        "notes": [
            "per chunk: cupy.cuda.alloc_pinned_memory(chunk) (the allocator under test), "
            "ndarray.set / ndarray.get(out=, blocking=False) on a non-blocking CuPy stream, an "
            f"event; a buffer is dropped once its event completed ({depth} copies in flight)",
            "CuPy: a fresh PinnedMemoryPool over cudaHostAlloc, its upstream bytes counted; "
            "asyncmr: AsyncPinnedMR(pool='new') through asyncmr.cupy.pinned_allocator",
        ],
    }


def show(res: dict) -> None:
    p = res.get("params", {})
    rows = []
    for name, e in res.get("results", {}).items():
        if "error" in e:
            rows.append([name, f"error: {e['error'][:70]}", "", "", "", ""])
            continue
        rows.append([name, f"{e['H2D']['GBps']:.2f}", f"{e['D2H']['GBps']:.2f}"] +
                    [f"{(e.get(k) or 0) / MiB:.1f}" for k in (
                        "peak_pinned_bytes", "held_before_release_bytes",
                        "held_after_release_bytes")])
    print_table(f"{SECTION_TITLES[8]} -- {p.get('chunks')} x {fmt_size(p.get('chunk_bytes', 0))}"
                " each way",
                ["pinned allocator", "H2D GB/s", "D2H GB/s", "peak pinned MiB",
                 "held after loop MiB", "held after release MiB"], rows)
    print_ratio_values(res.get("ratios", {}))
