# SPDX-License-Identifier: Apache-2.0
"""Section 10: a cuDF Parquet round trip through host buffers:
pylibcudf writes a ~100 MB table to a file in the temporary directory and reads it back (the
file stays in the page cache), with cuDF's default
pinned resource, and with asyncmr's pinned pool installed as cuDF's pinned resource through
``asyncmr.cudf.set_pinned_memory_resource(mr)`` (an optional module, built when libcudf is
found). libcudf stages its host-device copies through that resource.

Reported: seconds to write and to read (median over rounds, the two set-ups interleaved), the
pool's peak while installed, and whether the data read back equals the data written.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import tempfile
import time

from ..common import (
    APR_NEW, SECTION_TITLES, err_text, median_of, print_ratio_values, print_table, ratio,
    summarize,
)
from ..harness import Skip, cuda_check, reset_peaks, trim_to

CUDF_DEFAULT = "cuDF default pinned resource"
ASYNCMR_PINNED = f"asyncmr.cudf.set_pinned_memory_resource({APR_NEW})"


def _require(ctx):
    try:
        plc = importlib.import_module("pylibcudf")
    except ImportError as e:
        raise Skip(f"pylibcudf is not installed ({err_text(e)})") from e
    try:
        amcudf = importlib.import_module("asyncmr.cudf")
    except ImportError as e:
        raise Skip("this asyncmr has no asyncmr.cudf module (optional; built only when libcudf "
                   f"is found at build time): {err_text(e)}") from e
    if not callable(getattr(amcudf, "set_pinned_memory_resource", None)):
        raise Skip("asyncmr.cudf has no set_pinned_memory_resource(mr)")
    try:
        importlib.import_module("pyarrow")
    except ImportError as e:
        raise Skip(f"pyarrow is not installed (the table is built with it): {err_text(e)}") from e
    return plc, amcudf


@contextlib.contextmanager
def installed(amcudf, mr):
    """asyncmr's resource as cuDF's pinned resource for the block, the previous one after:
    through amcudf.pinned_memory_resource(mr) when the module has that context manager, else
    set_pinned_memory_resource(mr), which returns the previous resource, set back on exit."""
    scoped = getattr(amcudf, "pinned_memory_resource", None)
    if callable(scoped):
        with scoped(mr):
            yield
        return
    previous = amcudf.set_pinned_memory_resource(mr)
    try:
        yield
    finally:
        amcudf.set_pinned_memory_resource(previous)


def _table(plc, nbytes: int, seed: int):
    """(pylibcudf Table, the host columns): 2 int64 and 2 float64 columns, ~nbytes in all."""
    import numpy as np

    import pyarrow as pa

    rows = max(nbytes // 32, 1)
    rng = np.random.default_rng(seed)
    host = [
        np.arange(rows, dtype=np.int64),
        rng.integers(0, 1000, rows, dtype=np.int64),
        rng.random(rows),
        rng.standard_normal(rows),
    ]
    # pyarrow to pylibcudf: the path tests/test_cudf.py checked on the GPU.
    arrow = pa.table({f"c{i}": a for i, a in enumerate(host)})
    return plc.Table.from_arrow(arrow), host


def _round_trip(plc, table) -> tuple:
    """(write s, read s, the parquet file's bytes, the table read back). Through a file path,
    the sink and source pylibcudf's tests and asyncmr's (tests/test_cudf.py) use."""
    from cuda.bindings import runtime as cudart

    with tempfile.TemporaryDirectory(prefix="asyncmr-bench-") as folder:
        path = os.path.join(folder, "table.parquet")
        options = plc.io.parquet.ParquetWriterOptions.builder(
            plc.io.types.SinkInfo([path]), table).build()
        t0 = time.perf_counter()
        plc.io.parquet.write_parquet(options)
        t1 = time.perf_counter()
        size = os.path.getsize(path)
        read_options = plc.io.parquet.ParquetReaderOptions.builder(
            plc.io.types.SourceInfo([path])).build()
        t2 = time.perf_counter()
        got = plc.io.parquet.read_parquet(read_options)
        cuda_check(cudart.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        t3 = time.perf_counter()
    return t1 - t0, t3 - t2, size, got


def _equal(ctx, got, host) -> bool | None:
    """Whether the columns read back equal the ones written (None: no pyarrow to look)."""
    try:
        import pyarrow as pa
    except ImportError:
        return None
    import numpy as np

    back = pa.table(got.tbl.to_arrow())
    return back.num_columns == len(host) and all(
        np.array_equal(back.column(i).to_numpy(), h) for i, h in enumerate(host))


def run(cfg, ctx) -> dict:
    plc, amcudf = _require(ctx)
    table, host = _table(plc, cfg.parquet_bytes, cfg.seed)
    mr = ctx.asyncmr.AsyncPinnedMR(pool="new")  # owned: its watermarks count cuDF's use only
    setups = {CUDF_DEFAULT: contextlib.nullcontext, ASYNCMR_PINNED: lambda: installed(amcudf, mr)}
    samples = {name: {"write": [], "read": []} for name in setups}
    results: dict = {}
    checks: dict = {}
    sizes: dict = {}
    for name, scope in setups.items():  # warm-up, and the correctness check
        try:
            with scope():
                _, _, size, got = _round_trip(plc, table)
            checks[name] = _equal(ctx, got, host)
            sizes[name] = size
        except Exception as e:  # noqa: BLE001
            results[name] = {"error": err_text(e)}
    reset_peaks(mr)
    for r in range(cfg.parquet_repeats):
        live = [n for n in setups if n not in results]
        k = r % max(len(live), 1)
        for name in live[k:] + live[:k]:
            try:
                with setups[name]():
                    w, rd, _, _ = _round_trip(plc, table)
                samples[name]["write"].append(w)
                samples[name]["read"].append(rd)
            except Exception as e:  # noqa: BLE001
                results[name] = {"error": err_text(e)}
            gc.collect()
    if all("error" in results.get(name, {}) for name in setups):
        # Nothing measured: the section fails (and the run exits non-zero), rather than give a
        # table of errors (such as cuDF's "Unsupported dtype object").
        raise RuntimeError("every set-up failed: " +
                           "; ".join(f"{n}: {results[n]['error']}" for n in setups))
    for name in setups:
        if name in results:
            continue
        results[name] = {k: summarize(v, "s") for k, v in samples[name].items()}
        results[name]["parquet_bytes"] = sizes.get(name)
        results[name]["data_equal"] = checks.get(name)
    if ASYNCMR_PINNED in results and "error" not in results[ASYNCMR_PINNED]:
        attrs = mr.attributes
        results[ASYNCMR_PINNED]["pool_reserved_high_bytes"] = attrs.reserved_mem_high
        results[ASYNCMR_PINNED]["pool_used_high_bytes"] = attrs.used_mem_high
        trim_to(mr, 0)
        results[ASYNCMR_PINNED]["pool_reserved_after_trim_bytes"] = \
            mr.attributes.reserved_mem_current

    def med(name, what):
        return median_of(results.get(name, {}).get(what), "s")

    return {
        "table": {"rows": table.num_rows(), "columns": table.num_columns(),
                  "bytes": sum(h.nbytes for h in host), "dtypes": ["int64", "int64", "float64",
                                                                   "float64"]},
        "repeats": cfg.parquet_repeats,
        "results": results,
        "ratios": {f"{w} time asyncmr / cuDF default": ratio(med(ASYNCMR_PINNED, w),
                                                            med(CUDF_DEFAULT, w))
                   for w in ("write", "read")},
        "notes": [
            "write: write_parquet to a file in the temporary directory; read: read_parquet "
            "from that file (in the page cache), then a device synchronize; rounds "
            "interleaved between the two set-ups",
            "asyncmr: AsyncPinnedMR(pool='new') installed as cuDF's pinned resource for each "
            "round and the previous resource put back after; its peaks cover the timed rounds",
        ],
    }


def show(res: dict) -> None:
    t = res.get("table", {})
    rows = []
    for name, e in res.get("results", {}).items():
        if "error" in e:
            rows.append([name, f"error: {e['error'][:70]}", "", "", ""])
            continue
        peak = e.get("pool_reserved_high_bytes")
        rows.append([name, f"{e['write']['median_s'] * 1e3:.1f}",
                     f"{e['read']['median_s'] * 1e3:.1f}",
                     "-" if peak is None else f"{peak / 2**20:.1f}",
                     {True: "yes", False: "NO", None: "unchecked"}[e.get("data_equal")]])
    print_table(f"{SECTION_TITLES[10]} -- {t.get('rows')} rows, {t.get('bytes', 0) / 1e6:.0f} MB",
                ["pinned resource", "write ms", "read ms", "pool peak MiB", "data equal"], rows)
    print_ratio_values(res.get("ratios", {}))
