# SPDX-License-Identifier: Apache-2.0
"""Section 10: a cuDF Parquet round trip through host buffers (issue 10 items 3 and 5):
pylibcudf writes a ~100 MB table to an in-memory sink and reads it back, with cuDF's default
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
import io
import time

from ..common import (
    APR_NEW, SECTION_TITLES, err_text, fmt_ratio, median_of, print_table, ratio, summarize,
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
                   f"is found at build time; issue 10 item 3): {err_text(e)}") from e
    if not callable(getattr(amcudf, "set_pinned_memory_resource", None)):
        raise Skip("asyncmr.cudf has no set_pinned_memory_resource(mr)")
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

    rows = max(nbytes // 32, 1)
    rng = np.random.default_rng(seed)
    host = [
        np.arange(rows, dtype=np.int64),
        rng.integers(0, 1000, rows, dtype=np.int64),
        rng.random(rows),
        rng.standard_normal(rows),
    ]
    return plc.Table([plc.Column.from_array(a) for a in host]), host


def _round_trip(plc, table) -> tuple:
    """(write s, read s, the parquet bytes, the table read back)."""
    from cuda.bindings import runtime as cudart

    sink = io.BytesIO()
    options = plc.io.parquet.ParquetWriterOptions.builder(plc.io.SinkInfo([sink]), table).build()
    t0 = time.perf_counter()
    plc.io.parquet.write_parquet(options)
    t1 = time.perf_counter()
    data = sink.getvalue()
    read_options = plc.io.parquet.ParquetReaderOptions.builder(
        plc.io.SourceInfo([data])).build()
    t2 = time.perf_counter()
    got = plc.io.parquet.read_parquet(read_options)
    cuda_check(cudart.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
    t3 = time.perf_counter()
    return t1 - t0, t3 - t2, data, got


def _equal(ctx, got, host) -> bool | None:
    """Whether the columns read back equal the ones written (None: no CuPy to look)."""
    try:
        cp = ctx.cupy()[0]
    except ImportError:
        return None
    import numpy as np

    cols = got.columns if not callable(got.columns) else got.columns()
    return len(cols) == len(host) and all(
        np.array_equal(cp.asarray(c).get(), h) for c, h in zip(cols, host, strict=True))


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
                _, _, data, got = _round_trip(plc, table)
            checks[name] = _equal(ctx, got, host)
            sizes[name] = len(data)
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
            "write: write_parquet to an io.BytesIO sink; read: read_parquet from the bytes, "
            "then a device synchronize; rounds interleaved between the two set-ups",
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
    rows = [[k, fmt_ratio(v)] for k, v in res.get("ratios", {}).items()]
    print_table("  ratios", ["ratio", "value"], rows)
