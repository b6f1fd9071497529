# SPDX-License-Identifier: Apache-2.0
"""Retiring owned pools: created, used and dropped many times in a process that uses RMM and
CuPy too, never taking it down; closed pools give back what caches hold of them; a parked pool
is destroyed once it holds nothing, with no other asyncmr call after its last free."""

import gc
import os
import subprocess
import sys
import time

import pytest

import reliability_helpers as h
import retire_workload
from asyncmr import AsyncDeviceMR, AsyncManagedMR, AsyncPinnedMR, Location, MemPool
from asyncmr._core import _parked_pools

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
#: Rounds of the workload: every kind, both cache settings, four streams, three sizes a round.
ROUNDS = int(os.environ.get("ASYNCMR_RETIRE_ROUNDS", "0") or 0) or (20 if h.UNDER_SANITIZER else 100)


def _settle_parked(limit_s: float = 2.0) -> int:
    deadline = time.monotonic() + limit_s
    while _parked_pools() and time.monotonic() < deadline:
        time.sleep(0.01)
    return _parked_pools()


# ---- owned pools created and dropped many times -----------------------------------------------

#: Exit statuses of the workload in fresh interpreters (the tests below, in file order): the
#: in-process run is made only once they show no crash, which would end the whole pytest run.
_CHILD_EXITS: dict[str, int] = {}


@pytest.mark.parametrize("adopt", [False, True], ids=["new", "adopted"])
def test_owned_pools_retire_in_a_plain_interpreter(cp, adopt):
    """The workload in a fresh interpreter (a crash is an exit status here)."""
    args = [sys.executable, "-X", "faulthandler", os.path.join(HERE, "retire_workload.py"),
            str(ROUNDS), "--seed", "2"]
    if adopt:
        args.append("--adopt")
    run = subprocess.run(args, capture_output=True, text=True, timeout=600)
    _CHILD_EXITS["adopted" if adopt else "new"] = run.returncode
    assert run.returncode == 0, (
        f"exit {run.returncode}\n--- stdout\n{run.stdout[-3000:]}\n--- stderr\n{run.stderr[-3000:]}")
    assert "parked=0" in run.stdout, run.stdout
    assert "prefetches_refused=0" in run.stdout, run.stdout


#: A managed pool per round, prefetched on a stream created for the round and dropped before
#: it, so that each pool's frees and prefetches are still queued when the stream is destroyed;
#: the next round's pool is made (which sweeps the parked ones) while the 32 MiB migration can
#: still be under way.
_PREFETCH_WHILE_RETIRING = """
import sys
import asyncmr
from rmm.pylibrmm.stream import Stream
refused = 0
for i in range(int(sys.argv[1])):
    mr = asyncmr.AsyncManagedMR(pool="new")
    s = Stream()
    for n in (4096, 64 << 10, 32 << 20):
        p = mr.allocate(n, s)
        try:
            asyncmr.prefetch((p, n), ("device", "host")[i % 2], s)
        except asyncmr.CUDAError:
            refused += 1
        mr.deallocate(p, n, s)
    del mr, s
print("prefetches refused:", refused)
"""


@pytest.mark.parametrize("run_index", range(3))
def test_managed_pools_retire_while_the_main_thread_prefetches(cp, run_index):
    """Managed pools whose memory was prefetched on a stream destroyed with that work queued:
    the driver's counters say such a pool holds nothing while the migration still runs, and
    destroying it then makes later prefetches fail with cudaErrorUnknown and crashes the driver
    (SIGSEGV in cuMemPoolDestroy: docs/DRIVER_FACTS.md). Three fresh interpreters."""
    run = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _PREFETCH_WHILE_RETIRING,
                          str(ROUNDS)], capture_output=True, text=True, timeout=300)
    _CHILD_EXITS[f"prefetching {run_index}"] = run.returncode
    assert run.returncode == 0, (
        f"exit {run.returncode}\n--- stdout\n{run.stdout[-2000:]}\n--- stderr\n{run.stderr[-3000:]}")
    assert "prefetches refused: 0" in run.stdout, run.stdout


def test_owned_pools_of_every_kind_retire_under_rmm_and_cupy(cp):
    """The stress test in this process: RMM's current resource and CuPy's allocator in use, a
    CuPy array and an rmm.DeviceBuffer held throughout."""
    crashed = {k: v for k, v in _CHILD_EXITS.items() if v < 0}
    if crashed:
        pytest.fail(f"the workload died in a fresh interpreter ({crashed}); not run in this "
                    "process, where a crash would end the whole run", pytrace=False)
    from asyncmr._core import _spare_pools
    spares_before = _spare_pools()
    counts = retire_workload.run(ROUNDS, seed=1)
    h.record("retire", f"{counts['resources']} owned pools retired in process, "
             f"{counts['pairs']} pairs, {counts['closed']} closed, {counts['prefetches']} prefetches")
    assert counts["parked"] == 0, f"pools still parked at the end: {counts}"
    # At most 64 unsettled spares of a kind (src/pool_registry.cpp); the workload's managed
    # pools are all of one kind.
    assert counts["spares"] - spares_before <= 66, (
        f"closed managed pools were not reused: {counts}")
    assert counts["prefetches refused"] == 0, counts
    h.assert_context_works(AsyncDeviceMR(pool="new"))


# ---- a closed pool gives back its cached blocks ------------------------------------------------

def _created(kind):
    loc = Location.host() if kind == "pinned" else Location.device(0)
    return MemPool.create(loc, kind)


def _resource(kind, pool, **kw):
    return {"device": AsyncDeviceMR, "managed": AsyncManagedMR, "pinned": AsyncPinnedMR}[kind](
        pool=pool, **kw)


@pytest.mark.parametrize("kind", ["device", "managed", "pinned"])
def test_closing_a_pool_gives_back_what_its_cache_holds(cp, kind):
    from rmm.pylibrmm.stream import Stream

    gc.collect()
    before = _settle_parked()
    pool = _created(kind)
    mr = _resource(kind, pool, cache=64 * MiB)
    s = Stream()
    blocks = [mr.allocate(MiB, s) for _ in range(33)]
    for b in blocks:
        mr.deallocate(b, MiB, s)
    assert mr.cache_info["blocks"] == 33, mr.cache_info
    pool.close()
    # Nothing of it stays parked behind the cached blocks: destroyed at close (a managed one is
    # kept as a spare instead).
    assert _parked_pools() == before, "the closed pool stays parked behind its cached blocks"
    assert mr.cache_info["blocks"] == 0, mr.cache_info
    s.synchronize()


def test_a_parked_pool_goes_once_its_last_block_is_freed(cp):
    """Parked at close because a block is live; once that block's free has run, the pool's
    memory comes back within a moment, with no asyncmr call in between."""
    from rmm.pylibrmm.stream import Stream

    if h.UNDER_SANITIZER:
        h.not_applicable("memcheck holds freed blocks back, so the pool does not empty")
    size = 256 * MiB
    gc.collect()
    pool = MemPool.create(Location.device(0), "device")
    mr = AsyncDeviceMR(pool=pool)
    s = Stream()
    cp.cuda.runtime.deviceSynchronize()
    free_before = cp.cuda.runtime.memGetInfo()[0]
    p = mr.allocate(size, s)
    s.synchronize()
    pool.close()  # parked: the block is live
    mr.deallocate(p, size, s)
    s.synchronize()  # the free has run; from here on nothing calls asyncmr
    deadline = time.monotonic() + 2.0
    free_now = cp.cuda.runtime.memGetInfo()[0]
    while free_now < free_before - 64 * MiB and time.monotonic() < deadline:
        time.sleep(0.01)
        free_now = cp.cuda.runtime.memGetInfo()[0]
    assert free_now >= free_before - 64 * MiB, (
        f"the parked pool kept {(free_before - free_now) / MiB:.0f} MiB 2 s after its last free")
