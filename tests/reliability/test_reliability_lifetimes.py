# SPDX-License-Identifier: Apache-2.0
"""Lifetimes: memory outliving the Python objects that made it. A resource dropped while
rmm.DeviceBuffers and CuPy arrays still hold its memory; an owned pool closed with allocations
live; interpreter exit with allocations live; RMM's current device resource replaced while
buffers are live. No crash, no use after free, data intact, memory given back in the end.

The cases that could take the process down (a destroyed pool's memory still in use, exit) run
in a child process and are judged by its exit code and output.
"""

from __future__ import annotations

import gc
import weakref

import pytest

import asyncmr
from asyncmr import Location, MemPool

import reliability_helpers as h

pytestmark = pytest.mark.gpu

SIZES = (256, 4096, 1 << 20, 3 << 20)
SHARED = {"device": (Location.device(0), "device"), "managed": (Location.device(0), "managed"),
          "pinned": (Location.host(), "pinned")}


def fill_and_check(blocks, bad, cupy):
    """``blocks``: [(ptr, nbytes, seed)]; fills them all, then checks them all (null stream)."""
    null = cupy.cuda.Stream.null
    for ptr, nbytes, seed in blocks:
        h.fill(ptr, nbytes, seed, null)
    check_all(blocks, bad, cupy)


def check_all(blocks, bad, cupy):
    null = cupy.cuda.Stream.null
    for ptr, nbytes, seed in blocks:
        h.check(ptr, nbytes, seed, bad, null)
    cupy.cuda.runtime.deviceSynchronize()
    assert int(bad.get()[0]) == 0, f"{int(bad.get()[0])} words corrupted"


def arrays_hold_aranges(arrays, cupy) -> bool:
    # A plain loop that drops its references: under compute-sanitizer, CuPy keeps a traceback
    # that reaches this frame (seen with a generator expression here, which then held the
    # arrays, and with them the resource, past the end of the test).
    ok = True
    for i in range(len(arrays)):
        ok = ok and bool((arrays[i] == cupy.arange(arrays[i].size, dtype=arrays[i].dtype)).all())
    arrays = None
    return ok


@pytest.mark.parametrize("pool", ["default", "new"])
@pytest.mark.parametrize("kind", h.KINDS)
def test_resource_dropped_while_buffers_and_arrays_live(gpu, kernels, cp, kind, pool):
    import rmm
    from rmm.allocators.cupy import rmm_cupy_allocator

    shared = MemPool.default(*SHARED[kind])
    gc.collect()
    h.sync()
    used_before = shared.attributes.used_mem_current
    mr = h.make_resource(kind, pool)
    alive = weakref.ref(mr.pool)  # the resource owns this MemPool: it dies with the resource
    buffers = [rmm.DeviceBuffer(size=n, mr=mr) for n in SIZES]
    blocks = [(b.ptr, b.size, 100 + i) for i, b in enumerate(buffers)]
    arrays = []
    if kind != "pinned":
        # rmm_cupy_allocator lets CuPy ask the driver which device owns each pointer; pinned
        # host memory has none, so pinned blocks get CuPy views on device 0 instead (below).
        previous_mr = rmm.mr.get_current_device_resource()
        previous_alloc = cp.cuda.get_allocator()
        rmm.mr.set_current_device_resource(mr)
        cp.cuda.set_allocator(rmm_cupy_allocator)
        try:
            arrays = [cp.arange(n // 4, dtype=cp.uint32) for n in SIZES]
        finally:
            cp.cuda.set_allocator(previous_alloc)
            rmm.mr.set_current_device_resource(previous_mr)
    else:
        arrays = [h.device_view(b.ptr, b.size // 4, owner=b) for b in buffers[:2]]
        buffers = buffers[2:] + [None, None]  # the arrays alone keep the first two alive
    bad = cp.zeros(1, dtype=cp.uint64)
    fill_and_check(blocks, bad, cp)

    del mr
    gc.collect()
    assert alive() is not None, "the resource went away while its memory is in use"
    # Everything still readable and writable through the arrays and buffers.
    check_all(blocks, bad, cp)
    fill_and_check([(p, n, s + 1000) for p, n, s in blocks], bad, cp)
    if kind != "pinned":
        assert arrays_hold_aranges(arrays, cp)

    del arrays, buffers
    gc.collect()
    h.sync()
    assert alive() is None, ("the resource outlived every buffer that held it; held by:\n" +
                             h.holders(alive()))
    if not h.UNDER_SANITIZER:  # memcheck holds freed blocks back
        assert shared.attributes.used_mem_current == used_before, "memory not given back"
    h.assert_context_works(asyncmr.AsyncDeviceMR(pool="new"))


CLOSE_WITH_LIVE = r"""
import gc
import cupy, rmm
import asyncmr
import reliability_helpers as h
from rmm.allocators.cupy import rmm_cupy_allocator

kind = "@KIND@"
h.warm_up_kernels()
mr = h.make_resource(kind, "new")
pool = mr.pool
buffers = [rmm.DeviceBuffer(size=n, mr=mr) for n in (256, 4096, 1 << 20, 3 << 20)]
blocks = [(b.ptr, b.size, 7 + i) for i, b in enumerate(buffers)]
arrays = []
if kind != "pinned":
    rmm.mr.set_current_device_resource(mr)
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    arrays = [cupy.arange(1 << 16, dtype=cupy.uint32) for _ in range(3)]
    cupy.cuda.set_allocator(None)
    rmm.mr.set_current_device_resource(rmm.mr.CudaMemoryResource())
bad = cupy.zeros(1, dtype=cupy.uint64)
null = cupy.cuda.Stream.null
for p, n, s in blocks:
    h.fill(p, n, s, null)
cupy.cuda.runtime.deviceSynchronize()

pool.close()
assert pool.closed and mr.pool.closed
print("closed with", len(buffers) + len(arrays), "allocations live", flush=True)
# The memory stays valid: read it, write it again, read it again.
for p, n, s in blocks:
    h.check(p, n, s, bad, null)
for p, n, s in blocks:
    h.fill(p, n, s + 1, null)
    h.check(p, n, s + 1, bad, null)
for a in arrays:
    assert bool((a == cupy.arange(1 << 16, dtype=cupy.uint32)).all())
    a += 1
cupy.cuda.runtime.deviceSynchronize()
assert int(bad.get()[0]) == 0, "corrupted after close"
# New allocations are refused clearly.
try:
    mr.allocate(256)
except RuntimeError as e:
    assert "closed" in str(e), e
else:
    raise AssertionError("allocating from a closed pool succeeded")
# Freeing afterwards is fine.
del arrays, buffers
gc.collect()
cupy.cuda.runtime.deviceSynchronize()
del mr, pool
gc.collect()
h.assert_context_works(asyncmr.AsyncDeviceMR(pool="new"))
print("OK", flush=True)
"""


@pytest.mark.parametrize("kind", h.KINDS)
def test_owned_pool_closed_with_allocations_live(gpu, kind):
    proc = h.run_python(CLOSE_WITH_LIVE.replace("@KIND@", kind))
    assert proc.returncode == 0 and "OK" in proc.stdout, h.describe(proc)


EXIT_WITH_LIVE = r"""
import cupy, rmm
import asyncmr
import reliability_helpers as h
from asyncmr import Location, MemPool
from rmm.allocators.cupy import rmm_cupy_allocator

h.warm_up_kernels()
null = cupy.cuda.Stream.null
keep = []  # module globals: torn down by the interpreter at exit, in no particular order
raw = []   # pointers never freed at all
for kind in h.KINDS:
    for pool in h.POOL_CHOICES:
        mr = h.make_resource(kind, pool)
        for n in (256, 1 << 20):
            b = rmm.DeviceBuffer(size=n, mr=mr)
            h.fill(b.ptr, b.size, n, null)
            keep.append(b)
        raw.append((mr, mr.allocate(4096)))
# CuPy arrays through RMM, with the resource still current at exit.
device_mr = asyncmr.AsyncManagedMR(pool="new")
rmm.mr.set_current_device_resource(device_mr)
cupy.cuda.set_allocator(rmm_cupy_allocator)
arrays = [cupy.arange(1 << 16, dtype=cupy.float32) * 2 for _ in range(4)]
# An owned pool closed with memory live, and another left routed as the current pool.
closed_mr = asyncmr.AsyncPinnedMR(pool="new")
closed_buf = rmm.DeviceBuffer(size=1 << 20, mr=closed_mr)
closed_mr.pool.close()
routed = MemPool.create(Location.device(0), "device")
previous = routed.make_current()
routed_mr = asyncmr.AsyncDeviceMR(pool="current")
routed_buf = rmm.DeviceBuffer(size=1 << 20, mr=routed_mr)
cupy.cuda.runtime.deviceSynchronize()
print("READY", len(keep) + len(raw) + len(arrays) + 2, "allocations live", flush=True)
"""


def test_interpreter_exit_with_allocations_live(gpu):
    proc = h.run_python(EXIT_WITH_LIVE)
    assert proc.returncode == 0, h.describe(proc)
    assert "READY" in proc.stdout, h.describe(proc)
    for sign in ("Traceback", "Fatal Python error", "terminate called", "Segmentation fault"):
        assert sign not in proc.stderr, h.describe(proc)


def test_current_device_resource_replaced_while_buffers_live(gpu, kernels, cp):
    import rmm
    from rmm.allocators.cupy import rmm_cupy_allocator

    mr1 = asyncmr.AsyncManagedMR(pool="new")
    mr2 = asyncmr.AsyncDeviceMR(pool="new")
    pool2 = mr2.pool
    alive1 = weakref.ref(mr1.pool)
    cp.cuda.set_allocator(rmm_cupy_allocator)  # the gpu fixture restores both afterwards
    rmm.mr.set_current_device_resource(mr1)
    b1 = rmm.DeviceBuffer(size=1 << 20)  # from mr1, the current resource
    a1 = cp.arange(1 << 16, dtype=cp.uint32)
    h.sync()
    assert mr1.attributes.used_mem_current >= (1 << 20) + (1 << 18)

    rmm.mr.set_current_device_resource(mr2)  # replaced while b1 and a1 are live
    del mr1
    gc.collect()
    assert alive1() is not None
    b2 = rmm.DeviceBuffer(size=1 << 20)
    a2 = cp.arange(1 << 16, dtype=cp.uint32) + 5
    h.sync()
    assert pool2.attributes.used_mem_current >= (1 << 20) + (1 << 18)

    bad = cp.zeros(1, dtype=cp.uint64)
    blocks = [(b1.ptr, b1.size, 1), (b2.ptr, b2.size, 2)]
    fill_and_check(blocks, bad, cp)
    expected = cp.arange(1 << 16, dtype=cp.uint32)
    assert bool((a1 == expected).all()) and bool((a2 == expected + 5).all())

    del b1, a1
    gc.collect()
    h.sync()
    assert alive1() is None, ("the replaced resource outlived its last buffer; held by:\n" +
                              h.holders(alive1()))
    check_all(blocks[1:], bad, cp)
    del b2, a2, expected, bad
    gc.collect()
    h.sync()
    if not h.UNDER_SANITIZER:  # memcheck holds freed blocks back
        assert pool2.attributes.used_mem_current == 0


def test_closing_a_current_owned_pool_routes_back(gpu, kernels):
    for loc, atype in SHARED.values():
        default = MemPool.default(loc, atype)
        owned = MemPool.create(loc, atype)
        owned.make_current()
        assert MemPool.current(loc, atype) == owned
        owned.close()
        assert MemPool.current(loc, atype) == default, (
            f"a destroyed pool stayed current for {atype}@{loc}")
    h.assert_context_works(asyncmr.AsyncDeviceMR(pool="new"))


EXIT_WHILE_WAITING = r"""
import sys, threading, time
import cupy
import asyncmr
from asyncmr import Location, MemPool
from rmm.pylibrmm.stream import Stream

SPIN = r'''extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}'''
MiB = 1 << 20
pool = MemPool.create(Location.device(0), "device", max_size=64 * MiB)
mr = asyncmr.AsyncDeviceMR(pool=pool, cache=64 * MiB)
mr.release_gil = sys.argv[1]
cs = cupy.cuda.Stream(non_blocking=True)
s = Stream(obj=cs)
kernel = cupy.RawKernel(SPIN, "spin")
cupy.cuda.runtime.deviceSynchronize()
with cs:
    kernel((1,), (1,), (cupy.uint64(4_000_000_000),))  # 4 s
# Cached on s, behind the kernel: a release waits for it.
blocks = [mr.allocate(MiB, s) for _ in range(32)]
for b in blocks:
    mr.deallocate(b, MiB, s)
waiting = threading.Event()


def out_of_memory():
    waiting.set()
    try:
        mr.allocate(48 * MiB, Stream())  # the pool gets the cached blocks back: a wait
    except MemoryError:
        pass


threading.Thread(target=out_of_memory, daemon=True).start()
waiting.wait()
time.sleep(0.5)


class WaitAtExit:
    # Destroyed as the interpreter finalizes its modules: the main thread sleeps there, the GIL
    # let go, while the daemon thread's wait ends.
    def __del__(self, sleep=time.sleep):
        sleep(6)


keeper = WaitAtExit()
print("exiting while a daemon thread waits", flush=True)
"""


@pytest.mark.parametrize("release_gil", ["never", "auto"])
def test_interpreter_exit_while_a_daemon_thread_waits_on_the_device(gpu, release_gil):
    """The interpreter finalizes while a daemon thread, its GIL let go, waits in a release behind
    a 4 s kernel: that thread must not take the process down when its wait ends."""
    proc = h.run_python(EXIT_WHILE_WAITING, release_gil, timeout=120)
    assert "exiting" in proc.stdout, h.describe(proc)
    assert proc.returncode == 0, h.describe(proc)
    for sign in ("Fatal Python error", "terminate called", "Segmentation fault"):
        assert sign not in proc.stderr, h.describe(proc)
