# SPDX-License-Identifier: Apache-2.0
"""The benchmark's command line: ``python -m asyncmr bench [options]`` from a checkout, or
``python -m asyncmr_bench [options]`` with ``benchmarks/`` on ``sys.path``.

Exit status (the one of every ``python -m asyncmr`` command, ``asyncmr._cli.EXIT_STATUSES``): 0
when every section ran or skipped (whatever the targets say; check them with
``benchmarks/check_targets.py --strict``), 1 when a section raised (the results of the others
are written, and the failed section's error and traceback with them), 2 on bad options, 3 when
there is no usable CUDA GPU, 4 when asyncmr cannot be imported (nothing measured or written).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .common import KiB, MiB, GiB, SECTIONS, err_text, parse_size
from .harness import Config, Context, collect_meta, run_sections, thread_sizes, write_json

ALL = ",".join(str(n) for n in SECTIONS)
EXIT_SECTION_FAILED, EXIT_USAGE, EXIT_NO_GPU, EXIT_MISSING = 1, 2, 3, 4


def parser(prog: str = "python -m asyncmr bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Benchmark asyncmr's resources against RMM, cuda.core, CuPy and cuDF "
        "(needs a CUDA GPU). Sections: " + "; ".join(f"{n} {t}" for n, (_, t) in
                                                      SECTIONS.items()),
        epilog="exit status: 0 every section ran or skipped (whatever the targets say); 1 a "
        "section raised (the others' results are written); 2 bad arguments; 3 no usable CUDA "
        "device or driver; 4 asyncmr is not installed",
    )
    p.add_argument("--sections", default=ALL,
                   help=f"comma list of sections to run (default: all, {ALL})")
    p.add_argument("--sizes", default=None,
                   help="comma list of sizes for sections 1 and 2, e.g. 256,4KiB,1MiB,64MiB "
                   "(the default)")
    p.add_argument("--quick", action="store_true",
                   help="fewer and shorter rounds, smaller staging; a few minutes at most")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed rounds per measurement of section 1 (default 15, quick 7)")
    p.add_argument("--stack-repeats", type=int, default=None,
                   help="rounds of fresh processes per way in section 13 (default 3, quick 2)")
    p.add_argument("--out", default="asyncmr-bench",
                   help="directory for results.json and the PNG plots (default ./asyncmr-bench)")
    p.add_argument("--floor-bin", default=None,
                   help="the C++ program pool_floor, which times the driver's own "
                   "allocation calls on the resources' pools (the floor each resource is held "
                   "to) (default: $ASYNCMR_FLOOR_BIN, else "
                   "build/cpp/benchmarks/cpp/pool_floor under the working directory or the "
                   "checkout)")
    p.add_argument("--floor-lib", default=None,
                   help="the in-process floor library libasyncmr_floor.so (default: "
                   "$ASYNCMR_FLOOR_LIB, else next to the pool_floor program, else the same "
                   "build folder)")
    p.add_argument("--cache-bin", default=None,
                   help="the C++ cache_bench program of section 11 (default: $ASYNCMR_CACHE_BIN, "
                   "else next to the pool_floor program, else the same build folder)")
    p.add_argument("--no-floor", action="store_true",
                   help="skip every C++ program and library (pool_floor, libasyncmr_floor.so, "
                   "cache_bench)")
    p.add_argument("--seed", type=int, default=20261130, help="seed of the random workloads")
    return p


def make_config(p: argparse.ArgumentParser, args) -> Config:
    """The run's settings; bad option values end the process through p.error (status 2)."""
    try:
        sections = sorted({int(s) for s in args.sections.split(",") if s.strip()})
    except ValueError:
        p.error(f"--sections: expected a comma list of numbers from {ALL}, got "
                f"{args.sections!r}")
    if not sections or any(s not in SECTIONS for s in sections):
        p.error(f"--sections: expected numbers from {ALL}, got {args.sections!r}")
    sizes = [256, 4 * KiB, 1 * MiB, 64 * MiB]
    if args.sizes:
        try:
            sizes = sorted({parse_size(s) for s in args.sizes.split(",") if s.strip()})
        except ValueError as e:
            p.error(f"--sizes: {e}")
        if not sizes:
            p.error("--sizes: no size given")
    for name, value in (("--repeats", args.repeats), ("--stack-repeats", args.stack_repeats)):
        if value is not None and value < 1:
            p.error(f"{name} must be >= 1")
    q = args.quick
    return Config(
        quick=q,
        sections=sections,
        sizes=sizes,
        repeats=args.repeats or (7 if q else 15),
        out=args.out,
        floor_bin=args.floor_bin,
        floor_lib=args.floor_lib,
        cache_bin=args.cache_bin,
        no_floor=args.no_floor,
        seed=args.seed,
        round_ms=4.0 if q else 20.0,
        warmup_ms=10.0 if q else 50.0,
        sync_rounds=30 if q else 100,
        sync_budget_s=0.4 if q else 1.5,
        thread_counts=(1, 2, 4, 8),
        thread_sizes=thread_sizes(q),
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
        gil_repeats=2 if q else 3,
        gil_thread_repeats=3 if q else 5,
        gil_pair_rounds=11 if q else 21,
        stage_chunks=64 if q else 256,
        stage_repeats=3 if q else 5,
        array_repeats=5 if q else 10,
        parquet_repeats=2 if q else 3,
        cache_rounds=11 if q else 21,
        placement_bytes=256 * MiB if q else 1 * GiB,
        placement_repeats=5 if q else 9,
        stack_rows=2_000_000 if q else 4_000_000,
        stack_repeats=args.stack_repeats or (2 if q else 3),
        ml_rows=100_000 if q else 200_000,
    )


def execute(cfg: Config, ctx, registry: dict, meta: dict) -> tuple:
    """Runs the sections, recomputes the targets, draws the plots and writes results.json;
    returns (the results document, the exit status)."""
    from .plots import write_plots
    from .targets import compute_targets, print_targets

    started = time.perf_counter()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "params": asdict(cfg), "sections": {}, "targets": []}
    failed = run_sections(cfg, ctx, registry, doc, out)
    doc["failed_sections"] = failed
    doc["targets"] = compute_targets(doc)
    print()
    print_targets(doc["targets"])
    doc["elapsed_s"] = time.perf_counter() - started
    doc["plots"] = write_plots(doc, out)
    path = write_json(doc, out)
    print(f"\nwrote {path}" + "".join(f"\nwrote {out / p}" for p in doc["plots"].values()
                                      if isinstance(p, str) and not p.startswith("error")))
    for k, p in doc["plots"].items():
        if isinstance(p, str) and p.startswith("error") or k == "error":
            print(f"plot {k}: {p}")
    print(f"total {doc['elapsed_s']:.1f} s")
    if failed:
        print(f"asyncmr bench: section(s) {', '.join(map(str, failed))} FAILED (see above and "
              f"{path}); exit status {EXIT_SECTION_FAILED}", file=sys.stderr)
        return doc, EXIT_SECTION_FAILED
    return doc, 0


def main(argv=None, prog: str = "python -m asyncmr bench") -> int:
    """Runs the benchmark; returns the process exit status (see the module docstring)."""
    p = parser(prog)
    args = p.parse_args(sys.argv[1:] if argv is None else list(argv))
    cfg = make_config(p, args)
    try:
        import asyncmr
    except Exception as e:  # noqa: BLE001
        print(f"asyncmr bench: cannot import asyncmr: {err_text(e)}", file=sys.stderr)
        return EXIT_MISSING
    try:
        asyncmr.device_count()
    except asyncmr.NoDeviceError as e:
        print(f"asyncmr bench: no usable CUDA GPU, nothing measured: "
              f"{str(e).removeprefix('asyncmr: ')}", file=sys.stderr)
        return EXIT_NO_GPU

    from .sections import REGISTRY

    ctx = Context()
    meta = collect_meta(ctx)
    v = meta["versions"]
    print(f"asyncmr bench{' --quick' if cfg.quick else ''}: {meta.get('gpu', '?')}, driver "
          f"{meta.get('driver', meta.get('cuda_driver_api'))}, asyncmr {meta.get('variant')} "
          f"(runtime {meta.get('cuda_runtime_asyncmr')}), rmm {v.get('rmm')}, cupy "
          f"{v.get('cupy')}, cuda-core {v.get('cuda-core')}; sections "
          f"{','.join(map(str, cfg.sections))}; writing to {cfg.out}", flush=True)
    _, status = execute(cfg, ctx, REGISTRY, meta)
    return status


if __name__ == "__main__":
    sys.exit(main(prog="python -m asyncmr_bench"))
