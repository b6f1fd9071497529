# SPDX-License-Identifier: Apache-2.0
"""Names, statistics and table printing shared by every part of the benchmark.

Standard library only: ``targets`` (and so ``benchmarks/check_targets.py``) imports this on
machines with no GPU and no asyncmr.
"""

from __future__ import annotations

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
UINT64_MAX = 2**64 - 1

# Section number -> (results.json key, title). The keys are the JSON schema: never renumber.
SECTIONS = {
    1: ("1_pair_cost", "Alloc+free pair cost, one stream (us per pair)"),
    2: ("2_sync_threshold",
        "Alloc+free+synchronize rounds: release threshold 0 vs max (us per round)"),
    3: ("3_threads", "Threads, one stream each: aggregate alloc+free pairs per second"),
    4: ("4_fragmentation", "Fragmentation: seeded random workload, reserved vs used, trim(0)"),
    5: ("5_pinned_staging", "Pinned staging: host-to-device in chunks, and one large copy"),
    6: ("6_managed_cupy", "Managed CuPy pipeline with many short-lived temporaries (wall time)"),
    7: ("7_gil", "The GIL: a ticker thread during pool growth, 8 threads, pair cost"),
    8: ("8_cupy_pinned_staging",
        "CuPy staging through its pinned allocator: CuPy's pool vs asyncmr's pool"),
    9: ("9_pinned_arrays", "Pinned NumPy arrays: copy bandwidth, asyncmr vs cudaHostAlloc"),
    10: ("10_cudf_parquet", "cuDF Parquet round trip: cuDF's pinned resource vs asyncmr's pool"),
    11: ("11_front_cache",
         "Front cache: cached pinned pairs vs CuPy's pinned pool, C++ hits, threads"),
    12: ("12_managed_placement",
         "Managed placement: prefetch before a kernel, at allocation, many ranges, discard"),
    13: ("13_managed_stacks", "Managed stacks: cudf.pandas and cuML on asyncmr vs RMM's managed"),
}
SECTION_KEYS = {num: key for num, (key, _) in SECTIONS.items()}
SECTION_TITLES = {num: title for num, (_, title) in SECTIONS.items()}

# Contender names, written once: the tables, the JSON, the targets and the plots use these.
AMR = "AsyncManagedMR"
AMR_NEW = "AsyncManagedMR(pool='new')"
APR = "AsyncPinnedMR"
APR_NEW = "AsyncPinnedMR(pool='new')"
ADR = "AsyncDeviceMR"
ADR_NEW = "AsyncDeviceMR(pool='new')"
RMM_ASYNC = "rmm CudaAsyncMemoryResource"
RMM_ASYNC_MANAGED = "rmm experimental.CudaAsyncManagedMemoryResource"
RMM_MANAGED = "rmm ManagedMemoryResource"
RMM_PINNED = "rmm PinnedHostMemoryResource"
RMM_POOL_MANAGED = "rmm PoolMemoryResource(ManagedMemoryResource)"
RMM_POOL_PINNED = "rmm PoolMemoryResource(PinnedHostMemoryResource)"
RMM_POOL_DEVICE = "rmm PoolMemoryResource(CudaMemoryResource)"
CC_MANAGED = "cuda.core ManagedMemoryResource"
CC_PINNED = "cuda.core PinnedMemoryResource"
CUPY_ASYNC = "cupy MemoryAsyncPool"
CUPY_DEFAULT = "cupy default MemoryPool (device memory, reference)"
# Section 5's rows.
STAGING_IDEAL = "cudaHostAlloc buffer, preallocated (ideal)"
POOL_MEMORY = "AsyncPinnedMR (pinned pool memory)"
HOSTALLOC_MEMORY = "cudaHostAlloc memory"
# Section 11's rows. The cap is fixed (the row name is a JSON key and says it).
FRONT_CACHE_BYTES = 64 << 20
APR_CACHED = "AsyncPinnedMR(pool='new', cache=64 MiB)"
ADR_CACHED = "AsyncDeviceMR(pool='new', cache=64 MiB)"
# The same cached pinned resource called as a Python user types it: no stream, so RMM's default
# stream (the legacy stream), whose puts set no marker.
APR_CACHED_DEFAULT = "AsyncPinnedMR(pool='new', cache=64 MiB), default stream"
CUPY_PINNED = "cupy PinnedMemoryPool"
TORCH_CACHING = "torch caching allocator (caching_allocator_alloc/delete)"
# Section 9's rows.
ASYNCMR_ARRAY = "asyncmr.pinned_empty (pinned pool)"
CUPY_ARRAY = "cupyx.empty_pinned (cudaHostAlloc)"


def floor_of(name: str) -> str:
    """The section 1 row of the raw floor on the pool of asyncmr contender ``name``."""
    return f"raw floor, in process: {name}"


# The C++ floor program's pool keys, and the Python contender that allocates from each pool.
FLOOR_POOL_OF = {
    AMR: "managed_default_dev0",
    AMR_NEW: "managed_owned_dev0",
    APR: "pinned_default_host",
    APR_NEW: "pinned_owned_host",
    ADR: "device_default_dev0",
    ADR_NEW: "device_owned_dev0",
}


def with_release_gil(name: str, mode: str) -> str:
    """Section 7's name of an asyncmr contender with ``release_gil`` set to ``mode``."""
    return f"{name} release_gil={mode!r}"


# ---- sizes ---------------------------------------------------------------------------------


def fmt_size(n: int) -> str:
    """256 B, 4 KiB, 1 MiB, 64 MiB, 2 GiB (exact units where they divide)."""
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def parse_size(text: str) -> int:
    """'256', '4KiB', '4K', '1MiB', '64M', '2GiB' -> bytes."""
    t = text.strip().upper().replace(" ", "")
    for suffix, mult in (("GIB", GiB), ("MIB", MiB), ("KIB", KiB), ("G", GiB), ("M", MiB),
                         ("K", KiB), ("B", 1)):
        if t.endswith(suffix):
            value = int(float(t[: -len(suffix)]) * mult)
            break
    else:
        value = int(t)
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


# ---- statistics ----------------------------------------------------------------------------


def percentile(values, q: float) -> float:
    """Linear-interpolated percentile, q in [0, 1]."""
    v = sorted(values)
    if not v:
        return float("nan")
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    frac = pos - lo
    return v[lo] * (1.0 - frac) + v[hi] * frac


def _numbers(a, b) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float))


def median_ratio(num, den):
    """The median of num[i] / den[i] over the rounds both lists have (the two ran side by side
    in round i), or None."""
    if not isinstance(num, list) or not isinstance(den, list):
        return None
    r = [a / b for a, b in zip(num, den) if _numbers(a, b) and b]
    return percentile(r, 0.5) if r else None


def median_difference(on, off):
    """The median of on[i] - off[i] over the rounds both lists have, or None."""
    if not isinstance(on, list) or not isinstance(off, list):
        return None
    d = [a - b for a, b in zip(on, off) if _numbers(a, b)]
    return percentile(d, 0.5) if d else None


def summarize(values, unit: str, scale: float = 1.0) -> dict:
    """{median_<unit>, p10_<unit>, p90_<unit>, n} of values * scale."""
    vals = [x * scale for x in values]
    return {
        f"median_{unit}": percentile(vals, 0.5),
        f"p10_{unit}": percentile(vals, 0.1),
        f"p90_{unit}": percentile(vals, 0.9),
        "n": len(vals),
    }


def median_of(entry, unit: str = "us"):
    """The median of a summary dict, or None for an error, a skip or a missing cell."""
    if isinstance(entry, dict) and "error" not in entry:
        value = entry.get(f"median_{unit}")
        return value if isinstance(value, (int, float)) else None
    return None


def ratio(a, b):
    """a / b, or None when either is missing or b is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def err_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


# ---- tables --------------------------------------------------------------------------------


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    print()
    print(title)
    if not rows:
        print("  (nothing measured)")
        return
    rows = [(list(r) + [""] * len(header))[: len(header)] for r in rows]  # never fail to print
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in
                     enumerate(zip(header, widths, strict=True)))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in
                        enumerate(zip(r, widths, strict=True))))


def cell(entry, unit: str = "us", digits: int = 2) -> str:
    """'median [p10-p90]' of a summary dict, or 'error', or '-'."""
    if not isinstance(entry, dict):
        return "-"
    if "error" in entry:
        return "error"
    med = entry.get(f"median_{unit}")
    if med is None:
        return "-"
    return (f"{med:.{digits}f} [{entry[f'p10_{unit}']:.{digits}f}-"
            f"{entry[f'p90_{unit}']:.{digits}f}]")


def fmt_ratio(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def print_ratios(ratios: dict, sizes) -> None:
    """A ratio table: one row per ratio (or per ratio and sub-key), one column per size."""
    rows = []
    for name, per in ratios.items():
        if not per:
            continue
        if all(isinstance(v, dict) for v in per.values()):
            for sub, vals in per.items():
                rows.append([f"{name} [{sub}]"] + [fmt_ratio(vals.get(str(s))) for s in sizes])
        else:
            rows.append([name] + [fmt_ratio(per.get(str(s))) for s in sizes])
    if rows:
        print_table("  ratios", ["ratio"] + [fmt_size(s) for s in sizes], rows)


def print_ratio_values(ratios: dict) -> None:
    """A ratio table of single values: one row per ratio."""
    print_table("  ratios", ["ratio", "value"], [[k, fmt_ratio(v)] for k, v in ratios.items()])


def copy_row(name: str, e: dict, width: int = 60) -> list:
    """A table row for one copy each way: name, H2D and D2H GB/s as 'median [p10-p90]', or the
    error (its first ``width`` characters)."""
    if "error" in e:
        return [name, f"error: {e['error'][:width]}", ""]
    return [name, cell(e.get("H2D"), "GBps"), cell(e.get("D2H"), "GBps")]


def seconds_row(name: str, e: dict, last: str) -> list:
    """A table row for a timing in seconds: name, median ms, [p10-p90] ms, one more column."""
    if "error" in e:
        return [name, f"error: {e['error'][:60]}", "", ""]
    return [name, f"{e['median_s'] * 1e3:.1f}",
            f"[{e['p10_s'] * 1e3:.1f}-{e['p90_s'] * 1e3:.1f}]", last]
