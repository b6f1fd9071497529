# SPDX-License-Identifier: Apache-2.0
"""The run's settings and shared objects, the timing loops every section uses, the metadata,
the JSON, and the loop that runs the sections.

Every contender is built and measured inside its own ``try``: a library that is missing or
refuses something records the error string in the JSON instead of ending the run. Timing:
warm-up first, then repeated rounds; the median and the 10th/90th percentiles of the rounds
are reported. Contenders of one size run interleaved, round by round, so drift on a shared
machine hits all of them alike.
"""

from __future__ import annotations

import gc
import json
import platform
import subprocess
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .common import KiB, MiB, err_text, summarize

# RMM's PoolMemoryResource takes half the free *device* memory when no initial size is given,
# even over a pinned-host upstream; every adaptor here gets an explicit size instead.
POOL_ADAPTOR_INITIAL = 256 * MiB


class Skip(Exception):
    """Raised by a section that cannot run here (a library or an API is missing); the message
    says why. A skip is not a failure: the run's exit status stays 0."""


# ---- configuration -------------------------------------------------------------------------


@dataclass
class Config:
    """Every setting of a run; stored as ``params`` in results.json."""

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
    floor_lib: str | None = None
    gil_grow_bytes: int = 2 << 30  # section 7: one allocation that grows a new pinned pool
    gil_repeats: int = 3  # section 7: growths per contender
    gil_tick_s: float = 0.0005  # section 7: the ticker thread's sleep
    gil_threads: int = 8  # section 7: threads of the aggregate
    gil_thread_repeats: int = 5  # section 7: rounds of the aggregate per contender
    gil_pair_rounds: int = 21  # section 7: interleaved rounds of auto vs never
    stage_chunk: int = 4 * MiB  # section 8
    stage_chunks: int = 256  # section 8: chunks per direction
    stage_depth: int = 4  # section 8: copies in flight before the oldest buffer is dropped
    stage_repeats: int = 5  # section 8
    array_bytes: int = 256 * MiB  # section 9
    array_repeats: int = 10  # section 9
    parquet_bytes: int = 100_000_000  # section 10: bytes of the table's columns
    parquet_repeats: int = 3  # section 10
    cache_bin: str | None = None  # section 11: the C++ cache_bench program
    cache_rounds: int = 21  # section 11: interleaved rounds of the Python pairs
    placement_bytes: int = 256 * MiB  # section 12: the managed buffer of scenarios a, b, d
    placement_repeats: int = 5  # section 12: interleaved rounds per scenario
    placement_ranges: int = 1000  # section 12: 64 KiB ranges of scenario c
    stack_rows: int = 4_000_000  # section 13: rows of the cudf.pandas workload
    stack_iters: int = 4  # section 13: workload runs per process (the first, then warm ones)
    stack_repeats: int = 3  # section 13: rounds of fresh processes per way
    ml_rows: int = 200_000  # section 13: rows of the cuML dataset (20 float32 columns)
    ml_iters: int = 3  # section 13: runs of each fit per process


def thread_sizes(quick: bool) -> list:
    return [4 * KiB] if quick else [4 * KiB, 1 * MiB]


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
        self._torch_stream = None

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

    def torch_stream(self):
        """A PyTorch stream of device 0; raises ImportError when PyTorch is missing."""
        if self._torch_stream is None:
            import torch

            self._torch_stream = torch.cuda.Stream(device=0)
        return self._torch_stream

    def cupy(self):
        """(cupy module, a non-blocking CuPy stream); raises ImportError when CuPy is missing."""
        if self._cp is None:
            import cupy

            self._cp = (cupy, cupy.cuda.Stream(non_blocking=True))
        return self._cp


def cc_class(ctx: Context, name: str):
    mod = ctx.cuda_core()[0]
    cls = getattr(mod, name, None)
    if cls is None:
        raise RuntimeError(f"cuda.core {getattr(mod, '__version__', '?')} has no {name}")
    return cls


def rmm_async_managed_class(ctx: Context):
    exp = getattr(ctx.rmm.mr, "experimental", None)
    cls = getattr(exp, "CudaAsyncManagedMemoryResource", None) if exp is not None else None
    if cls is None:
        raise RuntimeError("rmm.mr.experimental.CudaAsyncManagedMemoryResource is not available "
                           f"in rmm {getattr(ctx.rmm, '__version__', '?')}")
    return cls


def pool_adaptor(ctx: Context, upstream_factory, initial=POOL_ADAPTOR_INITIAL):
    return ctx.rmm.mr.PoolMemoryResource(upstream_factory(), initial_pool_size=initial)


# asyncmr's pool calls, in one place for the sections.
def trim_to(obj, min_bytes_to_keep: int = 0) -> None:
    """``obj.trim_to(n)`` on a resource or MemPool."""
    obj.trim_to(min_bytes_to_keep)


def reset_peaks(obj) -> None:
    """``obj.reset_peaks()`` on a resource or MemPool."""
    obj.reset_peaks()


def set_release_gil(mr, mode: str):
    """``mr.release_gil = mode``; a clear error on a build without the property."""
    if not hasattr(type(mr), "release_gil"):
        raise RuntimeError(f"this asyncmr build has no {type(mr).__name__}.release_gil "
                           ": nothing to compare")
    mr.release_gil = mode
    return mr


# ---- timing loops --------------------------------------------------------------------------


def timed(run, n):
    """run(n) with the garbage collector held off, so no collection lands in a round."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return run(n)
    finally:
        if enabled:
            gc.enable()


def calibrate(run, sync, warmup_ms: float, round_ms: float) -> int:
    """Warm up, then the pair count that makes one round ~round_ms.

    The first pair is cold (it may grow a pool: milliseconds) and never sets the count: a cold
    first pair longer than the whole warm-up would make the count a handful, and those cells
    would read 2-5x their warm cost. The estimate is the last of the warm
    batches, which grow 4x at a time until the warm-up (warmup_ms, first pair excluded) is
    spent and one batch lasts at least a tenth of a round."""
    timed(run, 1)  # cold
    sync()
    spent, n = 0, 1
    while True:
        t = timed(run, n)
        sync()
        spent += t
        per = t / n
        if (spent >= warmup_ms * 1e6 and t >= round_ms * 1e5) or n >= (1 << 18):
            break
        n *= 4
    return int(min(max(round_ms * 1e6 / max(per, 1.0), 3), 200_000))


def pair_runner(ctx: Context, family: str, obj, size: int):
    """(run(n) -> elapsed ns of n alloc+free pairs, sync()) for one contender and size.

    The loops are the tightest Python each library allows: bound methods looked up once,
    the pointer passed straight from allocate to deallocate. Family "floor": obj is
    (FloorLibrary, pool handle), timed inside C++.
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
    if family == "rmm_default":
        from rmm.pylibrmm.stream import DEFAULT_STREAM

        alloc, dealloc = obj.allocate, obj.deallocate

        def run(n):
            t0 = ns()
            for _ in range(n):
                dealloc(alloc(size), size)
            return ns() - t0

        return run, DEFAULT_STREAM.synchronize
    if family == "floor":
        lib, pool_handle = obj
        s = ctx.stream
        stream_handle = ctx.handle(s)

        def run(n):
            return lib.pairs(pool_handle, stream_handle, size, n)

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
    if family == "torch":
        torch = obj  # the module: its caching allocator, on a stream of its own
        s = ctx.torch_stream()
        alloc, delete = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
        device = torch.cuda.current_device()

        def run(n):
            t0 = ns()
            for _ in range(n):
                delete(alloc(size, device, s))
            return ns() - t0

        return run, s.synchronize
    raise ValueError(family)


def interleaved_rounds(active: dict, rounds: int, on_error) -> dict:
    """Runs ``rounds`` rounds over ``active`` {name: (run, sync, n)}, rotating the order round
    by round; returns {name: [ns per pair, ...]}. A contender that raises is reported through
    on_error(name, exc) and dropped."""
    samples = {name: [] for name in active}
    names = list(active)
    for r in range(rounds):
        k = r % max(len(names), 1)
        for name in names[k:] + names[:k]:
            if name not in active:
                continue
            run, sync, n = active[name]
            try:
                elapsed = timed(run, n)
                sync()
                samples[name].append(elapsed / n)
            except Exception as e:  # noqa: BLE001 - recorded, the others go on
                on_error(name, e)
                del active[name]
                samples.pop(name, None)
    return samples


def time_pairs(ctx: Context, built: dict, size: int, rounds: int, results: dict, cfg,
               keep_rounds: bool = False) -> None:
    """Alloc+free pairs of ``size`` bytes for every contender in ``built`` {name: (family,
    obj)}, calibrated, then timed in ``rounds`` interleaved rounds; each one's summary (us per
    pair) goes to ``results[name][str(size)]``, or the error that stopped it."""
    key = str(size)
    active = {}
    for name, (family, obj) in built.items():
        try:
            run_n, sync = pair_runner(ctx, family, obj, size)
            active[name] = (run_n, sync, calibrate(run_n, sync, cfg.warmup_ms, cfg.round_ms))
        except Exception as e:  # noqa: BLE001 - recorded, the others go on
            results.setdefault(name, {})[key] = {"error": err_text(e)}
    pairs = {name: n for name, (_, _, n) in active.items()}

    def failed(name, exc):
        results.setdefault(name, {})[key] = {"error": err_text(exc)}

    for name, ns_per_pair in interleaved_rounds(active, rounds, failed).items():
        entry = summarize(ns_per_pair, "us", 1e-3)
        entry["pairs_per_round"] = pairs[name]
        if keep_rounds:
            entry["rounds_us"] = [x * 1e-3 for x in ns_per_pair]
        results.setdefault(name, {})[key] = entry


def thread_round(mr, size: int, nthreads: int, pairs: int, streams) -> float:
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
                dealloc(alloc(size, s), size, s)
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


def cuda_check(result, what: str):
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


# ---- meta ----------------------------------------------------------------------------------


def dist_version(*names):
    from importlib import metadata

    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return None


def version_str(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}" if v else "none"


def collect_meta(ctx: Context) -> dict:
    """Which build ran where: GPU, driver, the asyncmr variant (cu12/cu13) and runtime, and
    the version of every library measured."""
    am = ctx.asyncmr
    runtime = am.runtime_version()
    meta = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cuda_driver_api": version_str(am.driver_version()),
        "cuda_runtime_asyncmr": version_str(runtime),
        # The build that ran: asyncmr.runtime_version() is the CUDA runtime it was built with.
        "asyncmr_runtime_version": runtime,
        "variant": f"cu{runtime // 1000}" if runtime else None,
        "device_count": am.device_count(),
        "versions": {
            "asyncmr": getattr(am, "__version__", None),
            "asyncmr-dist": next((f"{n} {v}" for n in ("asyncmr-cu13", "asyncmr-cu12", "asyncmr")
                                  if (v := dist_version(n))), None),
            "rmm": dist_version("rmm-cu13", "rmm-cu12", "rmm"),
            "librmm": dist_version("librmm-cu13", "librmm-cu12", "librmm"),
            "cupy": dist_version("cupy-cuda13x", "cupy-cuda12x", "cupy"),
            "cuda-core": dist_version("cuda-core", "cuda_core"),
            "cuda-bindings": dist_version("cuda-bindings", "cuda_bindings", "cuda-python"),
            "pylibcudf": dist_version("pylibcudf-cu13", "pylibcudf-cu12", "pylibcudf"),
            "libcudf": dist_version("libcudf-cu13", "libcudf-cu12", "libcudf"),
            "numpy": dist_version("numpy"),
            "matplotlib": dist_version("matplotlib"),
        },
    }
    try:
        from cuda.bindings import runtime as cudart

        props = cuda_check(cudart.cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
        name = props.name
        meta["gpu"] = (name.decode(errors="replace") if isinstance(name, bytes) else str(name)
                       ).rstrip("\x00")
        meta["gpu_memory_bytes"] = int(props.totalGlobalMem)
        meta["compute_capability"] = f"{props.major}.{props.minor}"
        meta["cuda_runtime_bindings"] = version_str(
            cuda_check(cudart.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion"))
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


# ---- running the sections ------------------------------------------------------------------


def section_failed(section_result: dict) -> bool:
    """True for a section that raised (its entry holds the error and the traceback)."""
    return isinstance(section_result, dict) and "traceback" in section_result


def write_json(doc: dict, out: Path) -> Path:
    path = out / "results.json"
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, default=str, allow_nan=True) + "\n")
    tmp.replace(path)
    return path


def run_sections(cfg: Config, ctx, registry: dict, doc: dict, out: Path) -> list:
    """Runs cfg.sections from ``registry`` ({number: Section}) into doc["sections"], writing
    results.json after each; returns the numbers of the sections that raised."""
    failed = []
    for num in cfg.sections:
        sec = registry[num]
        print(f"\n== section {num}: {sec.title}", flush=True)
        t0 = time.perf_counter()
        try:
            res = sec.run(cfg, ctx)
        except Skip as e:
            res = {"skipped": str(e)}
            print(f"  section {num} skipped: {e}", flush=True)
        except Exception as e:  # noqa: BLE001 - one section's failure does not end the run
            res = {"error": err_text(e), "traceback": traceback.format_exc()}
            failed.append(num)
            print(f"  section {num} FAILED: {err_text(e)}", flush=True)
        res["elapsed_s"] = time.perf_counter() - t0
        doc["sections"][sec.key] = res
        if not section_failed(res) and "skipped" not in res:
            try:
                sec.show(res)
            except Exception as e:  # noqa: BLE001
                print(f"  (could not print section {num}: {err_text(e)})")
        print(f"  section {num}: {res['elapsed_s']:.1f} s", flush=True)
        write_json(doc, out)  # after every section: a later failure keeps what was measured
        gc.collect()
    return failed
