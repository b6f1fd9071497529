# SPDX-License-Identifier: Apache-2.0
"""Section 9: copy bandwidth of pinned NumPy arrays:
``asyncmr.pinned_empty(shape, dtype)`` (pool-pinned memory) against ``cupyx.empty_pinned``
(CuPy's pinned allocator: ``cudaHostAlloc`` memory), host-to-device with ``ndarray.set`` and
device-to-host with ``ndarray.get(out=...)``, each copy timed with CUDA events on one
non-blocking CuPy stream, interleaved round by round.

Target (targets.py): asyncmr's bandwidth >= 0.95x cudaHostAlloc memory's, each direction.
"""

from __future__ import annotations

import gc

from ..common import (
    ASYNCMR_ARRAY, CUPY_ARRAY, SECTION_TITLES, copy_row, err_text, fmt_size, median_of,
    print_ratio_values, print_table, ratio, summarize,
)
from ..harness import Skip

DIRECTIONS = ("H2D", "D2H")


def run(cfg, ctx) -> dict:
    try:
        cp, stream = ctx.cupy()
        import cupyx
        import numpy as np
    except ImportError as e:
        raise Skip(f"CuPy is not installed ({err_text(e)})") from e
    pinned_empty = getattr(ctx.asyncmr, "pinned_empty", None)
    if not callable(pinned_empty):
        raise Skip("this asyncmr has no asyncmr.pinned_empty")

    nbytes = cfg.array_bytes
    results: dict = {}
    arrays = {}
    for name, make in ((ASYNCMR_ARRAY, lambda: pinned_empty((nbytes,), np.uint8)),
                       (CUPY_ARRAY, lambda: cupyx.empty_pinned((nbytes,), dtype=np.uint8))):
        try:
            a = make()
            a[:] = 7  # touch every page from the host before timing
            arrays[name] = a
        except Exception as e:  # noqa: BLE001
            results[name] = {"error": err_text(e)}
    with stream:
        dev = cp.empty((nbytes,), dtype=cp.uint8)
        dev.fill(3)
    start, end = cp.cuda.Event(), cp.cuda.Event()

    def one_copy(a, direction) -> float:
        """GB/s of one copy, timed by events around it on the stream."""
        start.record(stream)
        if direction == "H2D":
            dev.set(a, stream=stream)
        else:
            dev.get(out=a, stream=stream, blocking=False)
        end.record(stream)
        end.synchronize()
        return nbytes / (cp.cuda.get_elapsed_time(start, end) * 1e-3) / 1e9

    def round_trips(a) -> bool:
        """The bytes make the trip through the timed calls: the host's 7s go to the device
        (which held 3s), the host array is zeroed, and the 7s come back."""
        a[:] = 7
        with stream:
            dev.fill(3)
        dev.set(a, stream=stream)
        stream.synchronize()
        a[:] = 0
        dev.get(out=a, stream=stream, blocking=False)
        stream.synchronize()
        return bool((a == 7).all())

    samples = {name: {d: [] for d in DIRECTIONS} for name in arrays}
    for name, a in arrays.items():  # warm-up
        for d in DIRECTIONS:
            try:
                one_copy(a, d)
            except Exception as e:  # noqa: BLE001
                results[name] = {"error": err_text(e)}
    for r in range(cfg.array_repeats):
        live = [n for n in arrays if n not in results]
        k = r % max(len(live), 1)
        for name in live[k:] + live[:k]:
            try:
                for d in DIRECTIONS:
                    samples[name][d].append(one_copy(arrays[name], d))
            except Exception as e:  # noqa: BLE001 - recorded, the other goes on
                results[name] = {"error": err_text(e)}
    live = [n for n in arrays if n not in results]
    checks = {}
    for name in live:
        checks[name] = round_trips(arrays[name])
        # A copy that moved the wrong bytes has no bandwidth to compare: its target misses.
        results[name] = ({d: summarize(samples[name][d], "GBps") for d in DIRECTIONS}
                         if checks[name] else {"error": "the data did not round-trip"})
    arrays.clear()
    gc.collect()

    def med(name, d):
        return median_of(results.get(name, {}).get(d), "GBps")

    return {
        "bytes": nbytes,
        "repeats": cfg.array_repeats,
        "results": results,
        "data_checked": checks,
        "ratios": {f"{d} asyncmr / cudaHostAlloc": ratio(med(ASYNCMR_ARRAY, d), med(CUPY_ARRAY, d))
                   for d in DIRECTIONS},
        "notes": [
            "one copy of the whole array per round, CUDA events around it, non-blocking CuPy "
            "stream; both arrays touched from the host before timing",
            "cupyx.empty_pinned allocates through CuPy's current pinned allocator: its default "
            "PinnedMemoryPool over cudaHostAlloc",
        ],
    }


def show(res: dict) -> None:
    rows = [copy_row(name, e, 70) for name, e in res.get("results", {}).items()]
    print_table(f"{SECTION_TITLES[9]} -- one {fmt_size(res.get('bytes', 0))} copy "
                "(GB/s: median [p10-p90])", ["host array", "H2D", "D2H"], rows)
    print_ratio_values(res.get("ratios", {}))
    bad = [n for n, ok in res.get("data_checked", {}).items() if not ok]
    if bad:
        print(f"  WARNING: data did not round-trip for: {', '.join(bad)}")
