# SPDX-License-Identifier: Apache-2.0
"""The target policy: every target recomputed from the raw numbers in a results.json.

Standard library only, so ``benchmarks/check_targets.py`` runs anywhere the JSON is. Nothing
here reads a stored ratio or a stored ``met`` flag: each target names its *cells* (one number
per size, pool, direction or kind, computed from the medians and raw rounds of its section) and
takes the worst cell (the largest for ``<=``, the smallest for ``>=`` and ``>``). A cell that
is missing (a contender failed, a section was skipped or failed, a row is absent) makes the
target NOT met: it is listed under ``missing``, never dropped. Targets of sections the run was
not asked for are ``not run``: listed, not counted.
"""

from __future__ import annotations

from .common import (
    ADR, ADR_CACHED, AMR, APR, APR_CACHED, APR_NEW, ASYNCMR_ARRAY, CC_PINNED, CUPY_ARRAY,
    CUPY_PINNED, TORCH_CACHING,
    FLOOR_POOL_OF, HOSTALLOC_MEMORY, POOL_MEMORY, RMM_ASYNC, RMM_ASYNC_MANAGED, RMM_PINNED,
    RMM_POOL_MANAGED, RMM_POOL_PINNED, SECTION_KEYS, STAGING_IDEAL, floor_of, fmt_size, median_of,
    median_difference, median_ratio, percentile, ratio, with_release_gil,
)

MET, NOT_MET, NOT_RUN = "met", "not met", "not run"

#: Targets older results files may hold that the policy no longer has, with what replaced them
#: (a stricter threshold on the same cells counts as a new target).
RETIRED = {
    "Front cache: AsyncPinnedMR(pool='new', cache=64 MiB) alloc+free from Python < cupy "
    "PinnedMemoryPool's (median of per-round ratios)":
        "the same ratio, now <= 0.45",
    "History: recording adds <= 60 ns to a cached hit pair (C++, pinned, median of per-round "
    "differences against recording off)":
        "the same <= 60 ns on a cached hit, the allocation alone (timed apart from its free), as "
        "the recorder's specification words it; a hit pair makes two events (the hit and its "
        "put), and section 11 still prints what recording adds to the pair",
    "Managed placement: reused host-touched pool memory, no prefetch / prefetch='device' >= 10 "
    "(median of per-round ratios)":
        "the same >= 10 on prefetch='device', discard=True: a plain prefetch migrates the old "
        "contents, bound by the host link (about 5x); the table keeps it",
    "Managed placement: prefetch='device' within 1.1x of RMM's PrefetchResourceAdaptor stack "
    "(median of per-round ratios)":
        "the same <= 1.1, now on both ways of prefetch='device' (with and without discard=True)",
}
DEFAULT_SIZES = (256, 4096, 1 << 20, 64 << 20)


class _Doc:
    """Read access to one results.json, with the section lookups the targets share."""

    def __init__(self, doc: dict):
        self.doc = doc
        self.sections = doc.get("sections") or {}
        params = doc.get("params") or {}
        asked = params.get("sections")
        if not isinstance(asked, list):  # an old or partial file: what it holds was asked for
            asked = [n for n, k in SECTION_KEYS.items() if k in self.sections]
        self.asked = set(asked)
        self.params = params

    def sec(self, num: int) -> dict:
        s = self.sections.get(SECTION_KEYS[num])
        return s if isinstance(s, dict) else {}

    def why_missing(self, num: int, part: str | None = None) -> str:
        """Why a cell of section num is missing, in a few words; ``part``: why the part of a
        section that ran did not give the cell (a C++ program skipped or failed)."""
        if SECTION_KEYS[num] not in self.sections:
            return f"section {num} did not finish"
        s = self.sec(num)
        if "traceback" in s:
            return f"section {num} failed: {s.get('error', '?')}"
        if "skipped" in s:
            return f"section {num} skipped: {s['skipped']}"
        return part or f"not measured (see section {num} in the results)"


def _worst(values, op: str):
    present = [v for v in values if v is not None]
    if not present:
        return None
    return max(present) if op in ("<=", "<", "==") else min(present)


def _holds(value, op: str, threshold: float, tolerance: float) -> bool:
    if op == "<=":
        return value <= threshold * (1.0 + tolerance)
    if op == "<":
        return value < threshold
    if op == ">=":
        return value >= threshold
    if op == ">":
        return value > threshold
    if op == "==":
        return value == threshold
    raise ValueError(op)


def _target(d: _Doc, num: int, name: str, op: str, threshold: float, cells: dict,
            tolerance: float = 0.0, detail: dict | None = None, why: str | None = None) -> dict:
    """One target record from its cells ({cell: value or None}); ``why``: the reason a cell of
    a section that ran is missing, when the section knows it."""
    value = _worst(cells.values(), op)
    missing = [k for k, v in cells.items() if v is None]
    t = {"name": name, "section": num, "value": value, "target": f"{op} {threshold:g}",
         "op": op, "threshold": threshold, "cells": cells}
    if tolerance:
        t["tolerance"] = tolerance
    if detail:
        t["detail"] = detail
    if num not in d.asked:
        t.update(status=NOT_RUN, met=False, note=f"section {num} was not run")
        return t
    if not cells:
        missing = ["(no cells)"]
    met = not missing and value is not None and _holds(value, op, threshold, tolerance)
    t.update(status=MET if met else NOT_MET, met=met)
    if missing:
        t["missing"] = missing
        t["note"] = f"missing {', '.join(missing)}: {d.why_missing(num, why)}"
    return t


# ---- the targets, section by section ---------------------------------------------------------


def _section1(d: _Doc) -> list:
    s = d.sec(1)
    sizes = s.get("sizes") or list(DEFAULT_SIZES)
    results = s.get("results") or {}

    def med(name, size):
        return median_of((results.get(name) or {}).get(str(size)))

    def per_size(num, den):
        return {fmt_size(sz): ratio(med(num, sz), med(den, sz)) for sz in sizes}

    out = [
        _target(d, 1, "AsyncPinnedMR alloc+free from Python <= 1.3x the raw pinned floor",
                "<=", 1.3, per_size(APR, floor_of(APR))),
        _target(d, 1, "AsyncPinnedMR >= 2x faster than "
                "PoolMemoryResource(PinnedHostMemoryResource)", ">=", 2.0,
                per_size(RMM_POOL_PINNED, APR)),
        _target(d, 1, "AsyncPinnedMR faster than cuda.core PinnedMemoryResource",
                ">", 1.0, per_size(CC_PINNED, APR)),
        _target(d, 1, "AsyncManagedMR no slower than rmm "
                "experimental.CudaAsyncManagedMemoryResource (2% noise band)", "<=", 1.0,
                per_size(AMR, RMM_ASYNC_MANAGED), tolerance=0.02),
        _target(d, 1, "AsyncManagedMR >= 2x faster than PoolMemoryResource(ManagedMemoryResource)",
                ">=", 2.0, per_size(RMM_POOL_MANAGED, AMR)),
    ]
    # The C++ program's own per-round ratios (the reference and the floor alternate), every
    # pool asyncmr's resources use, every size.
    paired = (s.get("cpp") or {}).get("via_ref_over_floor") or {}
    cells = {}
    for pool in FLOOR_POOL_OF.values():
        for sz in sizes:
            entry = (paired.get(pool) or {}).get(str(sz))
            v = entry.get("median") if isinstance(entry, dict) else None
            cells[f"{pool}@{fmt_size(sz)}"] = v if isinstance(v, (int, float)) else None
    out.append(_target(d, 1, "C++ through rmm::device_async_resource_ref <= 1.05x the raw floor",
                       "<=", 1.05, cells))
    return out


def _section5(d: _Doc) -> list:
    s = d.sec(5)
    st, lc = s.get("staging") or {}, s.get("large_copy") or {}
    ideal = s.get("ideal_name", STAGING_IDEAL)

    def secs(name):
        return median_of(st.get(name), "s")

    def gbps(name, direction):
        return median_of((lc.get(name) or {}).get(direction), "GBps")

    return [
        _target(d, 5, "Pinned-pool H2D bandwidth >= 0.98x cudaHostAlloc memory's", ">=", 0.98,
                {"H2D": ratio(gbps(POOL_MEMORY, "H2D"), gbps(HOSTALLOC_MEMORY, "H2D"))}),
        _target(d, 5, "Pinned staging (AsyncPinnedMR) within 5% of the preallocated ideal "
                "(time ratio)", "<=", 1.05, {"staging": ratio(secs(APR), secs(ideal))}),
        _target(d, 5, "Pinned staging >= 50x faster than PinnedHostMemoryResource", ">=", 50.0,
                {"staging": ratio(secs(RMM_PINNED), secs(APR))}),
    ]


def _section3(d: _Doc) -> list:
    s = d.sec(3)
    counts = s.get("thread_counts") or [8]
    n = "8" if 8 in counts else str(max(counts))
    sizes = s.get("sizes") or [4096]
    results = s.get("results") or {}

    def agg(name, size):
        return median_of(((results.get(name) or {}).get(str(size)) or {}).get(n), "pairs_per_s")

    return [
        _target(d, 3, f"{n} threads: {ours} aggregate >= 2x {theirs}", ">=", 2.0,
                {fmt_size(sz): ratio(agg(ours, sz), agg(theirs, sz)) for sz in sizes})
        for ours, theirs in ((AMR, RMM_POOL_MANAGED), (APR, RMM_POOL_PINNED))
    ]


def _section4(d: _Doc) -> list:
    s = d.sec(4)
    results = s.get("results") or {}
    requested = (s.get("workload") or {}).get("requested_peak_bytes")
    out = []
    for kind in ("managed", "pinned", "device"):
        entry = results.get(kind) or {}
        ours, theirs = entry.get("ours") or {}, entry.get("adaptor") or {}
        ours_high, theirs_high = ours.get("reserved_high"), theirs.get("reserved_high")
        # The requested peak is the same for both sides, so the ratio of the two
        # reserved/requested figures is the ratio of the reserved peaks.
        out.append(_target(
            d, 4, f"Random workload [{kind}]: reserved_high/used_high no worse than the "
            "adaptor's (ours / adaptor, requested peak as used)", "<=", 1.0,
            {kind: ratio(ours_high, theirs_high)},
            detail={"ours": ratio(ours_high, requested), "adaptor": ratio(theirs_high, requested),
                    "ours_own_used": ratio(ours_high, ours.get("used_high")),
                    "adaptor_own_used": ratio(theirs_high, theirs.get("used_high"))}))
        after = ours.get("reserved_after_trim")
        out.append(_target(
            d, 4, f"Random workload [{kind}]: trim(0) returns everything once nothing is live "
            "(reserved bytes after)", "==", 0,
            {kind: after if isinstance(after, (int, float)) else None}))
    return out


def _section7(d: _Doc) -> list:
    s = d.sec(7)
    auto = with_release_gil(APR_NEW, "auto")
    stall = ((s.get("stall") or {}).get("results") or {}).get(auto) or {}
    gaps = [r.get("longest_gap_ms") for r in stall.get("runs") or [] if isinstance(r, dict)]
    gaps = [g for g in gaps if isinstance(g, (int, float)) and g == g]
    stall_ms = percentile(gaps, 0.5) if gaps and "error" not in stall else None

    th = s.get("threads") or {}
    counts = th.get("thread_counts") or [8]
    n = str(max(counts))
    tres = th.get("results") or {}

    def agg(name):
        return median_of((tres.get(name) or {}).get(n), "pairs_per_s")

    pair = (s.get("pair_cost") or {}).get("results") or {}
    per_kind = {}
    for kind in ("device", "pinned", "managed"):
        rounds = (pair.get(kind) or {}).get("rounds_us") or {}
        per_kind[kind] = median_ratio(rounds.get("auto") or [], rounds.get("never") or [])
    return [
        _target(d, 7, "GIL: longest ticker stall while a new pinned pool grows by 2 GiB "
                "(AsyncPinnedMR, release_gil='auto') <= 5 ms", "<=", 5.0,
                {"median over growths, ms": stall_ms}),
        _target(d, 7, f"GIL: {n} threads, AsyncDeviceMR (release_gil='auto') aggregate >= 5x "
                f"{RMM_ASYNC}", ">=", 5.0,
                {"4 KiB": ratio(agg(with_release_gil(ADR, "auto")), agg(RMM_ASYNC))}),
        _target(d, 7, "GIL: single-thread 4 KiB pair cost, release_gil 'auto' / 'never' <= 1.05 "
                "(median of per-round ratios, each pool kind)", "<=", 1.05, per_kind),
    ]


def _section9(d: _Doc) -> list:
    res = d.sec(9).get("results") or {}

    def gbps(name, direction):
        return median_of((res.get(name) or {}).get(direction), "GBps")

    return [_target(d, 9, "asyncmr.pinned_empty copy bandwidth >= 0.95x cudaHostAlloc memory's "
                    "(H2D and D2H)", ">=", 0.95,
                    {dr: ratio(gbps(ASYNCMR_ARRAY, dr), gbps(CUPY_ARRAY, dr))
                     for dr in ("H2D", "D2H")})]


def _median_rounds(rounds):
    vals = [v for v in rounds if isinstance(v, (int, float))] if isinstance(rounds, list) else []
    return percentile(vals, 0.5) if vals else None


def _section11(d: _Doc) -> list:
    s = d.sec(11)
    sizes = s.get("sizes") or [4096, 65536]
    results = (s.get("python") or {}).get("results") or {}

    def rounds(name, size):
        entry = (results.get(name) or {}).get(str(size))
        return entry.get("rounds_us") if isinstance(entry, dict) and "error" not in entry else None

    cpp = s.get("cpp") or {}
    cpp_why = None
    for k in ("skipped", "error"):
        if k in cpp:
            cpp_why = f"C++ cache_bench {k}: {cpp[k]}"
    pinned = (cpp.get("pairs") or {}).get("pinned") or {}
    hit = {}
    # ns recording adds (median of per-round differences): to an uncached pair, and to a cached
    # hit, the allocation served from the cache timed apart from its free (cache_bench's "hits")
    added = {"uncached": {}, "hits": {}}
    for sz in sizes:
        entry = pinned.get(str(sz))
        rn = (entry.get("rounds_ns") or {}) if isinstance(entry, dict) else {}
        hit[f"pinned@{fmt_size(sz)}"] = _median_rounds(rn.get("cached"))
        for way in added:
            added[way][f"pinned@{fmt_size(sz)}"] = median_difference(
                rn.get(f"{way}_recording") or [], rn.get(way) or [])
    th = cpp.get("threads") or {}
    n = str(th.get("threads", 8))
    per_round = ((th.get("results") or {}).get("cached") or {}).get("rounds_pairs_per_s") or {}
    pyth = (s.get("python") or {}).get("threads") or {}
    pyn = str(pyth.get("threads", 8))
    py_rounds = pyth.get("rounds_pairs_per_s") or {}
    return [
        _target(d, 11, f"Front cache: {APR_CACHED} alloc+free from Python <= 0.45x "
                f"{CUPY_PINNED}'s (median of per-round ratios)", "<=", 0.45,
                {fmt_size(sz): median_ratio(rounds(APR_CACHED, sz), rounds(CUPY_PINNED, sz))
                 for sz in sizes}),
        _target(d, 11, f"Front cache: {ADR_CACHED} alloc+free from Python <= 0.25x the "
                f"{TORCH_CACHING}'s (median of per-round ratios)", "<=", 0.25,
                {fmt_size(sz): median_ratio(rounds(ADR_CACHED, sz), rounds(TORCH_CACHING, sz))
                 for sz in sizes}),
        _target(d, 11, "Front cache: C++ hit pair through rmm::device_async_resource_ref "
                "<= 150 ns (pinned, median of rounds)", "<=", 150.0, hit, why=cpp_why),
        _target(d, 11, f"Front cache: {n} threads on {n} streams >= 4x one thread (C++, cached "
                "pinned resource, median of per-round ratios)", ">=", 4.0,
                {f"{n} threads / 1 @ {fmt_size(th.get('bytes', 4096))}":
                 median_ratio(per_round.get(n), per_round.get("1"))}, why=cpp_why),
        _target(d, 11, f"Front cache: {pyn} Python threads on {pyn} streams >= 3x one thread "
                "(cached pinned resource, median of per-round ratios)", ">=", 3.0,
                {f"{pyn} threads / 1 @ {fmt_size(pyth.get('bytes', 4096))}":
                 median_ratio(py_rounds.get(pyn), py_rounds.get("1"))},
                why=f"Python threads: {pyth['error']}" if "error" in pyth else None),
        _target(d, 11, "History: recording adds <= 100 ns to an uncached pair (C++, pinned, "
                "median of per-round differences against recording off)", "<=", 100.0,
                added["uncached"], why=cpp_why),
        _target(d, 11, "History: recording adds <= 60 ns to a cached hit (C++, pinned: the "
                "allocation served from the cache, timed apart from its free; median of "
                "per-round differences against recording off)", "<=", 60.0,
                added["hits"], why=cpp_why),
    ]


def _section12(d: _Doc) -> list:
    s = d.sec(12)

    def rounds(scenario, way):
        e = (s.get(scenario) or {}).get(way)
        return e.get("rounds_ms") if isinstance(e, dict) and "error" not in e else None

    discarding, rmm_stack = ("AsyncManagedMR(prefetch='device', discard=True)",
                             "rmm PrefetchResourceAdaptor stack")
    no_discard = (None if discarding in (s.get("reused") or {})
                  else "this build has no discard (the CUDA 12 build)")
    against_stack = {"b": median_ratio(rounds("reused", "AsyncManagedMR(prefetch='device')"),
                                       rounds("reused", rmm_stack))}
    if no_discard is None:  # the CUDA 12 build has only the plain way
        against_stack["b, discard=True"] = median_ratio(rounds("reused", discarding),
                                                        rounds("reused", rmm_stack))
    loop, batch = rounds("small_ranges", "loop of cudaMemPrefetchAsync"), \
        rounds("small_ranges", "cudaMemPrefetchBatchAsync")
    fastest = None
    if loop or batch:  # the faster of the two, round by round (either may be missing)
        pairs = list(zip(loop or batch, batch or loop))
        fastest = [min(a, b) for a, b in pairs]
    return [
        _target(d, 12, "Managed placement: host-written data, faults / asyncmr.prefetch before "
                "the kernel >= 4 (median of per-round ratios)", ">=", 4.0,
                {"a": median_ratio(rounds("host_written", "faults"),
                                    rounds("host_written", "asyncmr.prefetch"))}),
        _target(d, 12, "Managed placement: reused host-touched pool memory, no prefetch / "
                "prefetch='device', discard=True >= 10 (median of per-round ratios; a plain "
                "prefetch= migrates the old contents and is bound by the link)", ">=", 10.0,
                {"b": median_ratio(rounds("reused", "AsyncManagedMR()"),
                                    rounds("reused", discarding))},
                why=no_discard),
        _target(d, 12, "Managed placement: prefetch='device' (with and without discard=True) "
                "within 1.1x of RMM's PrefetchResourceAdaptor stack (median of per-round "
                "ratios)", "<=", 1.1,
                against_stack),
        _target(d, 12, "Managed placement: asyncmr.prefetch of many ranges within 1.1x of the "
                "faster of a loop and the batched call (median of per-round ratios)", "<=", 1.1,
                {"c": median_ratio(rounds("small_ranges", "asyncmr.prefetch"), fastest)}),
    ]


def _section13(d: _Doc) -> list:
    s = d.sec(13)
    door, pool = "python -m asyncmr cudf-pandas", "cudf.pandas managed_pool"
    part_a, part_b = s.get("cudf_pandas") or {}, s.get("cuml") or {}
    pd_ = part_a.get("results") or {}

    def pandas_rounds(way, key):
        e = pd_.get(way)
        return e.get(key) if isinstance(e, dict) and "error" not in e else None

    ml = part_b.get("results") or {}

    def fit_rounds(way, estimator):
        e = ml.get(way)
        if not isinstance(e, dict) or "error" in e:
            return None
        return ((e.get("fits") or {}).get(estimator) or {}).get("rounds_s")

    estimators = ("KMeans", "LogisticRegression", "RandomForestClassifier", "Ridge")
    ml_pool = "rmm PoolMemoryResource(ManagedMemoryResource())"
    why_a = part_a.get("skipped") or part_a.get("error")
    why_b = part_b.get("skipped") or part_b.get("error")
    return [
        _target(d, 13, "Managed stacks: the cudf.pandas workload through asyncmr's door <= "
                "0.85x the warm time of cudf.pandas's managed_pool mode (median of per-round "
                "ratios)", "<=", 0.85,
                {"warm": median_ratio(pandas_rounds(door, "rounds_warm_s"),
                                       pandas_rounds(pool, "rounds_warm_s"))},
                why=f"a. {why_a}" if why_a else None),
        _target(d, 13, "Managed stacks: the cudf.pandas workload's first run through asyncmr's "
                "door <= 1.0x managed_pool's (median of per-round ratios)", "<=", 1.0,
                {"first": median_ratio(pandas_rounds(door, "rounds_first_s"),
                                        pandas_rounds(pool, "rounds_first_s"))},
                why=f"a. {why_a}" if why_a else None),
        _target(d, 13, "Managed stacks: each cuML fit on AsyncManagedMR() <= 0.9x its time on "
                "PoolMemoryResource(ManagedMemoryResource()) (median of per-round ratios)",
                "<=", 0.9,
                {e: median_ratio(fit_rounds("AsyncManagedMR()", e), fit_rounds(ml_pool, e))
                 for e in estimators},
                why=f"b. {why_b}" if why_b else None),
    ]


# Sections 2, 6, 8 and 10 report without targets.
_ORDER = (_section1, _section5, _section3, _section4, _section7, _section9, _section11,
          _section12, _section13)


def compute_targets(doc: dict) -> list:
    """Every target of the benchmark, recomputed from the raw numbers in ``doc``."""
    d = _Doc(doc)
    return [t for fn in _ORDER for t in fn(d)]


def tally(targets: list) -> tuple:
    """(met, counted, not run): counted excludes the targets of sections not run."""
    counted = [t for t in targets if t.get("status") != NOT_RUN]
    return (sum(1 for t in counted if t.get("met")), len(counted),
            len(targets) - len(counted))


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def print_targets(targets: list, verbose: bool = False, stored: list | None = None) -> None:
    """One line per target: PASS / FAIL / NOT RUN, the worst cell, what was wanted, and why a
    target with missing cells failed; ``verbose`` adds every cell. ``stored``: the targets the
    file holds, to flag any whose stored flag disagrees with the recomputed one."""
    if not targets:
        print("no targets")
        return
    old = {t.get("name"): t.get("met") for t in stored or [] if isinstance(t, dict)}
    width = max(len(t["name"]) for t in targets)
    for t in targets:
        status = {MET: "PASS", NOT_MET: "FAIL", NOT_RUN: "NOT RUN"}[t["status"]]
        line = f"{status:<7}  {t['name']:<{width}}  {_fmt(t['value']):>8}  wanted {t['target']}"
        if t.get("note"):
            line += f"  ({t['note']})"
        print(line)
        if verbose:
            print("         " + ", ".join(f"{k}: {_fmt(v)}" for k, v in t["cells"].items()))
            if t.get("detail"):
                print("         " + ", ".join(f"{k}: {_fmt(v)}" for k, v in t["detail"].items()))
        if t["name"] in old and t["status"] != NOT_RUN and bool(old[t["name"]]) != t["met"]:
            print(f"         (the file's stored flag said {'met' if old[t['name']] else 'not met'};"
                  " recomputed from its numbers it is "
                  f"{'met' if t['met'] else 'not met'})")
    met, counted, not_run = tally(targets)
    # Deliberately not "N passed, M failed": a report, and CI must not read it as tests.
    tail = f" ({not_run} not run: sections not asked for)" if not_run else ""
    print(f"targets met: {met} of {counted}{tail}")
