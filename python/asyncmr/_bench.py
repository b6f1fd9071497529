# SPDX-License-Identifier: Apache-2.0
"""``python -m asyncmr bench``: asyncmr against what users have today, side by side in one run.

Six sections (see ``benchmarks/README.md``): alloc+free pair cost, the release-threshold policy
across synchronizations, threads, fragmentation and trim, pinned staging, and a managed CuPy
pipeline. Each prints a table, and the whole run writes ``results.json`` (medians, spreads, the
ratios the issue's targets name, and the targets with PASS/FAIL) and PNG plots to ``--out``.

Every contender is built and measured inside its own ``try``: a library that is missing or
refuses something records the error string in the JSON instead of ending the run. Timing:
warm-up first, then repeated rounds; the median and the 10th/90th percentiles of the rounds
are reported. Contenders of one size run interleaved, round by round, so drift on a shared
machine hits all of them alike.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import math
import os
import platform
import random
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
UINT64_MAX = 2**64 - 1

DEFAULT_SIZES = (256, 4 * KiB, 1 * MiB, 64 * MiB)
THREAD_COUNTS = (1, 2, 4, 8)
# RMM's PoolMemoryResource takes half the free *device* memory when no initial size is given,
# even over a pinned-host upstream; every adaptor here gets an explicit size instead.
POOL_ADAPTOR_INITIAL = 256 * MiB

SECTION_KEYS = {
    1: "1_pair_cost",
    2: "2_sync_threshold",
    3: "3_threads",
    4: "4_fragmentation",
    5: "5_pinned_staging",
    6: "6_managed_cupy",
}
SECTION_TITLES = {
    1: "Alloc+free pair cost, one stream (us per pair)",
    2: "Alloc+free+synchronize rounds: release threshold 0 vs max (us per round)",
    3: "Threads, one stream each: aggregate alloc+free pairs per second",
    4: "Fragmentation: seeded random workload, reserved vs used, trim(0)",
    5: "Pinned staging: host-to-device in chunks, and one large copy",
    6: "Managed CuPy pipeline with many short-lived temporaries (wall time)",
}

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


# ---- small helpers -------------------------------------------------------------------------


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


def summarize(values, unit: str, scale: float = 1.0) -> dict:
    """{median_<unit>, p10_<unit>, p90_<unit>, n} of values * scale."""
    vals = [x * scale for x in values]
    return {
        f"median_{unit}": percentile(vals, 0.5),
        f"p10_{unit}": percentile(vals, 0.1),
        f"p90_{unit}": percentile(vals, 0.9),
        "n": len(vals),
    }


def err_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


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


def _cell(entry, unit: str = "us", digits: int = 2) -> str:
    """'median [p10-p90]' of a summary dict, or the error, or '-'."""
    if not isinstance(entry, dict):
        return "-"
    if "error" in entry:
        return "error"
    med = entry.get(f"median_{unit}")
    if med is None:
        return "-"
    return (f"{med:.{digits}f} [{entry[f'p10_{unit}']:.{digits}f}-"
            f"{entry[f'p90_{unit}']:.{digits}f}]")


def _median(entry, unit: str = "us"):
    if isinstance(entry, dict) and "error" not in entry:
        return entry.get(f"median_{unit}")
    return None


def _ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


# ---- configuration -------------------------------------------------------------------------


@dataclass
class Config:
    quick: bool
    sections: list
    sizes: list
    repeats: int
    out: str
    floor_bin: str | None
    no_floor: bool
    seed: int
    round_ms: float  # section 1: target length of one timed round
    warmup_ms: float  # section 1: minimum warm-up per contender and size
    sync_rounds: int  # section 2: rounds per contender and size (at most)
    sync_budget_s: float  # section 2: time cap per contender and size
    thread_counts: tuple
    thread_sizes: list
    thread_round_ms: float  # section 3: target length of one single-thread round
    thread_repeats: int
    frag_ops: int
    frag_cap: int
    staging_total: int
    staging_chunk: int
    staging_repeats: int
    big_copy: int
    copy_repeats: int
    cupy_iters: int
    cupy_elems: int
    cupy_repeats: int


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m asyncmr bench",
        description="Benchmark asyncmr's resources against RMM, cuda.core and CuPy "
        "(needs a CUDA GPU).",
    )
    p.add_argument("--sections", default="1,2,3,4,5,6",
                   help="comma list of sections to run, from 1..6 (default: all)")
    p.add_argument("--sizes", default=None,
                   help="comma list of sizes for sections 1 and 2, e.g. 256,4KiB,1MiB,64MiB "
                   "(the default)")
    p.add_argument("--quick", action="store_true",
                   help="fewer and shorter rounds, smaller staging; under two minutes")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed rounds per measurement (default 15, quick 7)")
    p.add_argument("--out", default="asyncmr-bench",
                   help="directory for results.json and the PNG plots (default ./asyncmr-bench)")
    p.add_argument("--floor-bin", default=None,
                   help="path of the C++ pool_floor program (default: $ASYNCMR_FLOOR_BIN, else "
                   "build/cpp/benchmarks/cpp/pool_floor under the working directory or the "
                   "source tree)")
    p.add_argument("--no-floor", action="store_true", help="skip the C++ floor")
    p.add_argument("--seed", type=int, default=20261130, help="seed of the section 4 workload")
    return p


def _make_config(parser: argparse.ArgumentParser, args) -> Config:
    """The run's settings; bad option values end the process through parser.error (status 2)."""
    try:
        sections = sorted({int(s) for s in args.sections.split(",") if s.strip()})
    except ValueError:
        parser.error(f"--sections: expected a comma list of 1..6, got {args.sections!r}")
    if not sections or any(s not in SECTION_KEYS for s in sections):
        parser.error(f"--sections: expected numbers from 1..6, got {args.sections!r}")
    sizes = list(DEFAULT_SIZES)
    if args.sizes:
        try:
            sizes = sorted({parse_size(s) for s in args.sizes.split(",") if s.strip()})
        except ValueError as e:
            parser.error(f"--sizes: {e}")
        if not sizes:
            parser.error("--sizes: no size given")
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be >= 1")
    q = args.quick
    return Config(
        quick=q,
        sections=sections,
        sizes=sizes,
        repeats=args.repeats or (7 if q else 15),
        out=args.out,
        floor_bin=args.floor_bin,
        no_floor=args.no_floor,
        seed=args.seed,
        round_ms=4.0 if q else 20.0,
        warmup_ms=10.0 if q else 50.0,
        sync_rounds=30 if q else 100,
        sync_budget_s=0.4 if q else 1.5,
        thread_counts=THREAD_COUNTS,
        thread_sizes=[4 * KiB] if q else [4 * KiB, 1 * MiB],
        thread_round_ms=10.0 if q else 40.0,
        thread_repeats=3 if q else 5,
        frag_ops=1500 if q else 4000,
        frag_cap=512 * MiB if q else 1 * GiB,
        staging_total=512 * MiB if q else 2 * GiB,
        staging_chunk=4 * MiB,
        staging_repeats=3 if q else 5,
        big_copy=256 * MiB if q else 1 * GiB,
        copy_repeats=5 if q else 10,
        cupy_iters=150 if q else 500,
        cupy_elems=1 << 20,
        cupy_repeats=3 if q else 5,
    )


# ---- the run's shared objects --------------------------------------------------------------


class Context:
    """Modules and streams the sections share; the optional libraries are imported lazily."""

    def __init__(self):
        import asyncmr
        import rmm
        import rmm.mr
        from rmm.pylibrmm.stream import Stream

        self.asyncmr = asyncmr
        self.rmm = rmm
        self.Stream = Stream
        self.stream = self.new_stream()
        self._cc = None
        self._cp = None

    def new_stream(self):
        """A new non-blocking rmm Stream (so the legacy default stream never serializes us)."""
        try:
            from rmm.pylibrmm.stream import CudaStreamFlags

            return self.Stream(flags=CudaStreamFlags.NON_BLOCKING)
        except (ImportError, TypeError, AttributeError):
            return self.Stream()

    @staticmethod
    def handle(stream) -> int:
        """The cudaStream_t of an rmm Stream, as an int."""
        return int(stream.__cuda_stream__()[1])

    def cuda_core(self):
        """(cuda.core module, Device, Stream); raises ImportError when cuda.core is missing."""
        if self._cc is None:
            import cuda.core as mod  # a missing cuda.core raises ImportError here, as it should

            if not hasattr(mod, "Device"):  # before 1.0 everything lived in cuda.core.experimental
                import cuda.core.experimental as mod
            dev = mod.Device(0)
            dev.set_current()
            self._cc = (mod, dev, dev.create_stream())
        return self._cc

    def cupy(self):
        """(cupy module, a non-blocking CuPy stream); raises ImportError when CuPy is missing."""
        if self._cp is None:
            import cupy

            self._cp = (cupy, cupy.cuda.Stream(non_blocking=True))
        return self._cp


def _cc_class(ctx: Context, name: str):
    mod = ctx.cuda_core()[0]
    cls = getattr(mod, name, None)
    if cls is None:
        raise RuntimeError(f"cuda.core {getattr(mod, '__version__', '?')} has no {name}")
    return cls


def _rmm_async_managed_class(ctx: Context):
    exp = getattr(ctx.rmm.mr, "experimental", None)
    cls = getattr(exp, "CudaAsyncManagedMemoryResource", None) if exp is not None else None
    if cls is None:
        raise RuntimeError("rmm.mr.experimental.CudaAsyncManagedMemoryResource is not available "
                           f"in rmm {getattr(ctx.rmm, '__version__', '?')}")
    return cls


def _pool_adaptor(ctx: Context, upstream_factory, initial=POOL_ADAPTOR_INITIAL):
    return ctx.rmm.mr.PoolMemoryResource(upstream_factory(), initial_pool_size=initial)


# ---- meta ----------------------------------------------------------------------------------


def _dist_version(*names):
    from importlib import metadata

    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return None


def _cuda_check(result, what: str):
    """cuda.bindings calls return (err, *values): raise on error, return the values."""
    from cuda.bindings import runtime as cudart

    err = result[0]
    if err != cudart.cudaError_t.cudaSuccess:
        name = cudart.cudaGetErrorName(err)[1]
        raise RuntimeError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    values = result[1:]
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _version_str(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}" if v else "none"


def collect_meta(ctx: Context) -> dict:
    am = ctx.asyncmr
    meta = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cuda_driver_api": _version_str(am.driver_version()),
        "cuda_runtime_asyncmr": _version_str(am.runtime_version()),
        "device_count": am.device_count(),
        "versions": {
            "asyncmr": getattr(am, "__version__", None),
            "rmm": _dist_version("rmm-cu13", "rmm-cu12", "rmm"),
            "librmm": _dist_version("librmm-cu13", "librmm-cu12", "librmm"),
            "cupy": _dist_version("cupy-cuda13x", "cupy-cuda12x", "cupy"),
            "cuda-core": _dist_version("cuda-core", "cuda_core"),
            "cuda-bindings": _dist_version("cuda-bindings", "cuda_bindings", "cuda-python"),
            "numpy": _dist_version("numpy"),
            "matplotlib": _dist_version("matplotlib"),
        },
    }
    try:
        from cuda.bindings import runtime as cudart

        props = _cuda_check(cudart.cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
        name = props.name
        meta["gpu"] = (name.decode(errors="replace") if isinstance(name, bytes) else str(name)
                       ).rstrip("\x00")
        meta["gpu_memory_bytes"] = int(props.totalGlobalMem)
        meta["compute_capability"] = f"{props.major}.{props.minor}"
        meta["cuda_runtime_bindings"] = _version_str(
            _cuda_check(cudart.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion"))
    except Exception as e:  # noqa: BLE001 - meta is best effort
        meta["gpu_error"] = err_text(e)
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader", "-i", "0"],
            capture_output=True, text=True, timeout=20, check=False)
        if out.returncode == 0 and out.stdout.strip():
            meta["nvidia_smi"] = out.stdout.strip()
            meta["driver"] = out.stdout.strip().split(",")[-1].strip()
    except (OSError, subprocess.SubprocessError) as e:
        meta["nvidia_smi_error"] = err_text(e)
    return meta


# ---- section 1: pair cost ------------------------------------------------------------------


def _pair_contenders(ctx: Context):
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
        (RMM_ASYNC_MANAGED, "rmm", lambda: _rmm_async_managed_class(ctx)()),
        (RMM_MANAGED, "rmm", lambda: mr.ManagedMemoryResource()),
        (RMM_PINNED, "rmm", lambda: mr.PinnedHostMemoryResource()),
        (RMM_POOL_MANAGED, "rmm", lambda: _pool_adaptor(ctx, mr.ManagedMemoryResource)),
        (RMM_POOL_PINNED, "rmm", lambda: _pool_adaptor(ctx, mr.PinnedHostMemoryResource)),
        (CC_MANAGED, "cuda.core", lambda: _cc_class(ctx, "ManagedMemoryResource")()),
        (CC_PINNED, "cuda.core", lambda: _cc_class(ctx, "PinnedMemoryResource")()),
        (CUPY_ASYNC, "cupy", lambda: ctx.cupy()[0].cuda.MemoryAsyncPool()),
    ]


def _pair_runner(ctx: Context, family: str, obj, size: int):
    """(run(n) -> elapsed ns of n alloc+free pairs, sync()) for one contender and size.

    The loops are the tightest Python each library allows: bound methods looked up once,
    the pointer passed straight from allocate to deallocate.
    """
    ns = time.perf_counter_ns
    if family == "rmm":
        alloc, dealloc, s = obj.allocate, obj.deallocate, ctx.stream

        def run(n):
            t0 = ns()
            for _ in range(n):
                dealloc(alloc(size, s), size, s)
            return ns() - t0

        return run, s.synchronize
    if family == "floor":
        raw, s = ctx.asyncmr._core._raw_pool_pairs, ctx.stream

        def run(n):
            return raw(obj, size, s, n)  # timed inside, in C++

        return run, s.synchronize
    if family == "cuda.core":
        s = ctx.cuda_core()[2]
        alloc = obj.allocate

        def run(n):
            t0 = ns()
            for _ in range(n):
                alloc(size, stream=s).close(s)
            return ns() - t0

        return run, s.sync
    if family == "cupy":
        s = ctx.cupy()[1]
        malloc = obj.malloc

        def run(n):
            with s:  # MemoryAsyncPool allocates and frees on the current CuPy stream
                t0 = ns()
                for _ in range(n):
                    malloc(size)  # the MemoryPointer dies at once: freed on the stream
                return ns() - t0

        return run, s.synchronize
    raise ValueError(family)


def _timed(run, n):
    """run(n) with the garbage collector held off, so no collection lands in a round."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return run(n)
    finally:
        if enabled:
            gc.enable()


def _calibrate(run, sync, cfg: Config) -> int:
    """Warm up (at least cfg.warmup_ms), then the pair count that makes one round ~round_ms."""
    spent = _timed(run, 1)
    sync()
    per = spent
    n = 1
    while spent < cfg.warmup_ms * 1e6 and n < (1 << 18):
        n *= 4
        t = _timed(run, n)
        sync()
        spent += t
        per = t / n
    return int(min(max(cfg.round_ms * 1e6 / max(per, 1.0), 3), 200_000))


def find_floor_bin(cfg: Config):
    """The pool_floor binary, or (None, places looked)."""
    rel = Path("build/cpp/benchmarks/cpp/pool_floor")
    candidates = []
    if cfg.floor_bin:
        candidates.append(Path(cfg.floor_bin))
    elif os.environ.get("ASYNCMR_FLOOR_BIN"):
        candidates.append(Path(os.environ["ASYNCMR_FLOOR_BIN"]))
    else:
        candidates.append(Path.cwd() / rel)
        # python/asyncmr/_bench.py in a source tree -> the repository root is two levels up.
        candidates.append(Path(__file__).resolve().parents[2] / rel)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c, candidates
    return None, candidates


def run_floor(cfg: Config) -> dict:
    """Runs the C++ floor program and returns its JSON (or why there is none)."""
    if cfg.no_floor:
        return {"skipped": "--no-floor"}
    path, looked = find_floor_bin(cfg)
    if path is None:
        return {"skipped": "no pool_floor binary (looked at: " +
                ", ".join(str(p) for p in looked) + "); build it with cmake "
                "-DASYNCMR_BUILD_BENCHMARKS=ON, or pass --floor-bin PATH"}
    cmd = [str(path), "--sizes", ",".join(str(s) for s in cfg.sizes)]
    if cfg.quick:
        cmd.append("--quick")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": err_text(e), "command": cmd}
    parsed = None
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            parsed = json.loads(line)
            break
        except json.JSONDecodeError:
            continue
    if proc.returncode != 0 or not isinstance(parsed, dict) or "floor" not in parsed:
        return {"error": f"pool_floor exited {proc.returncode}: " +
                (proc.stderr.strip()[-2000:] or proc.stdout.strip()[-2000:]),
                "command": cmd, "output": parsed}
    parsed["command"] = cmd
    if parsed.get("meta", {}).get("optimized") is False:
        # An -O0 floor program times the compiler, not the library: no ratio is drawn from it.
        return {"error": f"{path} was built without optimization; configure it with "
                "-DCMAKE_BUILD_TYPE=Release (the default when none is given) and rebuild",
                "command": cmd, "output": parsed}
    return parsed


def section_pair_cost(cfg: Config, ctx: Context) -> dict:
    contenders = _pair_contenders(ctx)
    results: dict = {name: {} for name, _, _ in contenders}  # rows in contender order
    built = {}
    for name, family, factory in contenders:
        try:
            built[name] = (family, factory())
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            results[name] = {"error": err_text(e)}

    # The raw floor of each asyncmr resource's own pool (two driver calls in a C++ loop), timed
    # as one more contender: in the same interleaved rounds as the Python resources.
    for name in FLOOR_POOL_OF:
        if name in built:
            results[floor_of(name)] = {}
            built[floor_of(name)] = ("floor", built[name][1].pool)

    for size in cfg.sizes:
        key = str(size)
        active = {}
        for name, (family, obj) in built.items():
            try:
                run, sync = _pair_runner(ctx, family, obj, size)
                n = _calibrate(run, sync, cfg)
                active[name] = (run, sync, n, [])
            except Exception as e:  # noqa: BLE001
                results.setdefault(name, {})[key] = {"error": err_text(e)}
        names = list(active)
        for r in range(cfg.repeats):
            k = r % max(len(names), 1)
            for name in names[k:] + names[:k]:  # rotate the order round by round
                if name not in active:
                    continue
                run, sync, n, samples = active[name]
                try:
                    elapsed = _timed(run, n)
                    sync()
                    samples.append(elapsed / n)
                except Exception as e:  # noqa: BLE001
                    results.setdefault(name, {})[key] = {"error": err_text(e)}
                    del active[name]
        for name, (_, _, n, samples) in active.items():
            entry = summarize(samples, "us", 1e-3)
            entry["pairs_per_round"] = n
            results.setdefault(name, {})[key] = entry
        print(f"  [1] {fmt_size(size)} done", flush=True)
    del built
    gc.collect()

    floor = run_floor(cfg)
    return {
        "sizes": cfg.sizes,
        "results": results,
        "cpp": floor,
        "ratios": _pair_ratios(results, floor, cfg.sizes),
        "notes": [
            "median/p10/p90 over rounds of N pairs on one non-blocking stream; N sized so a "
            f"round lasts about {cfg.round_ms} ms (at least 3 pairs)",
            f"PoolMemoryResource adaptors start with initial_pool_size={POOL_ADAPTOR_INITIAL}",
            "cuda.core: Buffer = mr.allocate(size, stream=s); Buffer.close(s). "
            "cupy: MemoryAsyncPool.malloc(size) on a non-blocking CuPy stream, freed when the "
            "MemoryPointer dies",
        ],
    }


def _pair_ratios(results: dict, floor: dict, sizes) -> dict:
    def med(name, size):
        return _median(results.get(name, {}).get(str(size)))

    def per_size(num, den):
        return {str(s): _ratio(med(num, s), med(den, s)) for s in sizes}

    python_floor = {name: per_size(name, floor_of(name)) for name in FLOOR_POOL_OF}
    ratios = {
        "AsyncPinnedMR / floor(pinned_default_host)": python_floor[APR],
        "PoolMemoryResource(PinnedHost) / AsyncPinnedMR": per_size(RMM_POOL_PINNED, APR),
        "cuda.core Pinned / AsyncPinnedMR": per_size(CC_PINNED, APR),
        "AsyncManagedMR / rmm experimental managed": per_size(AMR, RMM_ASYNC_MANAGED),
        "PoolMemoryResource(Managed) / AsyncManagedMR": per_size(RMM_POOL_MANAGED, AMR),
        "cuda.core Managed / AsyncManagedMR": per_size(CC_MANAGED, AMR),
        "AsyncDeviceMR / rmm CudaAsyncMemoryResource": per_size(ADR, RMM_ASYNC),
        "python / floor": python_floor,
        "via_ref / floor": {},
    }
    # The C++ program times the floor and the same pools through the reference in alternating
    # rounds and reports the median of the per-round ratios.
    paired = floor.get("via_ref_over_floor") if isinstance(floor, dict) else None
    for pool, per in (paired or {}).items():
        ratios["via_ref / floor"][pool] = {
            str(s): per[str(s)]["median"] if str(s) in per else None for s in sizes}
    return ratios


def print_pair_cost(res: dict) -> None:
    sizes = res.get("sizes", [])
    header = ["contender (us per pair: median [p10-p90])"] + [fmt_size(s) for s in sizes]
    rows = []
    for name, per in res.get("results", {}).items():
        if "error" in per:
            rows.append([name] + [f"error: {per['error'][:60]}"] + [""] * (len(sizes) - 1))
            continue
        rows.append([name] + [_cell(per.get(str(s))) for s in sizes])
    cpp = res.get("cpp", {})
    for way, label in (("floor", "C++ floor"), ("via_ref", "C++ via device_async_resource_ref")):
        for pool, per in (cpp.get(way) or {}).items():
            rows.append([f"{label}: {pool}"] + [_cell(per.get(str(s)), digits=3) for s in sizes])
    print_table(SECTION_TITLES[1], header, rows)
    for k in ("skipped", "error"):
        if k in cpp:
            print(f"  C++ floor {k}: {cpp[k]}")
    for pool, msg in (cpp.get("errors") or {}).items():
        print(f"  C++ floor error [{pool}]: {msg}")
    for n, per in res.get("results", {}).items():
        if "error" in per:
            print(f"  error [{n}]: {per['error']}")
    errs = [(n, s, e["error"]) for n, per in res.get("results", {}).items() if "error" not in per
            for s, e in per.items() if isinstance(e, dict) and "error" in e]
    for n, s, e in errs:
        print(f"  error [{n} @ {fmt_size(int(s))}]: {e}")
    _print_ratios(res.get("ratios", {}), sizes)


def _print_ratios(ratios: dict, sizes) -> None:
    rows = []
    for name, per in ratios.items():
        if not per:
            continue
        if all(isinstance(v, dict) for v in per.values()):
            for sub, vals in per.items():
                rows.append([f"{name} [{sub}]"] + [_fmt_ratio(vals.get(str(s))) for s in sizes])
        else:
            rows.append([name] + [_fmt_ratio(per.get(str(s))) for s in sizes])
    if rows:
        print_table("  ratios", ["ratio"] + [fmt_size(s) for s in sizes], rows)


def _fmt_ratio(v) -> str:
    return "-" if v is None else f"{v:.3f}"


# ---- section 2: synchronize between rounds, threshold 0 vs max ---------------------------


def _sync_rounds(mr, size: int, stream, cfg: Config) -> list:
    """ns of rounds of one alloc+free pair followed by a stream synchronize."""
    alloc, dealloc, sync = mr.allocate, mr.deallocate, stream.synchronize
    ns = time.perf_counter_ns
    for _ in range(3):  # warm-up
        dealloc(alloc(size, stream), size, stream)
        sync()
    samples = []
    start = time.perf_counter()
    enabled = gc.isenabled()
    gc.disable()
    try:
        while len(samples) < cfg.sync_rounds and (
                len(samples) < 5 or time.perf_counter() - start < cfg.sync_budget_s):
            t0 = ns()
            dealloc(alloc(size, stream), size, stream)
            sync()
            samples.append(ns() - t0)
    finally:
        if enabled:
            gc.enable()
    return samples


def section_sync_threshold(cfg: Config, ctx: Context) -> dict:
    am, mr = ctx.asyncmr, ctx.rmm.mr
    s = ctx.stream
    results: dict = {}
    ratios: dict = {}
    reserved_after: dict = {}

    # Baseline: what a synchronize of an idle stream costs alone.
    samples = []
    for _ in range(max(cfg.sync_rounds, 20)):
        t0 = time.perf_counter_ns()
        s.synchronize()
        samples.append(time.perf_counter_ns() - t0)
    results["stream.synchronize() alone"] = {"any": summarize(samples, "us", 1e-3)}

    # Ours: the default pools, the ones the threshold policy acts on. The attribute is
    # process-wide, so the original value is restored afterwards.
    for base, cls in ((AMR, am.AsyncManagedMR), (APR, am.AsyncPinnedMR), (ADR, am.AsyncDeviceMR)):
        try:
            res = cls()
        except Exception as e:  # noqa: BLE001
            results[base] = {"error": err_text(e)}
            continue
        attrs = res.attributes
        original = attrs.release_threshold
        try:
            for label, value in (("0", 0), ("max", UINT64_MAX)):
                name = f"{base} threshold={label}"
                attrs.release_threshold = value
                s.synchronize()
                res.trim(0)  # start each setting from an empty pool
                for size in cfg.sizes:
                    try:
                        results.setdefault(name, {})[str(size)] = summarize(
                            _sync_rounds(res, size, s, cfg), "us", 1e-3)
                        reserved_after.setdefault(name, {})[str(size)] = \
                            attrs.reserved_mem_current
                    except Exception as e:  # noqa: BLE001
                        results.setdefault(name, {})[str(size)] = {"error": err_text(e)}
        except Exception as e:  # noqa: BLE001
            results.setdefault(base, {})["error"] = err_text(e)
        finally:
            try:
                attrs.release_threshold = original
            except Exception as e:  # noqa: BLE001
                results.setdefault(base, {})["restore_error"] = err_text(e)
        ratios[base] = {str(sz): _ratio(
            _median(results.get(f"{base} threshold=0", {}).get(str(sz))),
            _median(results.get(f"{base} threshold=max", {}).get(str(sz)))) for sz in cfg.sizes}
        del res
        print(f"  [2] {base} done", flush=True)

    # RMM's device resource owns its pool and takes the threshold as an argument.
    for label, kwargs in (("0", {"release_threshold": 0}), ("max", {})):
        name = f"{RMM_ASYNC} threshold={label}"
        try:
            res = mr.CudaAsyncMemoryResource(**kwargs)
        except Exception as e:  # noqa: BLE001
            results[name] = {"error": err_text(e)}
            continue
        for size in cfg.sizes:
            try:
                results.setdefault(name, {})[str(size)] = summarize(
                    _sync_rounds(res, size, s, cfg), "us", 1e-3)
            except Exception as e:  # noqa: BLE001
                results.setdefault(name, {})[str(size)] = {"error": err_text(e)}
        del res
    ratios[RMM_ASYNC] = {str(sz): _ratio(
        _median(results.get(f"{RMM_ASYNC} threshold=0", {}).get(str(sz))),
        _median(results.get(f"{RMM_ASYNC} threshold=max", {}).get(str(sz)))) for sz in cfg.sizes}
    gc.collect()
    return {
        "sizes": cfg.sizes,
        "results": results,
        "ratios": {"threshold 0 / threshold max (round time)": ratios},
        "reserved_after_round_bytes": reserved_after,
        "notes": [
            "a round = allocate, deallocate, stream.synchronize(), timed together; "
            f"up to {cfg.sync_rounds} rounds or {cfg.sync_budget_s} s per contender and size",
            "ours run on the default pools with release_threshold set to 0, then to the "
            "maximum, then restored; at 0 every synchronize may hand the memory back, and the "
            "next allocation maps it again",
        ],
    }


def print_sync_threshold(res: dict) -> None:
    sizes = res.get("sizes", [])
    header = ["contender (us per round: median [p10-p90])"] + [fmt_size(s) for s in sizes]
    rows = []
    for name, per in res.get("results", {}).items():
        if "any" in per:
            rows.append([name] + [_cell(per["any"])] * len(sizes))
        elif "error" in per and len(per) == 1:
            rows.append([name, f"error: {per['error'][:60]}"] + [""] * (len(sizes) - 1))
        else:
            rows.append([name] + [_cell(per.get(str(s))) for s in sizes])
    print_table(SECTION_TITLES[2], header, rows)
    _print_ratios(res.get("ratios", {}), sizes)


# ---- section 3: threads ----------------------------------------------------------------------


def _thread_round(mr, size: int, nthreads: int, pairs: int, streams) -> float:
    """Aggregate pairs per second of nthreads threads, each on its own stream."""
    barrier = threading.Barrier(nthreads + 1)
    starts = [0] * nthreads
    ends = [0] * nthreads
    errors = []

    def worker(i):
        alloc, dealloc, s = mr.allocate, mr.deallocate, streams[i]
        ns = time.perf_counter_ns
        t0 = ns()
        try:
            barrier.wait(timeout=120)
            t0 = ns()
            for _ in range(pairs):
                dealloc(alloc(size, s), size, s)  # both release the GIL inside RMM
        except BaseException as e:  # noqa: BLE001
            errors.append(err_text(e))
        ends[i] = ns()
        starts[i] = t0

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(nthreads)]
    for t in threads:
        t.start()
    enabled = gc.isenabled()
    gc.disable()
    try:
        barrier.wait(timeout=120)
        for t in threads:
            t.join()
    finally:
        if enabled:
            gc.enable()
    for st in streams[:nthreads]:
        st.synchronize()
    if errors:
        raise RuntimeError(errors[0])
    wall = max(ends) - min(starts)
    return nthreads * pairs / (wall * 1e-9)


def section_threads(cfg: Config, ctx: Context) -> dict:
    am, mr = ctx.asyncmr, ctx.rmm.mr
    contenders = [
        (AMR, lambda: am.AsyncManagedMR()),
        (APR, lambda: am.AsyncPinnedMR()),
        (ADR, lambda: am.AsyncDeviceMR()),
        (RMM_POOL_MANAGED, lambda: _pool_adaptor(ctx, mr.ManagedMemoryResource)),
        (RMM_POOL_PINNED, lambda: _pool_adaptor(ctx, mr.PinnedHostMemoryResource)),
        (RMM_POOL_DEVICE, lambda: _pool_adaptor(ctx, mr.CudaMemoryResource)),
        (RMM_ASYNC, lambda: mr.CudaAsyncMemoryResource()),
    ]
    streams = [ctx.new_stream() for _ in range(max(cfg.thread_counts))]
    results: dict = {}
    for name, factory in contenders:
        try:
            res = factory()
        except Exception as e:  # noqa: BLE001
            results[name] = {"error": err_text(e)}
            continue
        for size in cfg.thread_sizes:
            per_size = results.setdefault(name, {}).setdefault(str(size), {})
            try:
                # Warm every stream, then size the rounds from the single-thread cost.
                for st in streams:
                    for _ in range(50):
                        res.deallocate(res.allocate(size, st), size, st)
                    st.synchronize()
                probe = 2000
                rate1 = _thread_round(res, size, 1, probe, streams)
                pairs = int(min(max(cfg.thread_round_ms * 1e-3 * rate1, 500), 200_000))
            except Exception as e:  # noqa: BLE001
                per_size["error"] = err_text(e)
                continue
            for n in cfg.thread_counts:
                try:
                    rates = [_thread_round(res, size, n, pairs, streams)
                             for _ in range(cfg.thread_repeats)]
                    entry = summarize(rates, "pairs_per_s")
                    entry["pairs_per_thread"] = pairs
                    per_size[str(n)] = entry
                except Exception as e:  # noqa: BLE001
                    per_size[str(n)] = {"error": err_text(e)}
        del res
        gc.collect()
        print(f"  [3] {name} done", flush=True)

    def agg(name, size, n):
        return _median(results.get(name, {}).get(str(size), {}).get(str(n)), "pairs_per_s")

    ratios = {}
    for ours, theirs in ((AMR, RMM_POOL_MANAGED), (APR, RMM_POOL_PINNED), (ADR, RMM_POOL_DEVICE),
                         (ADR, RMM_ASYNC)):
        ratios[f"{ours} / {theirs}"] = {
            str(size): {str(n): _ratio(agg(ours, size, n), agg(theirs, size, n))
                        for n in cfg.thread_counts}
            for size in cfg.thread_sizes}
    return {
        "sizes": cfg.thread_sizes,
        "thread_counts": list(cfg.thread_counts),
        "results": results,
        "ratios": ratios,
        "notes": [
            "each thread runs a tight Python loop of allocate/deallocate on its own non-blocking "
            "stream; RMM's Python allocate/deallocate release the GIL around the C++ call, the "
            "loop itself holds it",
            "aggregate = threads x pairs / (last end - first start); median over rounds",
        ],
    }


def print_threads(res: dict) -> None:
    counts = res.get("thread_counts", [])
    for size in res.get("sizes", []):
        rows = []
        for name, per in res.get("results", {}).items():
            if "error" in per:
                rows.append([name, f"error: {per['error'][:60]}"] + [""] * (len(counts) - 1))
                continue
            ps = per.get(str(size), {})
            if "error" in ps:
                rows.append([name, f"error: {ps['error'][:60]}"] + [""] * (len(counts) - 1))
                continue
            rows.append([name] + [_fmt_rate(ps.get(str(n))) for n in counts])
        print_table(f"{SECTION_TITLES[3]} -- {fmt_size(size)} (M pairs/s: median [p10-p90])",
                    ["contender"] + [f"{n} thr" for n in counts], rows)
        rrows = []
        for rname, per in res.get("ratios", {}).items():
            vals = per.get(str(size), {})
            rrows.append([rname] + [_fmt_ratio(vals.get(str(n))) for n in counts])
        print_table("  ratios", ["ratio"] + [f"{n} thr" for n in counts], rrows)


def _fmt_rate(entry) -> str:
    if not isinstance(entry, dict):
        return "-"
    if "error" in entry:
        return "error"
    return (f"{entry['median_pairs_per_s'] / 1e6:.3f} [{entry['p10_pairs_per_s'] / 1e6:.3f}-"
            f"{entry['p90_pairs_per_s'] / 1e6:.3f}]")


# ---- section 4: fragmentation and trim -----------------------------------------------------


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


def section_fragmentation(cfg: Config, ctx: Context) -> dict:
    am, mr = ctx.asyncmr, ctx.rmm.mr
    s = ctx.stream
    events, requested_peak = make_trace(cfg.seed, cfg.frag_ops, cfg.frag_cap)
    kinds = (
        ("managed", lambda: am.AsyncManagedMR(pool="new"), mr.ManagedMemoryResource),
        ("pinned", lambda: am.AsyncPinnedMR(pool="new"), mr.PinnedHostMemoryResource),
        ("device", lambda: am.AsyncDeviceMR(pool="new"), mr.CudaMemoryResource),
    )
    results: dict = {}
    for kind, ours_factory, upstream_factory in kinds:
        entry = results.setdefault(kind, {})
        # Ours: an owned pool, so nothing else in the process shows up in its watermarks.
        try:
            res = ours_factory()
            with res.track_peak() as peak:
                elapsed = _replay(res, events, s)
            before = res.attributes.reserved_mem_current
            res.trim(0)
            after = res.attributes.reserved_mem_current
            entry["ours"] = {
                "resource": f"{type(res).__name__}(pool='new')",
                "used_high": peak.used,
                "reserved_high": peak.reserved,
                "reserved_over_used": _ratio(peak.reserved, peak.used),
                "reserved_over_requested": _ratio(peak.reserved, requested_peak),
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
                "reserved_over_used": _ratio(up_stats.peak_bytes, top_stats.peak_bytes),
                "reserved_over_requested": _ratio(up_stats.peak_bytes, requested_peak),
                "reserved_after_free": up_stats.current_bytes,
                "trim": "none: PoolMemoryResource keeps its upstream blocks until destroyed",
                "replay_s": elapsed * 1e-9,
            }
            del top, pool, up
        except Exception as e:  # noqa: BLE001
            entry["adaptor"] = {"error": err_text(e)}
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
            "ours: owned pools (pool='new'), watermarks from track_peak(), trim(0) after a "
            "synchronize; adaptor: StatisticsResourceAdaptor around its upstream (reserved) "
            "and on top (used)",
        ],
    }


def print_fragmentation(res: dict) -> None:
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
                _fmt_ratio(e.get("reserved_over_requested")),
                _fmt_ratio(e.get("reserved_over_used")),
                "-" if after is None else f"{after / MiB:.1f}",
                f"{e.get('replay_s', float('nan')):.3f}",
            ])
    w = res.get("workload", {})
    print_table(
        f"{SECTION_TITLES[4]} (requested peak {w.get('requested_peak_bytes', 0) / MiB:.1f} MiB, "
        f"{w.get('allocations')} allocations, seed {w.get('seed')})",
        ["resource", "used_high MiB", "reserved_high MiB", "reserved/requested",
         "reserved/used", "reserved after trim/free MiB", "replay s"], rows)


# ---- section 5: pinned staging ---------------------------------------------------------------


def section_pinned_staging(cfg: Config, ctx: Context) -> dict:
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
        dst = int(_cuda_check(cudart.cudaMalloc(max(total, cfg.big_copy)), "cudaMalloc"))
        owned.append((cudart.cudaFree, dst))

        def copy(dst_ptr, src_ptr, n, kind=H2D):
            _cuda_check(cudart.cudaMemcpyAsync(dst_ptr, src_ptr, n, kind, sh), "cudaMemcpyAsync")

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
            pool_mr = _pool_adaptor(ctx, mr.PinnedHostMemoryResource, initial=64 * MiB)

            def stage_pool(k, _mr=pool_mr):
                for i in range(k):
                    p = _mr.allocate(chunk, s)
                    copy(dst + i * chunk, p, chunk)
                    _mr.deallocate(p, chunk, s)

            variants[RMM_POOL_PINNED] = stage_pool
        except Exception as e:  # noqa: BLE001
            out["staging"][RMM_POOL_PINNED] = {"error": err_text(e)}
        ideal = "cudaHostAlloc buffer, preallocated (ideal)"
        try:
            hbuf = int(_cuda_check(cudart.cudaHostAlloc(chunk, cudart.cudaHostAllocDefault),
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
                _cuda_check(cudart.cudaStreamSynchronize(sh), "cudaStreamSynchronize")
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
                    _cuda_check(cudart.cudaStreamSynchronize(sh), "cudaStreamSynchronize")
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
            sources["AsyncPinnedMR (pinned pool memory)"] = p
        except Exception as e:  # noqa: BLE001
            out["large_copy"]["AsyncPinnedMR (pinned pool memory)"] = {"error": err_text(e)}
        try:
            hp = int(_cuda_check(cudart.cudaHostAlloc(big, cudart.cudaHostAllocDefault),
                                 "cudaHostAlloc"))
            owned.append((cudart.cudaFreeHost, hp))
            sources["cudaHostAlloc memory"] = hp
        except Exception as e:  # noqa: BLE001
            out["large_copy"]["cudaHostAlloc memory"] = {"error": err_text(e)}
        ev0 = _cuda_check(cudart.cudaEventCreate(), "cudaEventCreate")
        ev1 = _cuda_check(cudart.cudaEventCreate(), "cudaEventCreate")
        try:
            for direction, kind in (("H2D", H2D), ("D2H", D2H)):
                times = {name: [] for name in sources}
                for src in sources.values():  # warm-up
                    a, b = (dst, src) if direction == "H2D" else (src, dst)
                    copy(a, b, big, kind)
                _cuda_check(cudart.cudaStreamSynchronize(sh), "cudaStreamSynchronize")
                for r in range(cfg.copy_repeats):
                    names = list(sources)
                    k = r % max(len(names), 1)
                    for name in names[k:] + names[:k]:
                        src = sources[name]
                        a, b = (dst, src) if direction == "H2D" else (src, dst)
                        _cuda_check(cudart.cudaEventRecord(ev0, sh), "cudaEventRecord")
                        copy(a, b, big, kind)
                        _cuda_check(cudart.cudaEventRecord(ev1, sh), "cudaEventRecord")
                        _cuda_check(cudart.cudaEventSynchronize(ev1), "cudaEventSynchronize")
                        ms = _cuda_check(cudart.cudaEventElapsedTime(ev0, ev1),
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
        "staging time AsyncPinnedMR / ideal": _ratio(
            _median(st.get(APR), "s"), _median(st.get(ideal), "s")),
        "staging time PinnedHostMemoryResource / AsyncPinnedMR": _ratio(
            _median(st.get(RMM_PINNED), "s"), _median(st.get(APR), "s")),
        "staging time PoolMemoryResource(PinnedHost) / AsyncPinnedMR": _ratio(
            _median(st.get(RMM_POOL_PINNED), "s"), _median(st.get(APR), "s")),
        "H2D bandwidth pinned pool / cudaHostAlloc": _ratio(
            _median(lc.get("AsyncPinnedMR (pinned pool memory)", {}).get("H2D"), "GBps"),
            _median(lc.get("cudaHostAlloc memory", {}).get("H2D"), "GBps")),
        "D2H bandwidth pinned pool / cudaHostAlloc": _ratio(
            _median(lc.get("AsyncPinnedMR (pinned pool memory)", {}).get("D2H"), "GBps"),
            _median(lc.get("cudaHostAlloc memory", {}).get("D2H"), "GBps")),
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


def _seconds_row(name: str, e: dict, last: str) -> list:
    """A table row for a timing in seconds: name, median ms, [p10-p90] ms, one more column."""
    if "error" in e:
        return [name, f"error: {e['error'][:60]}", "", ""]
    return [name, f"{e['median_s'] * 1e3:.1f}",
            f"[{e['p10_s'] * 1e3:.1f}-{e['p90_s'] * 1e3:.1f}]", last]


def print_pinned_staging(res: dict) -> None:
    p = res.get("staging_params", {})
    rows = []
    for name, e in res.get("staging", {}).items():
        rows.append(_seconds_row(name, e, f"{e.get('GBps', 0):.2f}"))
    print_table(f"{SECTION_TITLES[5]} -- {fmt_size(p.get('total_bytes', 0))} in "
                f"{fmt_size(p.get('chunk_bytes', 0))} chunks",
                ["chunk source", "total ms (median)", "[p10-p90]", "GB/s"], rows)
    q = res.get("large_copy_params", {})
    rows = []
    for name, e in res.get("large_copy", {}).items():
        if "error" in e:
            rows.append([name, f"error: {e['error'][:60]}", ""])
        else:
            rows.append([name, _cell(e.get("H2D"), "GBps"), _cell(e.get("D2H"), "GBps")])
    print_table(f"  one {fmt_size(q.get('bytes', 0))} copy (GB/s: median [p10-p90])",
                ["host memory", "H2D", "D2H"], rows)
    rows = [[k, _fmt_ratio(v)] for k, v in res.get("ratios", {}).items()]
    print_table("  ratios", ["ratio", "value"], rows)


# ---- section 6: managed CuPy pipeline ------------------------------------------------------


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


def section_managed_cupy(cfg: Config, ctx: Context) -> dict:
    cp, cstream = ctx.cupy()
    from rmm.allocators.cupy import rmm_cupy_allocator

    am, mr = ctx.asyncmr, ctx.rmm.mr
    contenders = [
        (AMR, lambda: am.AsyncManagedMR()),
        (RMM_MANAGED, lambda: mr.ManagedMemoryResource()),
        (RMM_POOL_MANAGED, lambda: _pool_adaptor(ctx, mr.ManagedMemoryResource)),
        (RMM_ASYNC_MANAGED, lambda: _rmm_async_managed_class(ctx)()),
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
            f"{n} / {AMR} (wall time)": _ratio(_median(results.get(n), "s"),
                                                 _median(results.get(AMR), "s"))
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


def print_managed_cupy(res: dict) -> None:
    p = res.get("pipeline", {})
    rows = []
    for name, e in res.get("results", {}).items():
        rows.append(_seconds_row(name, e, f"{e.get('ms_per_iteration', 0):.3f}"))
    print_table(f"{SECTION_TITLES[6]} -- {p.get('iterations')} iterations of "
                f"{p.get('elements')} float32",
                ["allocator", "wall ms (median)", "[p10-p90]", "ms/iteration"], rows)
    rows = [[k, _fmt_ratio(v)] for k, v in res.get("ratios", {}).items()]
    print_table("  ratios", ["ratio", "value"], rows)
    bad = [n for n, ok in p.get("results_agree_with_AsyncManagedMR", {}).items() if not ok]
    if bad:
        print(f"  WARNING: pipeline results differ from AsyncManagedMR's for: {', '.join(bad)}")


# ---- targets -------------------------------------------------------------------------------


def _worst(per_size: dict, op: str):
    vals = {k: v for k, v in (per_size or {}).items() if v is not None}
    if not vals:
        return None, vals
    return (max(vals.values()) if op == "<=" else min(vals.values())), vals


def compute_targets(doc: dict) -> list:
    """The issue's targets, each a ratio within this run. Size-dependent ones take the worst
    size (the largest ratio for '<=', the smallest for '>=' and '>'); 'detail' has them all."""
    secs = doc.get("sections", {})
    targets = []

    def add(name, value, op, threshold, detail=None, note=None, tolerance=0.0):
        if value is None:
            met = False
        elif op == "<=":
            met = value <= threshold * (1.0 + tolerance)
        elif op == ">=":
            met = value >= threshold
        elif op == ">":
            met = value > threshold
        elif op == "==":
            met = value == threshold
        else:
            raise ValueError(op)
        t = {"name": name, "value": value, "target": f"{op} {threshold:g}", "op": op,
             "threshold": threshold, "met": bool(met)}
        if tolerance:
            t["tolerance"] = tolerance
        if detail is not None:
            t["detail"] = detail
        if value is None:
            t["note"] = note or "not measured in this run"
        elif note:
            t["note"] = note
        targets.append(t)

    s1 = secs.get(SECTION_KEYS[1], {})
    r1 = s1.get("ratios", {})
    for name, key, op, thr, tol in (
        ("AsyncPinnedMR alloc+free from Python <= 1.3x the raw pinned floor",
         "AsyncPinnedMR / floor(pinned_default_host)", "<=", 1.3, 0.0),
        ("AsyncPinnedMR >= 2x faster than PoolMemoryResource(PinnedHostMemoryResource)",
         "PoolMemoryResource(PinnedHost) / AsyncPinnedMR", ">=", 2.0, 0.0),
        ("AsyncPinnedMR faster than cuda.core PinnedMemoryResource",
         "cuda.core Pinned / AsyncPinnedMR", ">", 1.0, 0.0),
        ("AsyncManagedMR no slower than rmm experimental.CudaAsyncManagedMemoryResource "
         "(2% noise band)", "AsyncManagedMR / rmm experimental managed", "<=", 1.0, 0.02),
        ("AsyncManagedMR >= 2x faster than PoolMemoryResource(ManagedMemoryResource)",
         "PoolMemoryResource(Managed) / AsyncManagedMR", ">=", 2.0, 0.0),
    ):
        value, detail = _worst(r1.get(key), op)
        note = None
        if value is None:
            if not s1:
                note = "section 1 not run"
            else:
                note = "a contender failed or was not available (see section 1 results)"
        add(name, value, op, thr, detail, note=note, tolerance=tol)

    via = r1.get("via_ref / floor", {})
    flat = {f"{pool}@{size}": v for pool, per in via.items() for size, v in per.items()}
    value, detail = _worst(flat, "<=")
    add("C++ through rmm::device_async_resource_ref <= 1.05x the raw floor", value, "<=", 1.05,
        detail, note=None if value is not None else "C++ floor not run or failed")

    s5 = secs.get(SECTION_KEYS[5], {})
    r5 = s5.get("ratios", {})
    add("Pinned-pool H2D bandwidth >= 0.98x cudaHostAlloc memory's",
        r5.get("H2D bandwidth pinned pool / cudaHostAlloc"), ">=", 0.98)
    add("Pinned staging (AsyncPinnedMR) within 5% of the preallocated ideal (time ratio)",
        r5.get("staging time AsyncPinnedMR / ideal"), "<=", 1.05)
    add("Pinned staging >= 50x faster than PinnedHostMemoryResource",
        r5.get("staging time PinnedHostMemoryResource / AsyncPinnedMR"), ">=", 50.0)

    s3 = secs.get(SECTION_KEYS[3], {})
    counts = s3.get("thread_counts") or []
    sizes3 = s3.get("sizes") or []
    n8 = "8" if 8 in counts else (str(max(counts)) if counts else "8")
    for ours, theirs in ((AMR, RMM_POOL_MANAGED), (APR, RMM_POOL_PINNED)):
        per = s3.get("ratios", {}).get(f"{ours} / {theirs}", {})
        detail = {sz: per.get(str(sz), {}).get(n8) for sz in sizes3}
        value, detail = _worst({str(k): v for k, v in detail.items()}, ">=")
        add(f"{n8} threads: {ours} aggregate >= 2x {theirs}", value, ">=", 2.0, detail)

    s4 = secs.get(SECTION_KEYS[4], {})
    for kind, entry in s4.get("results", {}).items():
        ours, theirs = entry.get("ours", {}), entry.get("adaptor", {})
        add(f"Random workload [{kind}]: reserved_high/used_high no worse than the adaptor's "
            "(ours / adaptor, requested peak as used)",
            _ratio(ours.get("reserved_over_requested"), theirs.get("reserved_over_requested")),
            "<=", 1.0,
            {"ours": ours.get("reserved_over_requested"),
             "adaptor": theirs.get("reserved_over_requested"),
             "ours_own_used": ours.get("reserved_over_used"),
             "adaptor_own_used": theirs.get("reserved_over_used")})
        add(f"Random workload [{kind}]: trim(0) returns everything once nothing is live "
            "(reserved bytes after)", ours.get("reserved_after_trim"), "==", 0)
    if not s4.get("results"):
        add("Random workload: reserved_high/used_high no worse than the adaptor's", None,
            "<=", 1.0)
        add("Random workload: trim(0) returns everything once nothing is live", None, "==", 0)
    return targets


def print_targets(targets: list) -> None:
    rows = []
    for t in targets:
        v = t["value"]
        status = "PASS" if t["met"] else ("N/A " if v is None else "FAIL")
        shown = "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
        rows.append([f"{status}  {t['name']}", shown, t["target"]])
    print_table("Targets (ratios within this run)", ["target", "value", "wanted"], rows)
    met = sum(t["met"] for t in targets)
    print(f"targets met: {met} of {len(targets)}")


# ---- plots ---------------------------------------------------------------------------------


def write_plots(doc: dict, out: Path) -> dict:
    """One PNG per section that ran; returns {section: file or error}."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        return {"error": f"matplotlib unavailable: {err_text(e)}"}
    made = {}
    secs = doc.get("sections", {})
    for num, fn in ((1, _plot_pair_cost), (2, _plot_sync), (3, _plot_threads),
                    (4, _plot_frag), (5, _plot_staging), (6, _plot_cupy)):
        key = SECTION_KEYS[num]
        res = secs.get(key)
        if not res or _failed(res):
            continue
        path = out / f"{key}.png"
        try:
            fig = fn(plt, res, doc.get("meta", {}))
            if fig is None:
                continue
            fig.savefig(path, dpi=110, bbox_inches="tight")
            plt.close(fig)
            made[key] = path.name  # relative: results.json and the PNGs travel together
        except Exception as e:  # noqa: BLE001
            made[key] = f"error: {err_text(e)}"
            plt.close("all")
    return made


def _subtitle(meta: dict) -> str:
    return f"{meta.get('gpu', '?')}, driver {meta.get('driver', meta.get('cuda_driver_api'))}, " \
           f"{meta.get('date', '')}"


def _plot_pair_cost(plt, res, meta):
    sizes = res.get("sizes", [])
    rows = {}
    for name, per in res.get("results", {}).items():
        if "error" not in per:
            rows[name] = {s: _median(per.get(str(s))) for s in sizes}
    for pool, per in (res.get("cpp", {}).get("floor") or {}).items():
        rows[f"C++ floor: {pool}"] = {s: _median(per.get(str(s))) for s in sizes}
    if not rows:
        return None
    names = list(rows)
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 0.32 * len(names) + 1.8),
                             sharey=True, squeeze=False)
    for ax, s in zip(axes[0], sizes, strict=True):
        vals = [rows[n][s] or 0.0 for n in names]
        colors = ["tab:green" if n.startswith("Async") else
                  "tab:gray" if n.startswith(("C++", "raw floor")) else "tab:blue"
                  for n in names]
        ax.barh(range(len(names)), vals, color=colors)
        ax.set_xscale("log")
        for i, v in enumerate(vals):
            if v:
                ax.text(v, i, f" {v:.3g}", va="center", fontsize=6)
        ax.set_title(fmt_size(s))
        ax.set_xlabel("us per alloc+free pair (median)")
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(names)))
    axes[0][0].set_yticklabels(names, fontsize=8)
    axes[0][0].invert_yaxis()
    fig.suptitle(f"Alloc+free pair cost, one stream -- {_subtitle(meta)}")
    return fig


def _plot_sync(plt, res, meta):
    sizes = res.get("sizes", [])
    pairs = [k for k in res.get("ratios", {}).get("threshold 0 / threshold max (round time)", {})]
    if not pairs:
        return None
    fig, axes = plt.subplots(1, len(sizes), figsize=(4 * len(sizes), 3.6), squeeze=False)
    for ax, s in zip(axes[0], sizes, strict=True):
        zero = [_median(res["results"].get(f"{b} threshold=0", {}).get(str(s))) or 0 for b in pairs]
        mx = [_median(res["results"].get(f"{b} threshold=max", {}).get(str(s))) or 0 for b in pairs]
        x = range(len(pairs))
        ax.bar([i - 0.2 for i in x], zero, width=0.4, label="threshold 0", color="tab:red")
        ax.bar([i + 0.2 for i in x], mx, width=0.4, label="threshold max", color="tab:green")
        ax.set_xticks(list(x))
        ax.set_xticklabels([p.replace("rmm ", "rmm\n") for p in pairs], fontsize=7, rotation=20)
        ax.set_yscale("log")
        ax.set_title(fmt_size(s))
    axes[0][0].set_ylabel("us per alloc+free+sync round (median)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Release threshold across synchronizations -- {_subtitle(meta)}")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return fig


def _plot_threads(plt, res, meta):
    sizes = res.get("sizes", [])
    counts = res.get("thread_counts", [])
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4), squeeze=False)
    for ax, s in zip(axes[0], sizes, strict=True):
        for name, per in res.get("results", {}).items():
            ps = per.get(str(s), {}) if "error" not in per else {}
            ys = [_median(ps.get(str(n)), "pairs_per_s") for n in counts]
            if any(y is not None for y in ys):
                ax.plot(counts, [(y or 0) / 1e6 for y in ys], marker="o", label=name,
                        linestyle="-" if name.startswith("Async") else "--")
        ax.set_xticks(counts)
        ax.set_xlabel("threads (one stream each)")
        ax.set_ylabel("aggregate M pairs/s (median)")
        ax.set_title(fmt_size(s))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Threads -- {_subtitle(meta)}")
    return fig


def _plot_frag(plt, res, meta):
    kinds = list(res.get("results", {}))
    if not kinds:
        return None
    ours = [res["results"][k].get("ours", {}).get("reserved_over_requested") or 0 for k in kinds]
    theirs = [res["results"][k].get("adaptor", {}).get("reserved_over_requested") or 0
              for k in kinds]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    x = range(len(kinds))
    ax.bar([i - 0.2 for i in x], ours, width=0.4, label="asyncmr (owned pool)", color="tab:green")
    ax.bar([i + 0.2 for i in x], theirs, width=0.4, label="rmm PoolMemoryResource",
           color="tab:blue")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(kinds)
    ax.set_ylabel("reserved high / requested peak")
    ax.legend(fontsize=8)
    fig.suptitle(f"Fragmentation, seeded workload -- {_subtitle(meta)}", fontsize=9)
    return fig


def _plot_staging(plt, res, meta):
    st = {n: e for n, e in res.get("staging", {}).items() if "error" not in e}
    lc = {n: e for n, e in res.get("large_copy", {}).items() if "error" not in e}
    if not st and not lc:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3.8))
    names = list(st)
    a1.barh(range(len(names)), [st[n]["GBps"] for n in names], color="tab:green")
    for i, n in enumerate(names):
        a1.text(st[n]["GBps"], i, f" {st[n]['GBps']:.3g}", va="center", fontsize=7)
    a1.set_yticks(range(len(names)))
    a1.set_yticklabels(names, fontsize=8)
    a1.invert_yaxis()
    a1.set_xscale("log")
    a1.set_xlabel("staging GB/s (median)")
    a1.set_title("H2D staging in chunks")
    names = list(lc)
    for j, d in enumerate(("H2D", "D2H")):
        a2.bar([i + 0.4 * j - 0.2 for i in range(len(names))],
               [_median(lc[n].get(d), "GBps") or 0 for n in names], width=0.4, label=d)
    a2.set_xticks(range(len(names)))
    a2.set_xticklabels(names, fontsize=8)
    a2.set_ylabel("GB/s (median)")
    a2.set_title("one large copy")
    a2.legend(fontsize=8)
    fig.suptitle(f"Pinned memory -- {_subtitle(meta)}")
    return fig


def _plot_cupy(plt, res, meta):
    ok = {n: e for n, e in res.get("results", {}).items() if "error" not in e}
    if not ok:
        return None
    names = list(ok)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.5))
    ax.barh(range(len(names)), [ok[n]["median_s"] for n in names],
            xerr=[[ok[n]["median_s"] - ok[n]["p10_s"] for n in names],
                  [ok[n]["p90_s"] - ok[n]["median_s"] for n in names]],
            color=["tab:green" if n.startswith("Async") else "tab:blue" for n in names])
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("wall time, s (median, p10-p90)")
    fig.suptitle(f"Managed CuPy pipeline -- {_subtitle(meta)}", fontsize=9)
    return fig


# ---- driver ----------------------------------------------------------------------------------

SECTION_FUNCS = {
    1: (section_pair_cost, print_pair_cost),
    2: (section_sync_threshold, print_sync_threshold),
    3: (section_threads, print_threads),
    4: (section_fragmentation, print_fragmentation),
    5: (section_pinned_staging, print_pinned_staging),
    6: (section_managed_cupy, print_managed_cupy),
}


def _failed(section_result: dict) -> bool:
    """True for a section that raised (only error, traceback and elapsed_s are in it)."""
    return "traceback" in section_result


def _write_json(doc: dict, out: Path) -> Path:
    path = out / "results.json"
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, default=str, allow_nan=True) + "\n")
    tmp.replace(path)
    return path


def main(argv=None) -> int:
    """Entry point of ``python -m asyncmr bench``; returns the process exit status.

    0 when the run finished (whatever the targets say), 1 when there is no usable CUDA
    device or asyncmr cannot be imported (nothing is measured or written), 2 on bad options.
    """
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    cfg = _make_config(parser, args)
    try:
        import asyncmr
    except Exception as e:  # noqa: BLE001
        print(f"asyncmr bench: cannot import asyncmr: {err_text(e)}", file=sys.stderr)
        return 1
    try:
        asyncmr.device_count()
    except asyncmr.NoDeviceError as e:
        print(f"asyncmr bench: no usable CUDA GPU, nothing measured.\n  {e}", file=sys.stderr)
        return 1

    started = time.perf_counter()
    ctx = Context()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"meta": collect_meta(ctx), "params": asdict(cfg), "sections": {}, "targets": []}
    m = doc["meta"]
    print(f"asyncmr bench{' --quick' if cfg.quick else ''}: {m.get('gpu', '?')}, driver "
          f"{m.get('driver', m.get('cuda_driver_api'))}, rmm {m['versions'].get('rmm')}, "
          f"cupy {m['versions'].get('cupy')}, cuda-core {m['versions'].get('cuda-core')}; "
          f"sections {','.join(map(str, cfg.sections))}; writing to {out}", flush=True)

    for num in cfg.sections:
        key = SECTION_KEYS[num]
        run, show = SECTION_FUNCS[num]
        print(f"\n== section {num}: {SECTION_TITLES[num]}", flush=True)
        t0 = time.perf_counter()
        try:
            res = run(cfg, ctx)
        except Exception as e:  # noqa: BLE001 - one section's failure does not end the run
            res = {"error": err_text(e), "traceback": traceback.format_exc()}
            print(f"  section {num} failed: {err_text(e)}", flush=True)
        res["elapsed_s"] = time.perf_counter() - t0
        doc["sections"][key] = res
        if not _failed(res):
            try:
                show(res)
            except Exception as e:  # noqa: BLE001
                print(f"  (could not print section {num}: {err_text(e)})")
        print(f"  section {num}: {res['elapsed_s']:.1f} s", flush=True)
        _write_json(doc, out)  # after every section: a later failure keeps what was measured
        gc.collect()

    doc["targets"] = compute_targets(doc)
    print_targets(doc["targets"])
    doc["elapsed_s"] = time.perf_counter() - started
    doc["plots"] = write_plots(doc, out)
    path = _write_json(doc, out)
    print(f"\nwrote {path}" + "".join(f"\nwrote {out / p}" for p in doc["plots"].values()
                                      if isinstance(p, str) and not p.startswith("error")))
    for k, p in doc["plots"].items():
        if isinstance(p, str) and p.startswith("error") or k == "error":
            print(f"plot {k}: {p}")
    print(f"total {doc['elapsed_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
