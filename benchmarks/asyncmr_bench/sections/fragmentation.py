# SPDX-License-Identifier: Apache-2.0
"""Section 4: a seeded random workload replayed on an owned asyncmr pool and on RMM's pool
adaptor over the same upstream: reserved vs used at the peak, and what ``trim_to(0)`` returns;
then the same first replay on a pool grown up front (``reserve=``) and on the adaptor with an
``initial_pool_size`` of the same bytes, against the fresh pool's."""

from __future__ import annotations

import gc
import heapq
import math
import random
import statistics
import time

from ..common import KiB, MiB, SECTION_TITLES, err_text, fmt_ratio, print_table, ratio
from ..harness import trim_to


FIRST_ROUNDS = 3  # rotating rounds of the first-replay comparison


def make_trace(seed: int, ops: int, cap: int, lo: int = 1 * KiB, hi: int = 64 * MiB,
               mean_life: float = 40.0):
    """A seeded workload: ('a', id, size) and ('f', id) events, and its peak live bytes.

    Sizes are log-uniform in [lo, hi]; lifetimes (in allocations) exponential with mean
    mean_life. When the live bytes would pass `cap`, the allocations due soonest are freed
    first. Everything is freed at the end.
    """
    rng = random.Random(seed)
    events = []
    heap = []  # (expiry, id, size)
    live = peak = 0
    lg_lo, lg_hi = math.log2(lo), math.log2(hi)
    for step in range(ops):
        while heap and heap[0][0] <= step:
            _, i, sz = heapq.heappop(heap)
            events.append(("f", i))
            live -= sz
        size = int(2 ** rng.uniform(lg_lo, lg_hi))
        while heap and live + size > cap:
            _, i, sz = heapq.heappop(heap)
            events.append(("f", i))
            live -= sz
        events.append(("a", step, size))
        live += size
        peak = max(peak, live)
        heapq.heappush(heap, (step + 1 + int(rng.expovariate(1.0 / mean_life)), step, size))
    while heap:
        _, i, sz = heapq.heappop(heap)
        events.append(("f", i))
    return events, peak


def _replay(mr, events, stream) -> int:
    """Plays a trace on one stream; ns elapsed (stream synchronized at the end)."""
    alloc, dealloc = mr.allocate, mr.deallocate
    ptrs = {}
    t0 = time.perf_counter_ns()
    try:
        for ev in events:
            if ev[0] == "a":
                ptrs[ev[1]] = (alloc(ev[2], stream), ev[2])
            else:
                p, sz = ptrs.pop(ev[1])
                dealloc(p, sz, stream)
        stream.synchronize()
        return time.perf_counter_ns() - t0
    finally:
        for p, sz in ptrs.values():  # after an error: give back what is still live
            dealloc(p, sz, stream)
        stream.synchronize()


def run(cfg, ctx) -> dict:
    am, mr = ctx.asyncmr, ctx.rmm.mr
    s = ctx.stream
    events, requested_peak = make_trace(cfg.seed, cfg.frag_ops, cfg.frag_cap)
    kinds = (
        ("managed", lambda **kw: am.AsyncManagedMR(pool="new", **kw), mr.ManagedMemoryResource),
        ("pinned", lambda **kw: am.AsyncPinnedMR(pool="new", **kw), mr.PinnedHostMemoryResource),
        ("device", lambda **kw: am.AsyncDeviceMR(pool="new", **kw), mr.CudaMemoryResource),
    )

    results: dict = {}
    for kind, ours_factory, upstream_factory in kinds:
        entry = results.setdefault(kind, {})
        ours_name = kind
        # Ours: an owned pool, so nothing else in the process shows up in its watermarks.
        try:
            res = ours_factory()
            with res.track_peak() as peak:
                elapsed = _replay(res, events, s)
            before = res.attributes.reserved_mem_current
            trim_to(res, 0)
            after = res.attributes.reserved_mem_current
            ours_name = type(res).__name__
            entry["ours"] = {
                "resource": f"{type(res).__name__}(pool='new')",
                "used_high": peak.used,
                "reserved_high": peak.reserved,
                "reserved_over_used": ratio(peak.reserved, peak.used),
                "reserved_over_requested": ratio(peak.reserved, requested_peak),
                "reserved_before_trim": before,
                "reserved_after_trim": after,
                "replay_s": elapsed * 1e-9,
            }
            del res
        except Exception as e:  # noqa: BLE001
            entry["ours"] = {"error": err_text(e)}
        # RMM's pool adaptor over the same upstream, growing from nothing as ours does;
        # reserved = what it took from its upstream, used = what was asked of it.
        try:
            up = mr.StatisticsResourceAdaptor(upstream_factory())
            pool = mr.PoolMemoryResource(up, initial_pool_size=0)
            top = mr.StatisticsResourceAdaptor(pool)
            elapsed = _replay(top, events, s)
            up_stats, top_stats = up.allocation_counts, top.allocation_counts
            entry["adaptor"] = {
                "resource": f"PoolMemoryResource({upstream_factory.__name__}, "
                "initial_pool_size=0)",
                "used_high": top_stats.peak_bytes,
                "reserved_high": up_stats.peak_bytes,
                "reserved_over_used": ratio(up_stats.peak_bytes, top_stats.peak_bytes),
                "reserved_over_requested": ratio(up_stats.peak_bytes, requested_peak),
                "reserved_after_free": up_stats.current_bytes,
                "trim": "none: PoolMemoryResource keeps its upstream blocks until destroyed",
                "replay_s": elapsed * 1e-9,
            }
            del top, pool, up
        except Exception as e:  # noqa: BLE001
            entry["adaptor"] = {"error": err_text(e)}
        # The first replay again, in FIRST_ROUNDS rotating rounds: on a fresh pool, on a pool
        # grown up front by what the fresh replay above grew its pool to (rounded up to 2 MiB),
        # and on the adaptor given the same bytes as its initial pool (RMM's way to skip the
        # growth). Each replay on a pool built for it; construction timed apart.
        upfront = entry.get("ours", {}).get("reserved_high") or requested_peak
        upfront = -(-upfront // (2 * MiB)) * (2 * MiB)
        ways = {
            "fresh": lambda: ours_factory(),
            "reserved": lambda: ours_factory(reserve=upfront),
            "adaptor_initial": lambda: mr.PoolMemoryResource(upstream_factory(),
                                                             initial_pool_size=upfront),
        }
        times: dict = {w: {"replay_s": [], "construct_s": [], "grew": []} for w in ways}
        for r in range(FIRST_ROUNDS):
            for w in list(ways)[r % 3:] + list(ways)[:r % 3]:
                try:
                    t0 = time.perf_counter_ns()
                    res = ways[w]()
                    made = time.perf_counter_ns() - t0
                    if w == "adaptor_initial":
                        elapsed = _replay(res, events, s)
                    else:
                        with res.track_peak() as peak:
                            elapsed = _replay(res, events, s)
                        times[w]["grew"].append(peak.reserved > upfront)
                    times[w]["replay_s"].append(elapsed * 1e-9)
                    times[w]["construct_s"].append(made * 1e-9)
                    del res
                except Exception as e:  # noqa: BLE001
                    times[w]["error"] = err_text(e)
                gc.collect()
        names = {"fresh": f"{ours_name}(pool='new')",
                 "reserved": f"{ours_name}(pool='new', reserve={upfront})",
                 "adaptor_initial": f"PoolMemoryResource({upstream_factory.__name__}, "
                                    f"initial_pool_size={upfront})"}
        for w, t in times.items():
            entry["first_" + w] = ({"error": t["error"]} if "error" in t else {
                "resource": names[w], "upfront_bytes": upfront,
                "replay_s": statistics.median(t["replay_s"]),
                "construct_s": statistics.median(t["construct_s"]),
                "replays_s": t["replay_s"], "grew": any(t["grew"]),
            })
        fresh = entry.get("first_fresh", {}).get("replay_s")
        grown = entry.get("first_reserved", {}).get("replay_s")
        theirs = entry.get("first_adaptor_initial", {}).get("replay_s")
        entry["first_replay"] = {
            "reserved / fresh": ratio(grown, fresh),
            "reserved / adaptor with initial_pool_size": ratio(grown, theirs),
        }
        gc.collect()
        print(f"  [4] {kind} done", flush=True)
    return {
        "workload": {
            "seed": cfg.seed, "allocations": cfg.frag_ops, "events": len(events),
            "sizes": "log-uniform 1 KiB .. 64 MiB", "mean_lifetime_allocations": 40,
            "live_cap_bytes": cfg.frag_cap, "requested_peak_bytes": requested_peak,
        },
        "results": results,
        "notes": [
            "reserved_over_requested divides by the trace's own peak of live requested bytes, "
            "the same number for both sides; reserved_over_used divides by each resource's "
            "own used watermark (the driver's used_mem_high counts its rounding)",
            "ours: owned pools (pool='new'), watermarks from track_peak(), trim_to(0) after a "
            "synchronize; adaptor: StatisticsResourceAdaptor around its upstream (reserved) "
            "and on top (used)",
            "first_fresh / first_reserved / first_adaptor_initial: the first replay in 3 "
            "rotating rounds, each on a pool built for it: a new pool, a new pool built with "
            "reserve=upfront_bytes (what the fresh pool above grew to, rounded up to 2 MiB) and "
            "PoolMemoryResource(upstream, initial_pool_size=upfront_bytes); medians; "
            "construct_s is the construction, not in replay_s; grew: a reserved pool grew past "
            "its reservation; first_replay divides the medians",
        ],
    }


def show(res: dict) -> None:
    rows = []
    for kind, entry in res.get("results", {}).items():
        for side in ("ours", "adaptor"):
            e = entry.get(side, {})
            if "error" in e:
                rows.append([f"{kind} {side}", f"error: {e['error'][:60]}", "", "", "", "", ""])
                continue
            after = e.get("reserved_after_trim", e.get("reserved_after_free"))
            rows.append([
                f"{kind} {side}: {e.get('resource', '')}",
                f"{e.get('used_high', 0) / MiB:.1f}",
                f"{e.get('reserved_high', 0) / MiB:.1f}",
                fmt_ratio(e.get("reserved_over_requested")),
                fmt_ratio(e.get("reserved_over_used")),
                "-" if after is None else f"{after / MiB:.1f}",
                f"{e.get('replay_s', float('nan')):.3f}",
            ])
    first = []
    for kind, entry in res.get("results", {}).items():
        for side in ("first_fresh", "first_reserved", "first_adaptor_initial"):
            e = entry.get(side, {})
            if "error" in e:
                first.append([f"{kind} {side}", f"error: {e['error'][:60]}", "", ""])
            elif e:
                first.append([f"{kind}: {e.get('resource', '')}",
                              f"{e.get('construct_s', float('nan')) * 1e3:.1f}",
                              f"{e.get('replay_s', float('nan')) * 1e3:.1f}",
                              fmt_ratio(entry.get("first_replay", {}).get("reserved / fresh"))
                              if side == "first_reserved" else ""])
    w = res.get("workload", {})
    if first:
        print_table(f"{SECTION_TITLES[4]}: the first replay on a new pool, grown up front "
                    "or not (medians of 3 rotating rounds)",
                    ["resource", "construction ms", "first replay ms", "reserved / fresh"],
                    first)
    print_table(
        f"{SECTION_TITLES[4]} (requested peak {w.get('requested_peak_bytes', 0) / MiB:.1f} MiB, "
        f"{w.get('allocations')} allocations, seed {w.get('seed')})",
        ["resource", "used_high MiB", "reserved_high MiB", "reserved/requested",
         "reserved/used", "reserved after trim/free MiB", "replay s"], rows)


