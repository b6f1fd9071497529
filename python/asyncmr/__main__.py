# SPDX-License-Identifier: Apache-2.0
"""``python -m asyncmr demo``, ``info``, ``bench``, ``plot`` and ``cudf-pandas``.

Each subcommand parses its own arguments (``main`` dispatches on the first one), so a bad option
prints that subcommand's usage; the exit statuses are ``asyncmr._cli.EXIT_STATUSES``. The
benchmark is not part of this package: ``bench`` finds it in a source checkout
(``benchmarks/asyncmr_bench``) and runs it, or says how to.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import textwrap
from pathlib import Path

from asyncmr._cli import (EXIT_FAILURE, EXIT_MISSING, EXIT_NO_GPU, EXIT_OK, EXIT_STATUSES,
                          EXIT_USAGE, OnceAction, exit_statuses_epilog, reason)
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
        print(f"asyncmr demo: no usable CUDA device: {reason(e)}", file=sys.stderr)
        return EXIT_NO_GPU
    try:
        import cupy
    except ImportError:
        print("asyncmr demo: needs CuPy (pip install 'asyncmr-cu13[demo]', or "
              "'asyncmr-cu12[demo]' for the CUDA 12 build)", file=sys.stderr)
        return EXIT_MISSING
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
            return EXIT_FAILURE
    return EXIT_FAILURE if failed else EXIT_OK


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


BENCH_NOT_FOUND = (
    "The benchmark is not part of the installed asyncmr package: it lives in benchmarks/ of the "
    "asyncmr source checkout (looked at: {looked}). Run it from the checkout's root:\n"
    "    cd /path/to/asyncmr && python -m asyncmr bench --quick --out OUT\n"
    "or set ASYNCMR_BENCHMARKS=/path/to/asyncmr/benchmarks, or run\n"
    "    PYTHONPATH=/path/to/asyncmr/benchmarks python -m asyncmr_bench --help")


def _bench(rest: list[str]) -> int:
    where, looked = _find_benchmarks()
    if where is None:
        text = BENCH_NOT_FOUND.format(looked=", ".join(str(p) for p in looked))
        if rest and rest[0] in ("-h", "--help"):
            print(f"usage: python -m asyncmr bench [options]\n\n{text}")
            return EXIT_OK
        print(f"asyncmr bench: {text[0].lower()}{text[1:]}", file=sys.stderr)
        return EXIT_MISSING
    sys.path.insert(0, str(where.resolve()))
    from asyncmr_bench.__main__ import main as bench_main

    return bench_main(rest)


#: The subcommands: name -> one line of what it does (the top-level --help lists them).
COMMANDS = {
    "demo": "run a small CuPy pipeline on each resource and print what each pool held",
    "info": "devices, what this build supports on this driver, and the live state of the "
            "default and current pools",
    "plot": "draw a timeline PNG of a saved allocation history",
    "cudf-pandas": "run a script or module under cudf.pandas, allocating from an "
                   "AsyncManagedMR",
    "bench": "the benchmark, from a source checkout (needs a GPU)",
}


def _version() -> str:
    import asyncmr

    rt = asyncmr.runtime_version()
    return f"asyncmr {asyncmr.__version__} (CUDA runtime {rt // 1000}.{rt % 1000 // 10})"


def parser() -> argparse.ArgumentParser:
    """``python -m asyncmr``: the subcommands; each parses its own arguments."""
    p = argparse.ArgumentParser(
        prog="python -m asyncmr", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="asyncmr's command line. `python -m asyncmr COMMAND --help` describes a "
                    "command and its options.",
        epilog="exit status, the same for every command:\n" + "\n".join(
            textwrap.fill(what, 79, initial_indent=f"  {code}  ", subsequent_indent="     ")
            for code, what in EXIT_STATUSES))
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, summary in COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    return p


def demo_parser() -> argparse.ArgumentParser:
    """``python -m asyncmr demo``."""
    p = argparse.ArgumentParser(
        prog="python -m asyncmr demo",
        description="Runs a small CuPy pipeline (an array, elementwise work, a sum) with each "
                    "asyncmr resource as RMM's current resource and CuPy allocating through "
                    "RMM, then prints a table: per resource, its memory type and location, "
                    "the allocations RMM counted, RMM's peak bytes, the pool's used and "
                    "reserved high-water marks, and whether the result matched NumPy's. Needs "
                    "a GPU and CuPy (the [demo] extra).",
        epilog=exit_statuses_epilog())
    p.add_argument("--elements", metavar="N", type=_elements, default=1 << 22,
                   action=OnceAction,
                   help=f"float64 elements per array (default: {1 << 22}; at most "
                        f"{MAX_ELEMENTS}, 8 GiB an array)")
    p.add_argument("--history", metavar="DIR", type=_history_dir, default=None,
                   action=OnceAction,
                   help="record the owned pool's run and write its allocation history and a "
                        "timeline PNG of it (needs matplotlib) into DIR")
    return p


def main(argv: list[str] | None = None) -> int:
    """Runs ``python -m asyncmr ARGS``; returns the exit status (``_cli.EXIT_STATUSES``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        # --help, --version, no command or an unknown one: argparse answers and exits.
        parser().parse_args(argv)
        return EXIT_USAGE  # not reached: a command would have been among COMMANDS
    command, rest = argv[0], argv[1:]
    if command == "demo":
        return _demo(demo_parser().parse_args(rest))
    if command == "info":
        from asyncmr._info import main as info_main

        return info_main(rest)
    if command == "cudf-pandas":
        from asyncmr.cudf_pandas import main as cudf_pandas_main

        return cudf_pandas_main(rest)
    if command == "plot":
        from asyncmr.history import main as plot_main

        return plot_main(rest)
    return _bench(rest)


if __name__ == "__main__":
    sys.exit(main())
