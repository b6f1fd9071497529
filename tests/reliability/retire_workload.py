# SPDX-License-Identifier: Apache-2.0
"""Owned pools of every kind created, used and dropped many times, in a process where RMM's
current resource and CuPy's allocator are in use: the workload of the pool-retirement stress
tests (test_reliability_retirement.py), in process and as a plain interpreter.

    python tests/reliability/retire_workload.py ROUNDS [--adopt] [--kinds K,K] [--seed N]

Each round makes one resource per kind (device, pinned, managed with each prefetch target),
alternating a front cache and none, allocates and frees 4 KiB, 64 KiB and 1 MiB + 512 bytes on
the legacy, per-thread, a long-lived and a fresh created stream, prefetches managed blocks
(`prefetch=` and `asyncmr.prefetch`), and in between releases caches, closes pools and collects
garbage, rebinding one name so that each resource dies while the next is made. ``--adopt``
makes every pool with ``MemPool.create`` and hands it to the resource instead. Prints one line
per kind of retirement and exits 0 when every pool came back: nothing parked at the end.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time

SIZES = (4096, 64 << 10, (1 << 20) + 512)
KINDS = ("device", "pinned", "managed-none", "managed-device", "managed-host")


def _make(asyncmr, kind: str, cache, adopt: bool):
    base, _, target = kind.partition("-")
    prefetch = {"": None, "none": None, "device": 0, "host": "host"}[target]
    loc = asyncmr.Location.host() if base == "pinned" else asyncmr.Location.device(0)
    if adopt:
        atype = "managed" if base == "managed" else base
        pool = asyncmr.MemPool.create(loc, atype)
    else:
        pool = "new"
    if base == "device":
        return asyncmr.AsyncDeviceMR(pool=pool, cache=cache)
    if base == "pinned":
        return asyncmr.AsyncPinnedMR(pool=pool, cache=cache)
    return asyncmr.AsyncManagedMR(pool=pool, cache=cache, prefetch=prefetch)


def run(rounds: int, *, kinds=KINDS, adopt: bool = False, seed: int = 0,
        others: bool = True) -> dict:
    """The workload; returns what it counted. Raises on a failed check (a crash ends it).
    ``others``: RMM's current resource and CuPy's allocator in use, a CuPy array and an
    ``rmm.DeviceBuffer`` held throughout."""
    import rmm
    from cuda.bindings import runtime
    from rmm.pylibrmm.stream import LEGACY_DEFAULT_STREAM, PER_THREAD_DEFAULT_STREAM, Stream

    import asyncmr
    from asyncmr._core import _parked_pools, _spare_pools

    rng = random.Random(seed)
    held_array = held_buffer = None
    if others:
        import cupy

        rmm.mr.get_current_device_resource()
        cupy.cuda.get_allocator()
        held_array = cupy.arange(1 << 16, dtype=cupy.float32)
        held_buffer = rmm.DeviceBuffer(size=1 << 16)
    legacy, per_thread, long_lived = LEGACY_DEFAULT_STREAM, PER_THREAD_DEFAULT_STREAM, Stream()
    counts = {"resources": 0, "pairs": 0, "closed": 0, "prefetches": 0, "prefetches refused": 0}
    mr = None
    for r in range(rounds):
        for kind in kinds:
            cache = (64 << 20) if (r + len(kind)) % 2 == 0 else None
            mr = _make(asyncmr, kind, cache, adopt)  # the last round's resource dies here
            counts["resources"] += 1
            fresh = Stream()
            for stream in (legacy, per_thread, long_lived, fresh):
                for size in SIZES:
                    p = mr.allocate(size, stream)
                    if kind.startswith("managed") and rng.random() < 0.5:
                        try:
                            asyncmr.prefetch((p, size), rng.choice(("device", "host")), stream)
                            counts["prefetches"] += 1
                        except asyncmr.CUDAError:
                            # cudaErrorUnknown: the refusal that comes before the managed
                            # pools' retirement crash (docs/DRIVER_FACTS.md): counted, and a
                            # failure at the end.
                            counts["prefetches refused"] += 1
                    mr.deallocate(p, size, stream)
                    counts["pairs"] += 1
            del fresh  # destroyed with frees (or the cache's markers) still queued on it
            step = rng.randrange(6)
            if step == 0:
                mr.release_cache()
            elif step == 1:
                mr.pool.close()  # the resource now refuses to allocate; the pool is retired
                counts["closed"] += 1
            elif step == 2:
                gc.collect()
    del mr
    gc.collect()
    # The driver counts a queued free's bytes as reserved until a synchronization that covers
    # the free (docs/DRIVER_FACTS.md): the pools parked behind the last frees go at the first
    # sweep after it.
    runtime.cudaDeviceSynchronize()
    deadline = time.monotonic() + 2.0  # the sweeper's next look
    while _parked_pools() and time.monotonic() < deadline:
        time.sleep(0.01)
    counts["parked"] = _parked_pools()
    # Managed pools are kept, never destroyed, and serve later pools of their kind: a bounded
    # number of driver pools, not one per round.
    counts["spares"] = _spare_pools()
    if others:  # the other libraries' memory is intact
        assert float(held_array[-1]) == float((1 << 16) - 1)
        assert held_buffer.size == 1 << 16
    return counts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rounds", type=int)
    p.add_argument("--adopt", action="store_true")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--alone", action="store_true", help="without CuPy and RMM's resources")
    a = p.parse_args(argv)
    counts = run(a.rounds, kinds=tuple(a.kinds.split(",")), adopt=a.adopt, seed=a.seed,
                 others=not a.alone)
    print("retire workload:", " ".join(f"{k.replace(' ', '_')}={v}" for k, v in counts.items()),
          flush=True)
    return 0 if counts["parked"] == 0 and counts["prefetches refused"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
