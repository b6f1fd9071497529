# SPDX-License-Identifier: Apache-2.0
"""``python -m asyncmr demo``, ``info``, ``bench``, ``plot`` and ``cudf-pandas``.

The benchmark is not part of this package: ``bench`` finds it in a source checkout
(``benchmarks/asyncmr_bench``) and runs it, or says how to.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from pathlib import Path

from asyncmr._cli import OnceAction
from asyncmr._validate import ascii_digits


#: The demo's largest --elements: 8 GiB a float64 array, and it makes several.
MAX_ELEMENTS = 1 << 30


def _elements(text: str) -> int:
    """A count of 1 to MAX_ELEMENTS, in ASCII digits (judged by its digits before int() reads
    them: Python refuses to read an int of more than 4300)."""
    if not ascii_digits(text) or not text.strip("0"):
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    if len(text.lstrip("0")) > len(str(MAX_ELEMENTS)) or int(text) > MAX_ELEMENTS:
        shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} digits)"
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_ELEMENTS} (8 GiB a float64 array; the demo makes several), "
            f"got {shown}")
    return int(text)


def _history_dir(text: str) -> str:
    """A directory to write the demo's history into: one that exists, or a name to make."""
    if not text:
        raise argparse.ArgumentTypeError("needs a directory name")
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    return text


def _read_scalar(cupy, array) -> float:
    """Copy a 0-d array to the host with cudaMemcpyDefault.

    CuPy's ``.get()`` states a device-to-host copy, which CUDA refuses for pool-allocated
    pinned memory (it is host memory); the default kind works for every resource.
    """
    import numpy as np

    out = np.empty(1, dtype=array.dtype)
    cupy.cuda.get_current_stream().synchronize()
    cupy.cuda.runtime.memcpy(out.ctypes.data, array.data.ptr, out.nbytes,
                             cupy.cuda.runtime.memcpyDefault)
    return float(out[0])


def _demo(args) -> int:
    import asyncmr

    try:
        count = asyncmr.device_count()
    except asyncmr.NoDeviceError as e:
        print(f"asyncmr demo: cannot run: {e}", file=sys.stderr)
        return 1
    try:
        import cupy
    except ImportError:
        print("asyncmr demo: needs CuPy (pip install 'asyncmr[demo]')", file=sys.stderr)
        return 2
    import numpy as np
    import rmm
    from rmm.allocators.cupy import rmm_cupy_allocator

    print(f"asyncmr {asyncmr.__version__}: {count} device(s), driver "
          f"{asyncmr.driver_version()}, runtime {asyncmr.runtime_version()}")
    resources = [
        ("AsyncManagedMR()", lambda: asyncmr.AsyncManagedMR()),
        ("AsyncPinnedMR()", lambda: asyncmr.AsyncPinnedMR()),
        ("AsyncDeviceMR()", lambda: asyncmr.AsyncDeviceMR()),
        ("AsyncDeviceMR(pool='new')", lambda: asyncmr.AsyncDeviceMR(pool="new")),
    ]
    n = args.elements
    host = np.arange(n, dtype=np.float64)
    expected = float((2 * (np.sqrt(host * host + 1.0) - 1.0)).sum())
    previous_mr = rmm.mr.get_current_device_resource()
    previous_allocator = cupy.cuda.get_allocator()
    stats_rows = []
    failed = False
    recorded = None
    try:
        cupy.cuda.set_allocator(rmm_cupy_allocator)
        for name, make in resources:
            mr = make()
            stats = rmm.mr.StatisticsResourceAdaptor(mr)
            rmm.mr.set_current_device_resource(stats)
            # With --history, the owned pool's run is recorded, in phases, and trimmed after.
            record = args.history is not None and name == "AsyncDeviceMR(pool='new')"
            with mr.track_peak() as peak, \
                    (mr.record_history() if record else contextlib.nullcontext()) as h:
                phase = h.phase if h is not None else (lambda _: contextlib.nullcontext())
                # A small pipeline with short-lived temporaries, all from this resource.
                with phase("load"):
                    x = cupy.arange(n, dtype=cupy.float64)
                with phase("compute"):
                    y = cupy.sqrt(x * x + 1.0) - 1.0
                    total = _read_scalar(cupy, (y * 2).sum())
                with phase("release"):
                    del x, y
                    cupy.cuda.get_current_stream().synchronize()
                    if h is not None:
                        mr.trim_to(0)
            if h is not None:
                recorded = h.history()
            counts = stats.allocation_counts
            ok = math.isclose(total, expected, rel_tol=1e-9)
            failed |= not ok
            stats_rows.append((name, mr.allocation_type, str(mr.location), counts.total_count,
                               counts.peak_bytes, peak.used, peak.reserved, ok))
            rmm.mr.set_current_device_resource(previous_mr)
            del stats, mr
    finally:
        rmm.mr.set_current_device_resource(previous_mr)
        cupy.cuda.set_allocator(previous_allocator)

    header = ("resource", "type", "location", "allocations", "peak bytes (RMM)",
              "pool used high", "pool reserved high", "result")
    rows = [header] + [(r[0], r[1], r[2], str(r[3]), f"{r[4]:,}", f"{r[5]:,}", f"{r[6]:,}",
                        "ok" if r[7] else "WRONG") for r in stats_rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    if recorded is not None:
        try:
            _write_history(recorded, Path(args.history))
        except OSError as e:  # the directory could not be made, or a file written
            print(f"asyncmr demo: cannot write the history into {args.history}: "
                  f"{e.strerror or e}", file=sys.stderr)
            return 1
    return 1 if failed else 0


def _write_history(history, where: Path) -> None:
    """The demo's recording as asyncmr's JSON history file (a few dozen events: uncompressed,
    to read as it is), and its timeline where matplotlib is."""
    from asyncmr.history import plot

    where.mkdir(parents=True, exist_ok=True)
    saved = where / "demo-history.json"
    history.save(saved)
    print(f"history: {len(history.events)} events of AsyncDeviceMR(pool='new') in {saved} "
          "(for PyTorch's memory viewer: asyncmr.history.load(path).export_torch_snapshot(out))")
    try:
        png = plot(history, where / "demo-timeline.png",
                   title="python -m asyncmr demo: AsyncDeviceMR(pool='new')")
    except ImportError as e:
        print(f"history: no timeline ({e})", file=sys.stderr)
        return
    print(f"history: timeline in {png}")


def _find_benchmarks() -> tuple[Path | None, list[Path]]:
    """(the checkout's benchmarks/ folder or None, the places looked at): $ASYNCMR_BENCHMARKS
    (that folder, or a checkout holding it), else ./benchmarks."""
    env = os.environ.get("ASYNCMR_BENCHMARKS")
    places = [Path(env), Path(env) / "benchmarks"] if env else [Path.cwd() / "benchmarks"]
    for place in places:
        if (place / "asyncmr_bench" / "__main__.py").is_file():
            return place, places
    return None, places


def _bench(rest: list[str]) -> int:
    where, looked = _find_benchmarks()
    if where is None:
        print("asyncmr bench: the benchmark is not part of the installed asyncmr package; it "
              "lives in benchmarks/ of the asyncmr source checkout (looked at: "
              f"{', '.join(str(p) for p in looked)}). Run it from the checkout's root:\n"
              "    cd /path/to/asyncmr && python -m asyncmr bench --quick --out OUT\n"
              "or set ASYNCMR_BENCHMARKS=/path/to/asyncmr/benchmarks, or run\n"
              "    PYTHONPATH=/path/to/asyncmr/benchmarks python -m asyncmr_bench --help",
              file=sys.stderr)
        return 1
    sys.path.insert(0, str(where.resolve()))
    from asyncmr_bench.__main__ import main as bench_main

    return bench_main(rest)


def main(argv: list[str] | None = None) -> int:
    import asyncmr

    parser = argparse.ArgumentParser(prog="python -m asyncmr")
    parser.add_argument("--version", action="version",
                        version=f"asyncmr {asyncmr.__version__} (CUDA runtime "
                                f"{asyncmr.runtime_version() // 1000}."
                                f"{asyncmr.runtime_version() % 1000 // 10})")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a small CuPy pipeline on each resource")
    demo.add_argument("--elements", type=_elements, default=1 << 22, action=OnceAction)
    demo.add_argument("--history", metavar="DIR", type=_history_dir, default=None,
                      action=OnceAction,
                      help="record the owned pool's run and write DIR/demo-history.json (its "
                           "allocation history) and DIR/demo-timeline.png")
    sub.add_parser("bench", help="the benchmark, from a source checkout (GPU; "
                   "see benchmarks/README.md)", add_help=False)
    # info parses its own arguments (--json), like bench.
    sub.add_parser("info", help="devices, supported pool kinds/locations, live pool state",
                   add_help=False)
    sub.add_parser("plot", help="a timeline PNG of a saved allocation history "
                   "(record_history; see docs/HISTORY.md)", add_help=False)
    sub.add_parser("cudf-pandas", help="run a script or module under cudf.pandas on an "
                   "AsyncManagedMR (asyncmr.cudf_pandas)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        if rest:  # only bench, info, plot and cudf-pandas take their own arguments
            parser.error(f"demo: unrecognized arguments: {' '.join(rest)}")
        return _demo(args)
    if args.command == "info":
        from asyncmr._info import main as info_main

        return info_main(rest)
    if args.command == "cudf-pandas":
        from asyncmr.cudf_pandas import main as cudf_pandas_main

        return cudf_pandas_main(rest)
    if args.command == "plot":
        from asyncmr.history import main as plot_main

        return plot_main(rest)
    return _bench(rest)


if __name__ == "__main__":
    sys.exit(main())
