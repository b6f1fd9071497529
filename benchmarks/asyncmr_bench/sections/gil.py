# SPDX-License-Identifier: Apache-2.0
"""Section 7: what asyncmr's GIL policy (``mr.release_gil``) costs and buys,
measured in one run:

1. **Stall.** A Python ticker thread (``time.sleep(gil_tick_s)`` in a loop) records its longest
   gap while another thread grows a NEW owned pinned pool by ``gil_grow_bytes`` (2 GiB) in one
   allocation: ``AsyncPinnedMR(pool="new")`` with ``release_gil="auto"`` (the default) and
   ``"never"`` (the old behaviour: the GIL held through ``cudaMallocFromPoolAsync``), and
   ``rmm.mr.PinnedHostMemoryResource`` (``cudaHostAlloc``, GIL released). One 2 GiB block at a
   time: each is freed, trimmed and its pool closed before the next.
2. **Threads.** ``gil_threads`` (8) Python threads, each on its own stream, 4 KiB pairs: the
   aggregate pairs/s of ``AsyncDeviceMR`` (auto, and never) against rmm's
   ``CudaAsyncMemoryResource``, which gives up and retakes the GIL on every call.
3. **Pair cost.** One thread, 4 KiB pairs on the same default pool through two resources, auto
   and never, in alternating rounds: the median of the per-round ratios, per pool kind.

Targets (targets.py): auto's longest stall <= 5 ms; auto's 8-thread aggregate >= 5x rmm's;
auto / never pair cost <= 1.05 for every kind.
"""

from __future__ import annotations

import gc
import threading
import time

from ..common import (
    ADR, AMR, APR, APR_NEW, KiB, RMM_ASYNC, RMM_PINNED, SECTION_TITLES, err_text, fmt_ratio,
    fmt_size, percentile, print_table, ratio, summarize, with_release_gil,
)
from ..harness import (
    calibrate, pair_runner, set_release_gil, thread_round, timed, trim_to,
)

PAIR_SIZE = 4 * KiB
MODES = ("auto", "never")


# ---- 1. the ticker ---------------------------------------------------------------------------


def longest_gap(stamps, t0: float, t1: float) -> float | None:
    """The longest interval between consecutive ticks that overlaps [t0, t1], in seconds."""
    best = None
    for a, b in zip(stamps, stamps[1:]):
        if b >= t0 and a <= t1:
            best = b - a if best is None else max(best, b - a)
    return best


def _grow_once(allocate, tick_s: float, settle_s: float = 0.05) -> dict:
    """Runs allocate() on a second thread while a ticker thread ticks; returns the
    allocation's wall time, the ticker's longest gap across it, and the idle baseline."""
    stamps: list = []
    stop = threading.Event()
    window: dict = {}

    def ticker():
        pc, sleep, add = time.perf_counter, time.sleep, stamps.append
        while not stop.is_set():
            add(pc())
            sleep(tick_s)

    def grower():
        try:
            t0 = time.perf_counter()
            window["ptr"] = allocate()
            window["t1"] = time.perf_counter()
            window["t0"] = t0
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            window["error"] = e

    tick = threading.Thread(target=ticker, daemon=True)
    grow = threading.Thread(target=grower, daemon=True)
    enabled = gc.isenabled()
    gc.disable()
    try:
        tick.start()
        time.sleep(settle_s)  # the idle baseline: the ticker alone
        idle_end = time.perf_counter()
        grow.start()
        grow.join()  # the main thread waits with the GIL released
        time.sleep(settle_s)
    finally:
        stop.set()
        tick.join()
        if enabled:
            gc.enable()
    if "error" in window:
        raise window["error"]
    t0, t1 = window["t0"], window["t1"]
    idle = [s for s in stamps if s <= idle_end]
    return {
        "ptr": window["ptr"],
        "alloc_ms": (t1 - t0) * 1e3,
        "longest_gap_ms": (longest_gap(stamps, t0, t1) or float("nan")) * 1e3,
        "idle_longest_gap_ms": (longest_gap(idle, idle[0], idle[-1]) or float("nan")) * 1e3
        if len(idle) > 1 else None,
        "ticks": len(stamps),
    }


def _stall(cfg, ctx) -> dict:
    am, mr = ctx.asyncmr, ctx.rmm.mr
    s = ctx.stream
    size = cfg.gil_grow_bytes

    def asyncmr_grower(mode):
        def make():
            return set_release_gil(am.AsyncPinnedMR(pool="new"), mode)
        return make

    contenders = {with_release_gil(APR_NEW, m): asyncmr_grower(m) for m in MODES}
    contenders[RMM_PINNED] = mr.PinnedHostMemoryResource
    runs: dict = {name: [] for name in contenders}
    errors: dict = {}
    for r in range(cfg.gil_repeats):
        names = [n for n in contenders if n not in errors]
        k = r % max(len(names), 1)
        for name in names[k:] + names[:k]:
            res = None
            try:
                res = contenders[name]()  # a new pool each time: the allocation grows it
                one = _grow_once(lambda _r=res: _r.allocate(size, s), cfg.gil_tick_s)
                res.deallocate(one.pop("ptr"), size, s)
                s.synchronize()
                if hasattr(res, "pool"):
                    trim_to(res, 0)  # give the 2 GiB back before the next contender grows
                runs[name].append(one)
            except Exception as e:  # noqa: BLE001 - recorded, the others go on
                errors[name] = err_text(e)
            finally:
                del res
                gc.collect()
    out = {}
    for name in contenders:
        if name in errors:
            out[name] = {"error": errors[name], "runs": runs[name]}
            continue
        gaps = [x["longest_gap_ms"] for x in runs[name]]
        out[name] = {
            "longest_gap": summarize(gaps, "ms"),
            "alloc": summarize([x["alloc_ms"] for x in runs[name]], "ms"),
            "idle_longest_gap_ms": max((x["idle_longest_gap_ms"] or 0.0) for x in runs[name]),
            "runs": runs[name],
        }
    print("  [7] stall done", flush=True)
    return out


# ---- 2. threads ----------------------------------------------------------------------------


def _threads(cfg, ctx) -> dict:
    am, mr = ctx.asyncmr, ctx.rmm.mr
    counts = sorted({1, cfg.gil_threads})
    contenders = {with_release_gil(ADR, m): (lambda _m=m: set_release_gil(am.AsyncDeviceMR(), _m))
                  for m in MODES}
    contenders[RMM_ASYNC] = mr.CudaAsyncMemoryResource
    streams = [ctx.new_stream() for _ in range(max(counts))]
    built, out, pairs = {}, {}, {}
    for name, factory in contenders.items():
        try:
            res = factory()
            for st in streams:  # warm every stream
                for _ in range(50):
                    res.deallocate(res.allocate(PAIR_SIZE, st), PAIR_SIZE, st)
                st.synchronize()
            rate1 = thread_round(res, PAIR_SIZE, 1, 2000, streams)
            pairs[name] = int(min(max(cfg.thread_round_ms * 1e-3 * rate1, 500), 200_000))
            built[name] = res
            out[name] = {}
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": err_text(e)}
    rates: dict = {name: {n: [] for n in counts} for name in built}
    for r in range(cfg.gil_thread_repeats):
        names = list(built)
        k = r % max(len(names), 1)
        for name in names[k:] + names[:k]:
            for n in counts:
                try:
                    rates[name][n].append(thread_round(built[name], PAIR_SIZE, n, pairs[name],
                                                       streams))
                except Exception as e:  # noqa: BLE001
                    out[name][str(n)] = {"error": err_text(e)}
    for name in built:
        for n in counts:
            if str(n) not in out[name] and rates[name][n]:
                entry = summarize(rates[name][n], "pairs_per_s")
                entry["pairs_per_thread"] = pairs[name]
                out[name][str(n)] = entry
    built.clear()
    gc.collect()
    print("  [7] threads done", flush=True)
    return {"thread_counts": counts, "size": PAIR_SIZE, "results": out}


# ---- 3. pair cost, auto vs never -------------------------------------------------------------


def _pair_cost(cfg, ctx) -> dict:
    am = ctx.asyncmr
    kinds = (("device", ADR, am.AsyncDeviceMR), ("pinned", APR, am.AsyncPinnedMR),
             ("managed", AMR, am.AsyncManagedMR))
    out = {}
    for kind, base, cls in kinds:
        try:
            # Two resources over the same (default) pool: only the GIL policy differs.
            runners = {}
            for mode in MODES:
                res = set_release_gil(cls(), mode)
                run_n, sync = pair_runner(ctx, "rmm", res, PAIR_SIZE)
                runners[mode] = (res, run_n, sync,
                                 calibrate(run_n, sync, cfg.warmup_ms, cfg.round_ms))
            n = min(r[3] for r in runners.values())  # the same pairs per round for both
            rounds: dict = {mode: [] for mode in MODES}
            for r in range(cfg.gil_pair_rounds):
                order = MODES if r % 2 == 0 else MODES[::-1]
                for mode in order:
                    _, run_n, sync, _ = runners[mode]
                    elapsed = timed(run_n, n)
                    sync()
                    rounds[mode].append(elapsed / n * 1e-3)  # us per pair
            per_round = [a / b for a, b in zip(rounds["auto"], rounds["never"], strict=True)]
            out[kind] = {
                "resource": base,
                "pairs_per_round": n,
                "auto": summarize(rounds["auto"], "us"),
                "never": summarize(rounds["never"], "us"),
                "auto_over_never": summarize(per_round, "ratio"),
                "rounds_us": rounds,
            }
            del runners
        except Exception as e:  # noqa: BLE001
            out[kind] = {"resource": base, "error": err_text(e)}
        gc.collect()
    print("  [7] pair cost done", flush=True)
    return out


def run(cfg, ctx) -> dict:
    return {
        "stall": {"bytes": cfg.gil_grow_bytes, "tick_s": cfg.gil_tick_s,
                  "repeats": cfg.gil_repeats, "results": _stall(cfg, ctx)},
        "threads": _threads(cfg, ctx),
        "pair_cost": {"size": PAIR_SIZE, "rounds": cfg.gil_pair_rounds,
                      "results": _pair_cost(cfg, ctx)},
        "notes": [
            "stall: a new owned pinned pool per growth (pool='new'), one allocation of "
            f"{fmt_size(cfg.gil_grow_bytes)} on a second thread while a ticker thread sleeps "
            f"{cfg.gil_tick_s * 1e3:g} ms in a loop; longest gap between ticks overlapping the "
            "allocation, median over growths; freed, trimmed and closed after each",
            "threads: each thread loops allocate/deallocate on its own non-blocking stream; "
            "aggregate = threads x pairs / (last end - first start); median over rounds",
            "pair cost: two resources on the same default pool, release_gil 'auto' and "
            "'never', alternating rounds; the target reads the median of per-round ratios",
        ],
    }


def _ms(entry) -> str:
    if not isinstance(entry, dict) or "median_ms" not in entry:
        return "-"
    return f"{entry['median_ms']:.2f} [{entry['p10_ms']:.2f}-{entry['p90_ms']:.2f}]"


def show(res: dict) -> None:
    st = res.get("stall", {})
    rows = []
    for name, e in st.get("results", {}).items():
        if "error" in e:
            rows.append([name, f"error: {e['error'][:70]}", "", ""])
            continue
        rows.append([name, _ms(e.get("longest_gap")), _ms(e.get("alloc")),
                     f"{e.get('idle_longest_gap_ms', 0):.2f}"])
    print_table(f"{SECTION_TITLES[7]} -- 1. ticker during one {fmt_size(st.get('bytes', 0))} "
                "growth of a new pinned pool (ms: median [p10-p90])",
                ["allocating with", "longest ticker gap", "allocation", "idle gap (max)"], rows)

    th = res.get("threads", {})
    counts = th.get("thread_counts", [])
    rows = []
    for name, per in th.get("results", {}).items():
        if "error" in per:
            rows.append([name, f"error: {per['error'][:70]}"] + [""] * (len(counts) - 1))
            continue
        rows.append([name] + [
            f"{per[str(n)]['median_pairs_per_s'] / 1e6:.3f}"
            if "median_pairs_per_s" in per.get(str(n), {}) else "-" for n in counts])
    print_table(f"  2. threads, {fmt_size(th.get('size', PAIR_SIZE))} pairs (M pairs/s, median)",
                ["resource"] + [f"{n} thr" for n in counts], rows)
    r = th.get("results", {})

    def agg(name, n):
        return r.get(name, {}).get(str(n), {}).get("median_pairs_per_s")

    top = str(max(counts)) if counts else "8"
    print(f"  {with_release_gil(ADR, 'auto')} / {RMM_ASYNC} at {top} threads: "
          f"{fmt_ratio(ratio(agg(with_release_gil(ADR, 'auto'), top), agg(RMM_ASYNC, top)))}")

    pc = res.get("pair_cost", {})
    rows = []
    for kind, e in pc.get("results", {}).items():
        if "error" in e:
            rows.append([f"{kind}: {e.get('resource')}", f"error: {e['error'][:70]}", "", ""])
            continue
        rows.append([f"{kind}: {e.get('resource')}", f"{e['auto']['median_us']:.3f}",
                     f"{e['never']['median_us']:.3f}",
                     f"{percentile(_per_round(e), 0.5):.3f}"])
    print_table(f"  3. one thread, {fmt_size(pc.get('size', PAIR_SIZE))} pairs, same pool "
                "(us per pair, median)",
                ["pool", "auto", "never", "auto/never (median per round)"], rows)


def _per_round(e: dict) -> list:
    r = e.get("rounds_us", {})
    return [a / b for a, b in zip(r.get("auto", []), r.get("never", [])) if b]
