# SPDX-License-Identifier: Apache-2.0
"""The front cache and the pools are sound: no block ever has two owners, no call waits on the
device holding the GIL, dead streams do not starve live ones, and a cache is never the reason an
allocation fails. One test per defect of the soundness issue; each was run first on the code
before the fix (the closing note says which failed there)."""

import os
import threading
import time

import numpy as np
import pytest
from rmm.pylibrmm.stream import Stream

import asyncmr
from asyncmr import AsyncDeviceMR, AsyncManagedMR, AsyncPinnedMR, Location, MemPool

from gpu_helpers import create_context, describe, device_view, require_module, run_python, sync

KiB, MiB = 1 << 10, 1 << 20
MAKERS = {"pinned": AsyncPinnedMR, "device": AsyncDeviceMR, "managed": AsyncManagedMR}


def make(kind, cap=64 * MiB, **kwargs):
    return MAKERS[kind](pool="new", cache=cap, **kwargs)


SPIN = r'''extern "C" __global__ void spin(long long cycles)
    { long long t = clock64(); while (clock64() - t < cycles) {} }'''


def spin_on(cupy, stream, cycles=1_000_000_000):
    """Queues ~0.5 s of one spinning thread on ``stream`` (a CuPy stream)."""
    with stream:
        cupy.RawKernel(SPIN, "spin")((1,), (1,), (cupy.int64(cycles),))


# ---- 1. a graph's allocation never enters the cache -----------------------------------------------

@pytest.mark.parametrize("kind", ["device", "managed"])
def test_a_graph_allocation_freed_outside_its_graph_never_enters_the_cache(gpu, kind):
    cupy = require_module("cupy")
    mr = make(kind)
    s = cupy.cuda.Stream(non_blocking=True)
    rs = Stream(obj=s)
    with s:
        s.begin_capture(cupy.cuda.runtime.streamCaptureModeThreadLocal)
        g = mr.allocate(MiB, rs)  # a graph allocation node: the graph owns this address
        cupy.cuda.runtime.memsetAsync(g, 7, MiB, s.ptr)
        graph = s.end_capture()
    for _ in range(3):
        graph.launch(s)
        mr.deallocate(g, MiB, rs)  # freed outside the graph, after each launch
        assert mr.cache_info["blocks"] == 0, f"the graph's block was cached: {mr.cache_info}"
    p = mr.allocate(MiB, rs)
    assert p != g, "an ordinary allocation got the graph's address: two owners"
    mr.deallocate(p, MiB, rs)
    s.synchronize()
    del graph


@pytest.mark.parametrize("kind", ["device", "managed"])
def test_a_second_free_of_a_cached_block_inside_a_capture_is_refused(gpu, kind):
    # A free on a capturing stream becomes a free node of the graph. Made of a block the cache
    # holds (a user's double free), it would free that block to the pool at every launch while
    # the cache still hands it out: the record is asked before the driver, as outside a capture.
    # A cached block is a double free whatever size it names; a handed-out block named with
    # another class is a wrong size. Neither reaches the driver, so the capture stays valid.
    cupy = require_module("cupy")
    mr = make(kind)
    s = cupy.cuda.Stream(non_blocking=True)
    rs = Stream(obj=s)
    p = mr.allocate(MiB, rs)
    mr.deallocate(p, MiB, rs)
    q = mr.allocate(64 * KiB, rs)  # handed out (a miss: p stays cached at its own class)
    assert mr.cache_info["blocks"] == 1
    with s:
        s.begin_capture(cupy.cuda.runtime.streamCaptureModeThreadLocal)
        try:
            with pytest.raises(ValueError, match="double free"):
                mr.deallocate(p, MiB, rs)
            with pytest.raises(ValueError, match="double free"):
                mr.deallocate(p, 256, rs)
            with pytest.raises(ValueError, match="another size class"):
                mr.deallocate(q, 256, rs)
        finally:
            graph = s.end_capture()  # raises if the capture was invalidated
    graph.launch(s)
    s.synchronize()
    assert mr.cache_info["blocks"] == 1, mr.cache_info
    r = mr.allocate(MiB, rs)
    t = mr.allocate(MiB, rs)  # a miss: the pool's
    assert r == p and t != p, "the pool handed the cached block out again: two owners"
    for block, n in ((r, MiB), (t, MiB), (q, 64 * KiB)):
        mr.deallocate(block, n, rs)
    s.synchronize()
    del graph


@pytest.mark.parametrize("cap", [0, 64 * MiB], ids=["uncached", "cached"])
@pytest.mark.parametrize("kind", ["device", "managed", "pinned"])
def test_a_pool_serves_a_thread_while_another_thread_captures_in_global_mode(gpu, kind, cap):
    # PyTorch captures in global mode (torch.cuda.graph's default). Another thread's allocations
    # and frees on its own, uncaptured stream go on meanwhile: served, and the capture left valid.
    # A new pool grows for the first allocation. (In the thread's default mode the driver
    # refuses it, cudaErrorStreamCaptureUnsupported, every kind, cached or not; every pool call
    # runs in relaxed capture mode: docs/DRIVER_FACTS.md.)
    cupy = require_module("cupy")
    from gpu_helpers import captured_elsewhere

    mr = MAKERS[kind](pool="new", cache=cap) if cap else MAKERS[kind](pool="new")
    cs = cupy.cuda.Stream(non_blocking=True)
    rs = Stream(obj=cs)
    sizes = (4 * KiB, MiB, 8 * MiB)
    with captured_elsewhere(cupy, "global") as outcome:
        ptrs = [mr.allocate(size, rs) for size in sizes]
        with cs:
            for size, p in zip(sizes, ptrs):
                device_view(p, size // 4).fill(7)
        for size, p in zip(sizes, ptrs):
            mr.deallocate(p, size, rs)
        mr.trim_to(0)  # the cache's blocks too
    assert outcome["capture"] == "valid", outcome
    cs.synchronize()


def test_a_block_the_driver_will_not_free_inside_a_capture_stays_the_callers(gpu):
    # The driver refuses a free node for a pool block allocated outside the graph (cudaFreeAsync
    # on a capturing stream: cudaErrorInvalidValue, docs/DRIVER_FACTS.md). The record lets the block go only for the driver's free, so on refusal it is
    # still the cache's handed-out block, and its free after the capture is cached as usual.
    cupy = require_module("cupy")
    mr = make("device")
    s = cupy.cuda.Stream(non_blocking=True)
    rs = Stream(obj=s)
    p = mr.allocate(MiB, rs)
    with s:
        s.begin_capture(cupy.cuda.runtime.streamCaptureModeThreadLocal)
        try:
            with pytest.raises(asyncmr.CUDAError, match="cudaErrorInvalidValue"):
                mr.deallocate(p, MiB, rs)
        finally:
            try:
                s.end_capture()
            except Exception:  # noqa: BLE001 - the refused call may have invalidated it
                pass
    assert mr.cache_info["recorded_blocks"] == 1, mr.cache_info
    mr.deallocate(p, MiB, rs)
    assert mr.cache_info["blocks"] == 1, "its free outside the capture is cached"
    s.synchronize()


# ---- 2. a foreign pointer is refused, never handed out ---------------------------------------------

@pytest.mark.parametrize("kind", ["device", "pinned"])
def test_a_pointer_of_another_pool_is_refused_and_never_handed_out(gpu, kind):
    mr = make(kind)
    other = MAKERS[kind](pool="new")
    s = Stream()
    p = other.allocate(64 * KiB, s)
    with pytest.raises(ValueError, match="not allocated by this resource|another pool"):
        mr.deallocate(p, 64 * KiB, s)
    assert mr.cache_info["blocks"] == 0
    q = mr.allocate(64 * KiB, s)
    assert q != p, "the foreign block was handed out"
    mr.deallocate(q, 64 * KiB, s)
    other.deallocate(p, 64 * KiB, s)  # still the other resource's: its free works
    s.synchronize()
    assert other.attributes.used_mem_current == 0


# ---- 3. dead streams do not starve live ones --------------------------------------------------------

def test_blocks_of_destroyed_streams_do_not_starve_a_live_stream(gpu):
    mr = make("pinned", cap=8 * MiB)
    for _ in range(2000):
        s = Stream()
        a, b = mr.allocate(4 * KiB, s), mr.allocate(4 * KiB, s)
        mr.deallocate(a, 4 * KiB, s)
        mr.deallocate(b, 4 * KiB, s)
        del s  # destroyed with two blocks cached for it
    live = Stream()
    # The refused frees ask the background reclaimer for the dead streams' blocks; it gives them
    # back in its release stream's order, so hits resume within a moment, not at once.
    deadline = time.monotonic() + 10
    while mr.cache_info["reclaims"] == 0 or mr.cache_info["bytes"] >= mr.cache_info["cap"] - 8 * KiB:
        p = mr.allocate(4 * KiB, live)
        mr.deallocate(p, 4 * KiB, live)
        assert time.monotonic() < deadline, f"no reclaim within 10 s: {mr.cache_info}"
        time.sleep(0.001)
    before = mr.cache_info["hits"]
    for _ in range(100):
        p = mr.allocate(4 * KiB, live)
        mr.deallocate(p, 4 * KiB, live)
    info = mr.cache_info
    assert info["hits"] - before >= 98, f"the live stream starved: {info}"
    assert info["bytes"] <= info["cap"]
    assert info["reclaimed_blocks"] >= 1000, info
    live.synchronize()


def test_a_live_stream_keeps_its_blocks_while_another_stream_fills_the_cap(gpu):
    # Stream a caches four blocks and waits (its kernel, say); stream b then frees more than the
    # cap holds, one free at a time, each refusal asking for a reclaim. Only a stream idle far
    # longer than this (asyncmr waits 100 ms) may lose its blocks: here a was idle ~30 ms.
    mr, a, b = make("device", cap=1 * MiB), Stream(), Stream()
    pa = [mr.allocate(64 * KiB, a) for _ in range(4)]
    pb = [mr.allocate(64 * KiB, b) for _ in range(40)]
    t0 = time.monotonic()
    for p in pa:
        mr.deallocate(p, 64 * KiB, a)
    for p in pb:
        mr.deallocate(p, 64 * KiB, b)
        time.sleep(0.0003)  # lets the background reclaimer answer each request in turn
    time.sleep(0.02)
    idle = time.monotonic() - t0
    info = mr.cache_info
    assert info["refused_cap"] >= 24, info  # b's frees pressed on the cap
    hits = info["hits"]
    again = [mr.allocate(64 * KiB, a) for _ in range(4)]
    info = mr.cache_info
    assert info["hits"] - hits == 4, f"stream a lost its blocks after {idle * 1e3:.0f} ms idle: {info}"
    assert info["reclaims"] == 0, info
    for p in again:
        mr.deallocate(p, 64 * KiB, a)
    a.synchronize()
    b.synchronize()


# ---- 4 and 8. no wait on the device while holding the GIL --------------------------------------------

# A Python host function waits on the stream behind a one-second kernel; then ACTION runs. If
# ACTION waits for the device holding the GIL, the host function can never run: a deadlock.
GIL_CHILD = r"""
import sys, cupy, asyncmr
from asyncmr import Location, MemPool
from rmm.pylibrmm.stream import Stream
spin = cupy.RawKernel(r'''extern "C" __global__ void spin(long long cycles)
{ long long t = clock64(); while (clock64() - t < cycles) {} }''', "spin")
action = sys.argv[1]
s = cupy.cuda.Stream.null  # the legacy stream: every device-wide wait includes it
rs = Stream(obj=s)
mr = asyncmr.AsyncDeviceMR(pool="new", cache=64 << 20)
p = mr.allocate(4096, rs)
mr.deallocate(p, 4096, rs)  # the cache holds a block
pinned = MemPool.create(Location.host(), "pinned")
owned = MemPool.create(Location.device(0), "device")
held = asyncmr.AsyncDeviceMR(pool=owned)
q = held.allocate(4096, rs)
cupy.cuda.runtime.deviceSynchronize()
ran = []
with s:
    spin((1,), (1,), (cupy.int64(2_000_000_000),))  # about a second
s.launch_host_func(lambda _: ran.append(1), None)
if action == "drop":
    del mr
elif action == "release_cache":
    mr.release_cache()
elif action == "trim_to":
    mr.trim_to(0)
elif action == "pool_trim_to":
    owned.trim_to(0)
elif action == "set_access":
    pinned.set_access(0, "rw")
elif action == "close":
    owned.close()  # a live block: trimmed and parked
s.synchronize()
print("OK", ran, flush=True)
"""


@pytest.mark.parametrize("action", ["drop", "release_cache", "trim_to", "pool_trim_to",
                                    "set_access", "close"])
def test_no_call_waits_on_the_device_holding_the_gil(gpu, action):
    require_module("cupy")
    try:
        proc = run_python(GIL_CHILD, action, timeout=60)
    except Exception as e:  # subprocess.TimeoutExpired: the child hung
        pytest.fail(f"{action}: the child hung (a device-wide wait with the GIL held): {e}")
    assert proc.returncode == 0 and "OK [1]" in proc.stdout, describe(proc)


# ---- 5. release_cache never frees a block under a kernel --------------------------------------------

def test_a_block_freed_while_release_cache_waits_is_not_freed_under_its_kernel(gpu):
    cupy = require_module("cupy")
    import reliability_helpers as rh

    rh.warm_up_kernels()
    n = 64 * KiB
    mr = make("device")
    other = AsyncDeviceMR(pool=mr.pool)  # uncached, same pool: gets what the pool gives back
    S, T, U = (cupy.cuda.Stream(non_blocking=True) for _ in range(3))
    rS, rT = Stream(obj=S), Stream(obj=T)
    y = [mr.allocate(n, rS) for _ in range(2)]
    for p in y:
        mr.deallocate(p, n, rS)  # two blocks cached for S
    S.synchronize()
    gate = threading.Event()
    U.launch_host_func(lambda _: gate.wait(30), None)  # holds release_cache's device wait
    releaser = threading.Thread(target=mr.release_cache)
    releaser.start()
    time.sleep(0.3)  # release_cache is waiting for the device now
    x = mr.allocate(n, rS)
    spin_on(cupy, S)  # ~0.5 s, then the pattern A
    rh.fill(x, n, 0xA, S)
    mr.deallocate(x, n, rS)  # freed on S while release_cache waits
    gate.set()
    releaser.join(60)
    assert not releaser.is_alive()
    taken = [other.allocate(n, rT) for _ in range(4)]
    for q in taken:
        rh.fill(q, n, 0xB, T)
    sync()
    bad = cupy.zeros(1, dtype=cupy.uint64)
    for q in taken:
        rh.check(q, n, 0xB, bad, cupy.cuda.Stream.null)
    sync()
    wrong = int(bad.get()[0])
    assert x not in taken or wrong == 0, "the block was freed while its kernel ran"
    assert wrong == 0, f"{wrong} words of another stream's blocks were overwritten"
    for q in taken:
        other.deallocate(q, n, rT)
    sync()


@pytest.mark.parametrize("action", ["release_cache", "trim_to"])
def test_giving_the_cache_back_waits_for_blocks_the_reclaimer_sent_back_before_it(gpu, action):
    # The background reclaimer takes an idle stream's block back in the release stream's order,
    # behind that stream's work (here a host function held by a gate), and returns at once. A
    # release_cache() or trim_to() after it finds nothing left to take, but must still wait
    # for that queued free: the memory is the pool's when they return (rule 3).
    cupy = require_module("cupy")
    mr = make("device", cap=1 * MiB)
    A = cupy.cuda.Stream(non_blocking=True)
    a, b = Stream(obj=A), Stream()
    p = mr.allocate(64 * KiB, a)
    gate = threading.Event()
    A.launch_host_func(lambda _: gate.wait(30), None)
    mr.deallocate(p, 64 * KiB, a)  # cached for a, its order behind the gate
    deadline = time.monotonic() + 10
    while mr.cache_info["reclaims"] == 0:  # b's refused frees ask for a's idle bucket
        assert time.monotonic() < deadline, f"no reclaim within 10 s: {mr.cache_info}"
        pressing = [mr.allocate(64 * KiB, b) for _ in range(24)]  # 1.5 MiB against the cap
        for q in pressing:
            mr.deallocate(q, 64 * KiB, b)
        time.sleep(0.05)
    # b's cached blocks are taken out (hits), so the cache holds nothing: the only block on its
    # way back to the pool is a's, queued by the reclaimer.
    held = [mr.allocate(64 * KiB, b) for _ in range(mr.cache_info["blocks"])]
    assert mr.cache_info["blocks"] == 0, mr.cache_info
    b.synchronize()
    opened = threading.Timer(0.5, gate.set)
    opened.start()
    try:
        mr.release_cache() if action == "release_cache" else mr.trim_to(0)
        assert gate.is_set(), f"{action} returned while a block it gives back was still queued"
    finally:
        opened.join()
    A.synchronize()
    for q in held:
        mr.deallocate(q, 64 * KiB, b)
    b.synchronize()


# ---- 6. a block the cache did not hand out, or a wrong size, never overruns ----------------------------

def test_an_exact_size_block_of_an_uncached_sibling_is_not_cached(gpu):
    pool = MemPool.create(Location.device(0), "device")
    plain = AsyncDeviceMR(pool=pool)
    cached = AsyncDeviceMR(pool=pool, cache=64 * MiB)
    s = Stream()
    x = plain.allocate(900_000, s)  # exactly 900,000 bytes: not a size class
    cached.deallocate(x, 900_000, s)
    assert cached.cache_info["blocks"] == 0, "a 900 kB block was filed under the 1 MiB class"
    p = cached.allocate(MiB, s)
    assert cached.cache_info["hits"] == 0
    cached.deallocate(p, MiB, s)
    s.synchronize()


def test_a_wrong_size_on_free_is_refused_and_the_block_stays_valid(gpu):
    mr = make("device")
    s = Stream()
    p = mr.allocate(256, s)
    with pytest.raises(ValueError, match="256"):
        mr.deallocate(p, MiB, s)  # a 256-byte block freed as 1 MiB
    q = mr.allocate(MiB, s)
    assert q != p, "a 256-byte block served a 1 MiB request"
    mr.deallocate(q, MiB, s)
    mr.deallocate(p, 256, s)  # the right size still frees it
    assert mr.cache_info["blocks"] == 2
    s.synchronize()


# ---- 7. no primary context on GPUs the process never used ----------------------------------------------

# What a child prints last: which devices have an active primary context.
PRIMARY_CONTEXTS = r"""
from cuda.bindings import driver as cu
cu.cuInit(0)
for d in range(asyncmr.device_count()):
    err, dev = cu.cuDeviceGet(d)
    err, flags, active = cu.cuDevicePrimaryCtxGetState(dev)
    print(f"device {d}: active {int(active)}", flush=True)
"""

CONTEXT_CHILD = r"""
import asyncmr
from rmm.pylibrmm.stream import Stream
mr = asyncmr.AsyncDeviceMR(0, pool="new", cache=64 << 20)
pinned = asyncmr.AsyncPinnedMR(pool="new", cache=64 << 20, accessible_from=[0])
s = Stream()
for r in (mr, pinned):
    p = r.allocate(4096, s); r.deallocate(p, 4096, s)
mr.release_cache(); pinned.release_cache()
for r in (mr, pinned):
    p = r.allocate(4096, s); r.deallocate(p, 4096, s)
mr.trim_to(0); pinned.trim_to(0)
for r in (mr, pinned):
    p = r.allocate(4096, s); r.deallocate(p, 4096, s)
del mr, pinned
""" + PRIMARY_CONTEXTS


def test_a_process_using_gpu_0_makes_no_context_on_gpu_1(two_gpus):
    proc = run_python(CONTEXT_CHILD, timeout=120)
    assert proc.returncode == 0, describe(proc)
    assert "device 0: active 1" in proc.stdout, describe(proc)
    assert "device 1: active 0" in proc.stdout, describe(proc)


# The mirror: a process using only GPU 1 (a Dask worker's view), whose cache's background
# reclaimer (a thread with no current context) takes an idle stream's blocks back.
RECLAIM_CHILD = r"""
import time
import asyncmr
from cuda.bindings import runtime as rt
from rmm.pylibrmm.stream import Stream
rt.cudaSetDevice(1)
mr = asyncmr.AsyncDeviceMR(1, pool="new", cache=1 << 20)
idle, busy = Stream(), Stream()
p = mr.allocate(64 << 10, idle); mr.deallocate(p, 64 << 10, idle)
deadline = time.monotonic() + 10
while mr.cache_info["reclaims"] == 0 and time.monotonic() < deadline:
    blocks = [mr.allocate(64 << 10, busy) for _ in range(24)]
    for q in blocks:
        mr.deallocate(q, 64 << 10, busy)
    time.sleep(0.05)
print("reclaims", mr.cache_info["reclaims"], flush=True)
mr.release_cache(); mr.trim_to(0)
busy.synchronize()
del mr
""" + PRIMARY_CONTEXTS


def test_a_process_using_gpu_1_makes_no_context_on_gpu_0_when_its_cache_reclaims(two_gpus):
    proc = run_python(RECLAIM_CHILD, timeout=120)
    assert proc.returncode == 0, describe(proc)
    assert "reclaims 0" not in proc.stdout, describe(proc)
    assert "device 1: active 1" in proc.stdout, describe(proc)
    assert "device 0: active 0" in proc.stdout, describe(proc)


# A resource on GPU 1 with a reservation, made by a process that never chose a device: the
# reservation's stream is made in GPU 1's context, and no context is made on GPU 0 (a
# cudaSetDevice round trip "back" to the current device, 0 by default, made one).
RESERVE_CHILD = r"""
import asyncmr
mr = asyncmr.AsyncDeviceMR(1, pool="new", reserve=1 << 20, release_threshold=64 << 20)
print("reserved", mr.attributes.reserved_mem_current >= 1 << 20, flush=True)
del mr
""" + PRIMARY_CONTEXTS


def test_a_reservation_on_gpu_1_makes_no_context_on_gpu_0(two_gpus):
    proc = run_python(RESERVE_CHILD, timeout=120)
    assert proc.returncode == 0, describe(proc)
    assert "reserved True" in proc.stdout, describe(proc)
    assert "device 1: active 1" in proc.stdout, describe(proc)
    assert "device 0: active 0" in proc.stdout, describe(proc)


# A free into the cache from a thread that has no context (a Dask worker's, a callback's) on a
# stream of GPU 1 makes the stream's marker in GPU 1's context, and no context on GPU 0.
MARKER_CHILD = r"""
import threading
import asyncmr
from cuda.bindings import runtime as rt
from rmm.pylibrmm.stream import Stream
rt.cudaSetDevice(1)
mr = asyncmr.AsyncDeviceMR(1, pool="new", cache=1 << 20)
s = Stream()  # a new stream, of GPU 1
p = mr.allocate(64 << 10, s); s.synchronize()
def free():
    mr.deallocate(p, 64 << 10, s)
t = threading.Thread(target=free); t.start(); t.join()
info = mr.cache_info
print("cached", info["blocks"], "unmarked", info["refused_unmarked"], flush=True)
mr.release_cache(); mr.trim_to(0)
del mr
""" + PRIMARY_CONTEXTS


def test_a_free_from_a_thread_without_a_context_marks_its_stream_in_the_streams_context(two_gpus):
    proc = run_python(MARKER_CHILD, timeout=120)
    assert proc.returncode == 0, describe(proc)
    assert "cached 1 unmarked 0" in proc.stdout, describe(proc)
    assert "device 1: active 1" in proc.stdout, describe(proc)
    assert "device 0: active 0" in proc.stdout, describe(proc)


def test_a_free_while_another_context_is_current_is_cached_and_leaves_that_context_current(gpu):
    # A user's own context (cuCtxCreate) current while a block of the primary context's stream
    # is freed: the stream's marker is made in the stream's context, and the thread's context is
    # untouched (it used to be made in the current one, which the stream refuses: the free went
    # to the pool, counted as refused_unmarked).
    cupy = require_module("cupy")
    from cuda.bindings import driver as cu
    mr = make("device")
    cs = cupy.cuda.Stream(non_blocking=True)  # the primary context's
    rs = Stream(obj=cs)
    p = mr.allocate(4 * KiB, rs)
    cs.synchronize()
    ctx = create_context(0)  # pushed: current on this thread now
    try:
        mr.deallocate(p, 4 * KiB, rs)
        err, current = cu.cuCtxGetCurrent()
        assert int(current) == int(ctx), "the free changed this thread's current context"
    finally:
        cu.cuCtxPopCurrent()
        cu.cuCtxDestroy(ctx)
    info = mr.cache_info
    assert info["blocks"] == 1 and info["refused_unmarked"] == 0, info
    assert mr.allocate(4 * KiB, rs) == p, "the stream's next allocation is the cached block"
    mr.deallocate(p, 4 * KiB, rs)
    cs.synchronize()


USER_CONTEXT_CHILD = r"""
import cupy, asyncmr
from cuda.bindings import driver as cu
from rmm.pylibrmm.stream import Stream
from gpu_helpers import create_context
mr = asyncmr.AsyncDeviceMR(0, pool="new", cache=64 << 20)
ctx = create_context(0)  # pushed: current on this thread
err, h = cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING.value)
assert err == cu.CUresult.CUDA_SUCCESS, err
s = Stream(obj=cupy.cuda.ExternalStream(int(h)))
for _ in range(3):  # the first refusal asks every device; the others remember the answer
    p = mr.allocate(4 << 10, s)
    mr.deallocate(p, 4 << 10, s)
    print("after the free: cached", mr.cache_info["blocks"], flush=True)
assert cu.cuStreamSynchronize(h)[0] == cu.CUresult.CUDA_SUCCESS
assert cu.cuStreamDestroy(h)[0] == cu.CUresult.CUDA_SUCCESS
cu.cuCtxPopCurrent()
assert cu.cuCtxDestroy(ctx)[0] == cu.CUresult.CUDA_SUCCESS
for _ in range(3):  # events made after the context went may take its events' addresses
    cupy.cuda.Event()
mr.release_cache()
info = mr.cache_info
print("released: cached", info["blocks"], "bytes", info["bytes"],
      "used", mr.pool.attributes.used_mem_current, flush=True)
q = mr.allocate(4 << 10)
mr.deallocate(q, 4 << 10)  # the primary context's legacy stream: cached as ever
print("primary: cached", mr.cache_info["blocks"], flush=True)
del mr
print("DONE", flush=True)
"""


def test_a_block_freed_on_a_stream_of_a_users_own_context_is_not_left_behind_when_it_goes(gpu):
    # A stream of a context the user made (cuCtxCreate) and destroys later: a marker made in that
    # context goes with it, and the release then waited on a destroyed event (or on whatever event
    # took its address). Such a free is refused by the cache and goes to the pool in the stream's
    # own order, so nothing is left to wait for once the context is gone.
    proc = run_python(USER_CONTEXT_CHILD, timeout=120)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.count("after the free: cached 0") == 3, describe(proc)
    assert "released: cached 0 bytes 0 used 0" in proc.stdout, describe(proc)
    assert "primary: cached 1" in proc.stdout, describe(proc)
    assert "DONE" in proc.stdout, describe(proc)


# ---- 9. the attribute table is indexed checked ------------------------------------------------------

ATTRIBUTE_CHILD = r"""
import asyncmr
from asyncmr import Location, MemPool
pool = MemPool.create(Location.device(0), "device")
for call in (lambda: pool._get_attribute(10**6), lambda: pool._set_attribute(10**6, 0),
             lambda: pool._get_attribute(len(asyncmr.attribute_table))):
    try:
        call()
    except ValueError as e:
        print("REFUSED", e, flush=True)
    else:
        print("ACCEPTED", flush=True)
"""


def test_an_attribute_index_outside_the_table_is_refused(gpu):
    proc = run_python(ATTRIBUTE_CHILD, timeout=120)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.count("REFUSED") == 3, describe(proc)


# ---- 12. a cache is never the reason an allocation fails ------------------------------------------------

def test_an_allocation_the_pool_cannot_serve_gets_the_cached_memory_back(gpu):
    pool = MemPool.create(Location.device(0), "device", max_size=64 * MiB)
    mr = AsyncDeviceMR(pool=pool, cache=64 * MiB)
    a, b = Stream(), Stream()
    blocks = [mr.allocate(MiB, a) for _ in range(48)]
    for p in blocks:
        mr.deallocate(p, MiB, a)  # 48 MiB cached for stream a
    assert mr.cache_info["bytes"] == 48 * MiB
    big = mr.allocate(24 * MiB, b)  # only fits once the cache gives its blocks back
    mr.deallocate(big, 24 * MiB, b)
    b.synchronize()
    with pytest.raises(MemoryError, match=r"reserved .* used .* cached"):
        mr.allocate(128 * MiB, b)  # cannot fit whatever the cache does
    assert mr.attributes.reserved_mem_current <= 64 * MiB
    sync()


def test_an_allocation_gets_memory_back_whose_frees_were_queued_before_it_ran_out(gpu):
    # A release that another thread began has taken the cached blocks out and queued their frees
    # behind their stream's kernel: the cache holds nothing, the pool still counts the memory as
    # used. An allocation that runs out of memory then must still wait for those frees and try
    # again, not say "nothing to give back" (a retry made only when blocks are still cached
    # would).
    cupy = require_module("cupy")
    spin_on(cupy, cupy.cuda.Stream.null, 1000)  # compiled and loaded before the timing matters
    sync()
    pool = MemPool.create(Location.device(0), "device", max_size=64 * MiB)
    # Otherwise the driver may serve the allocation from the queued frees' memory by making its
    # stream wait for them (and the test then passes on the code before the fix too).
    pool.attributes.reuse_allow_internal_dependencies = False
    mr = AsyncDeviceMR(pool=pool, cache=64 * MiB)
    a = cupy.cuda.Stream(non_blocking=True)
    ra, b = Stream(obj=a), Stream()
    blocks = [mr.allocate(MiB, ra) for _ in range(48)]
    spin_on(cupy, a)  # the blocks' last use
    for p in blocks:
        mr.deallocate(p, MiB, ra)
    releasing = threading.Thread(target=mr.release_cache)
    releasing.start()
    deadline = time.monotonic() + 10
    while mr.cache_info["blocks"] != 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    try:
        assert mr.cache_info["blocks"] == 0, mr.cache_info
        assert not a.done, "the kernel ended before the test could allocate: no window"
        big = mr.allocate(24 * MiB, b)  # fits once the queued frees have run
        mr.deallocate(big, 24 * MiB, b)
    finally:
        releasing.join(60)
    b.synchronize()


def test_a_closed_pools_uncached_block_is_freed_through_its_cached_resource(gpu):
    # close() parks a pool whose blocks are still out; their frees must still be taken, or the
    # pool stays parked for good. A block the cache never recorded (above its largest class) is
    # freed to the pool after the driver is asked whose it is, and the answer, the pool itself,
    # was compared with the closed pool's handle (null): "another pool's". A recorded block freed after close goes to the pool too, not into the cache.
    from asyncmr._core import _parked_pools
    before = _parked_pools()
    pool = MemPool.create(Location.device(0), "device")
    mr = AsyncDeviceMR(pool=pool, cache=64 * MiB)
    s = Stream()
    big = mr.allocate(2 * MiB, s)  # above the largest class: never recorded
    small = mr.allocate(4 * KiB, s)  # recorded
    pool.close()
    assert _parked_pools() == before + 1
    mr.deallocate(big, 2 * MiB, s)
    mr.deallocate(small, 4 * KiB, s)
    assert mr.cache_info["blocks"] == 0, mr.cache_info
    s.synchronize()
    deadline = time.monotonic() + 10
    while _parked_pools() != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _parked_pools() == before, "the closed pool stayed parked after its blocks were freed"


# ---- 13. giving cached blocks back never breaks another thread's capture -------------------------------

def give_back_while_capturing(cupy, holder, action, *, mode, non_blocking, whose):
    """While another thread captures on a new CuPy stream (``mode``; ``non_blocking``: its
    kind), gives the cache of ``holder[0]`` back by ``action`` ("release_cache", "trim_to", or
    "drop": the holder's reference, the only one, goes). Then asserts the capture survived,
    that the cache is empty (unless dropped), and that the graph runs."""
    buf = cupy.zeros(1024, dtype=cupy.uint32)
    cs = cupy.cuda.Stream(non_blocking=non_blocking)
    capturing, released = threading.Event(), threading.Event()
    outcome = {}

    def capture():
        try:
            with cs:
                cs.begin_capture(mode)
                buf.fill(1)
                capturing.set()
                released.wait(30)
                buf.fill(2)
                outcome["graph"] = cs.end_capture()
        except Exception as e:  # the capture was invalidated
            outcome["error"] = repr(e)
            capturing.set()

    t = threading.Thread(target=capture)
    t.start()
    assert capturing.wait(30)
    try:
        if action == "release_cache":
            holder[0].release_cache()
        elif action == "trim_to":
            holder[0].trim_to(0)
        else:
            holder.clear()
    finally:
        released.set()
        t.join(60)
    assert "error" not in outcome, f"{action} broke {whose}: {outcome['error']}"
    if action != "drop":
        info = holder[0].cache_info
        assert info["blocks"] == 0 and info["parked_blocks"] == 0, f"nothing went back: {info}"
    outcome["graph"].launch(cs)
    cs.synchronize()
    assert int(buf[0]) == 2


@pytest.mark.parametrize("mode", ["thread_local", "global"])
@pytest.mark.parametrize("action", ["release_cache", "trim_to", "drop"])
def test_giving_the_cache_back_leaves_another_threads_capture_valid(gpu, mode, action):
    # A device-wide synchronization refuses while any stream of the device captures, and
    # invalidates that capture whatever the modes; the cache must give its blocks back without one.
    cupy = require_module("cupy")
    modes = {"thread_local": cupy.cuda.runtime.streamCaptureModeThreadLocal,
             "global": cupy.cuda.runtime.streamCaptureModeGlobal}
    mr = make("device")
    own = Stream()
    blocks = [mr.allocate(4 * KiB, own) for _ in range(8)]
    for p in blocks:
        mr.deallocate(p, 4 * KiB, own)
    own.synchronize()
    assert mr.cache_info["blocks"] == 8
    holder = [mr]
    del mr  # the helper holds the only reference, so "drop" ends the resource
    give_back_while_capturing(cupy, holder, action, mode=modes[mode], non_blocking=True,
                              whose="the other thread's capture")


# ---- 14. a release waits for a block's last use whatever stream it ran on ------------------------

def test_a_free_queued_behind_another_streams_kernel_is_released_after_it(gpu):
    # The free's stream has nothing of its own running, only a wait for T's kernel (the block's
    # last use); the stream is destroyed with the wait still queued, and a release must still
    # wait for T (the put's marker, recorded on the stream, follows the wait).
    import gc

    cupy = require_module("cupy")
    spin_on(cupy, cupy.cuda.Stream.null, 1000)  # compiled and loaded before the timing matters
    sync()
    mr = make("device")
    s, t = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    rs = Stream(obj=s)
    x = mr.allocate(64 * KiB, rs)
    s.synchronize()
    spin_on(cupy, t)
    s.wait_event(t.record())
    mr.deallocate(x, 64 * KiB, rs)
    assert mr.cache_info["blocks"] == 1
    del rs, s
    gc.collect()
    mr.release_cache()
    assert t.done, "release_cache returned while the block's last use was still running"
    assert mr.cache_info["blocks"] == 0


def test_a_free_on_a_blocking_stream_is_released_after_the_legacy_streams_work(gpu):
    # A blocking stream's free is ordered after the legacy stream's earlier work, which the
    # stream's own queue does not show: the release must wait for it too.
    cupy = require_module("cupy")
    spin_on(cupy, cupy.cuda.Stream.null, 1000)
    sync()
    mr = make("device")
    s = cupy.cuda.Stream()  # blocking (CuPy's default)
    rs = Stream(obj=s)
    x = mr.allocate(64 * KiB, rs)
    s.synchronize()
    legacy = cupy.cuda.Stream.null
    spin_on(cupy, legacy)  # the block's last use, on the legacy stream
    mr.deallocate(x, 64 * KiB, rs)
    assert mr.cache_info["blocks"] == 1
    mr.release_cache()
    assert legacy.done, "release_cache returned while the legacy stream's use was still running"


@pytest.mark.parametrize("action", ["release_cache", "trim_to"])
def test_a_legacy_stream_free_of_a_block_a_blocking_stream_used_waits_for_that_use(gpu, action):
    # CUDA orders a free on the legacy stream after the earlier work of every blocking stream
    # (the legacy stream's implicit synchronization), so a block last used by a kernel on a
    # blocking stream may be freed on the legacy stream without any wait; its release from the
    # cache must still come after the kernel (a put on the legacy stream that set no marker
    # would order the release after the legacy stream's own work only).
    cupy = require_module("cupy")
    spin_on(cupy, cupy.cuda.Stream.null, 1000)  # compiled and loaded before the timing matters
    sync()
    mr = make("device")
    legacy = Stream(obj=cupy.cuda.Stream.null)
    x = mr.allocate(64 * KiB, legacy)
    sync()
    user = cupy.cuda.Stream()  # blocking (CuPy's default)
    spin_on(cupy, user)  # the block's last use, on a blocking stream
    mr.deallocate(x, 64 * KiB, legacy)
    assert mr.cache_info["blocks"] == 1
    getattr(mr, action)(*(() if action == "release_cache" else (0,)))
    assert user.done, f"{action} returned while the blocking stream's use was still running"


# ---- 15. the legacy stream's blocks: no query at the hit, a marker at every put ----------------

@pytest.mark.parametrize("kind", ["pinned", "device"])
def test_a_legacy_stream_block_is_released_only_after_the_legacy_streams_work(gpu, kind):
    # A put on the legacy stream sets its marker there, as on any stream; a release must wait for
    # the kernel that used the blocks.
    cupy = require_module("cupy")
    legacy = cupy.cuda.Stream.null
    spin_on(cupy, legacy, 1000)  # compiled and loaded before the timing matters
    sync()
    mr = make(kind)
    rs = Stream(obj=legacy)
    blocks = [mr.allocate(64 * KiB, rs) for _ in range(4)]
    legacy.synchronize()
    spin_on(cupy, legacy)  # the blocks' last use
    for p in blocks:
        mr.deallocate(p, 64 * KiB, rs)
    info = mr.cache_info
    assert info["blocks"] == 4 and info["refused_unmarked"] == 0, info
    mr.release_cache()
    assert legacy.done, "release_cache returned while the legacy stream's use was still running"
    info = mr.cache_info
    assert info["blocks"] == 0 and info["parked_blocks"] == 0, info
    # The blocks come back through the pool and the cache as usual.
    again = [mr.allocate(64 * KiB, rs) for _ in range(4)]
    for p in again:
        mr.deallocate(p, 64 * KiB, rs)
    assert mr.cache_info["blocks"] == 4


@pytest.mark.parametrize("action", ["release_cache", "trim_to", "drop"])
def test_giving_legacy_stream_blocks_back_leaves_a_blocking_streams_capture_valid(gpu, action):
    # Work queued on the legacy stream while a blocking stream captures breaks that capture
    # (docs/DRIVER_FACTS.md); taking the legacy stream's order for a release must not queue any.
    cupy = require_module("cupy")
    mr = make("device")
    legacy = Stream(obj=cupy.cuda.Stream.null)
    blocks = [mr.allocate(4 * KiB, legacy) for _ in range(8)]
    for p in blocks:
        mr.deallocate(p, 4 * KiB, legacy)
    sync()
    assert mr.cache_info["blocks"] == 8
    holder = [mr]
    del mr  # the helper holds the only reference, so "drop" ends the resource
    # blocking: the legacy stream would join it
    give_back_while_capturing(cupy, holder, action, mode=cupy.cuda.runtime.streamCaptureModeGlobal,
                              non_blocking=False, whose="the blocking stream's capture")


@pytest.mark.parametrize("mode", ["global", "thread_local"])
@pytest.mark.parametrize("kind", ["pinned", "device", "managed"])
def test_legacy_stream_hits_go_on_while_a_blocking_stream_captures_and_the_rest_is_refused_cleanly(
        gpu, kind, mode):
    # While a blocking stream captures, CUDA refuses any call on the legacy stream (it would join
    # the capture), and the capture does not survive that refusal. A block cached for the legacy
    # stream needs no call to be handed out, so hits are served. A miss, and a free (whose marker
    # must be recorded there: front_cache.hpp, "Markers"), are refused before any call is made,
    # naming the reason, and the capture stays valid; the refused free leaves the block the
    # caller's, to free once the capture has ended.
    cupy = require_module("cupy")
    from gpu_helpers import captured_elsewhere

    mr = make(kind)
    legacy = Stream(obj=cupy.cuda.Stream.null)
    blocks = [mr.allocate(4 * KiB, legacy) for _ in range(3)]
    for p in blocks:
        mr.deallocate(p, 4 * KiB, legacy)
    sync()
    before = mr.cache_info
    assert before["blocks"] == 3, before
    got, refused = [], []
    with captured_elsewhere(cupy, mode, non_blocking=False) as outcome:
        for what, call in (("hits", lambda: got.extend(mr.allocate(4 * KiB, legacy)
                                                       for _ in range(3))),
                           ("miss", lambda: mr.allocate(4 * KiB, legacy)),
                           ("uncached miss", lambda: mr.allocate(2 * MiB, legacy)),
                           ("free", lambda: mr.deallocate(got[0], 4 * KiB, legacy))):
            try:
                call()
            except Exception as e:  # noqa: BLE001 - asserted below, with the capture's outcome
                refused.append((what, e))
    assert outcome["capture"] == "valid", (outcome, refused)
    assert sorted(got) == sorted(blocks), (got, refused)
    assert [(what, type(e)) for what, e in refused] == [
        ("miss", asyncmr.UnsupportedError), ("uncached miss", asyncmr.UnsupportedError),
        ("free", asyncmr.CUDAError)], refused
    for _, e in refused:
        assert "cudaErrorStreamCaptureImplicit" in str(e) and "still valid" in str(e), e
    after = mr.cache_info
    assert after["hits"] == before["hits"] + 3 and after["blocks"] == 0, after
    for p in got:  # the refused free changed nothing: each block is freed once, now
        mr.deallocate(p, 4 * KiB, legacy)
    sync()
    assert mr.cache_info["blocks"] == 3
