# SPDX-License-Identifier: Apache-2.0
"""The three resources on the GPU: allocation, RMM and CuPy integration, ownership, access,
the release-threshold policy, out-of-memory behaviour."""

import gc

import numpy as np
import pytest
import rmm

import asyncmr
from asyncmr import AsyncDeviceMR, AsyncManagedMR, AsyncPinnedMR, Location, MemPool

from gpu_helpers import device_view, host_view, not_applicable, require_module, rmm_cupy, sync

MiB = 1 << 20
UINT64_MAX = 2**64 - 1

MAKERS = {"managed": AsyncManagedMR, "pinned": AsyncPinnedMR, "device": AsyncDeviceMR}
# The shared pool each kind uses by default, on device 0.
SHARED = {
    "managed": (Location.device(0), "managed"),
    "pinned": (Location.host(), "pinned"),
    "device": (Location.device(0), "device"),
}
HOST_VISIBLE = ["managed", "pinned"]
POOLS = ["default", "current", "new", "adopted"]


def make(kind, pool, **kwargs):
    """A resource of ``kind`` on ``pool``; "adopted" adopts a pool created here (returned too,
    so the caller keeps it alive)."""
    if pool == "adopted":
        loc, atype = SHARED[kind]
        owner = MemPool.create(loc, atype)
        return MAKERS[kind](pool=owner.handle, **kwargs), owner
    return MAKERS[kind](pool=pool, **kwargs), None


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("kind", list(MAKERS))
def test_allocate_and_free(gpu, kind, pool):
    mr, _owner = make(kind, pool)
    assert isinstance(mr, rmm.mr.DeviceMemoryResource)
    assert mr.allocation_type == kind
    assert mr.owns_pool == (pool == "new")
    assert mr.pool_handle != 0
    ptrs = [mr.allocate(n) for n in (256, 4096, MiB)]
    assert all(p != 0 for p in ptrs) and len(set(ptrs)) == 3
    for p, n in zip(ptrs, (256, 4096, MiB)):
        mr.deallocate(p, n)
    sync()


@pytest.mark.parametrize("kind", list(MAKERS))
def test_properties(gpu, kind):
    mr = MAKERS[kind]()
    loc, atype = SHARED[kind]
    assert mr.location == loc
    assert mr.allocation_type == atype
    assert mr.device == (None if kind == "pinned" else 0)
    assert mr.pool_handle == MemPool.default(loc, atype).handle
    assert f"allocation_type='{kind}'" in repr(mr)


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("kind", ["managed", "device"])
def test_device_buffer_round_trip(gpu, kind, pool):
    mr, _owner = make(kind, pool)
    data = np.arange(MiB // 4, dtype=np.int32)
    buf = rmm.DeviceBuffer(size=data.nbytes, mr=mr)
    buf.copy_from_host(data.view(np.uint8))
    back = buf.copy_to_host().view(np.int32)
    np.testing.assert_array_equal(back, data)


@pytest.mark.parametrize("pool", POOLS)
def test_device_buffer_in_pinned_memory(gpu, pool):
    mr, _owner = make("pinned", pool)
    n = MiB // 4
    buf = rmm.DeviceBuffer(size=n * 4, mr=mr)
    sync()
    host_view(buf.ptr, n)[:] = np.arange(n, dtype=np.int32)  # the host writes it directly
    copy = buf.copy()  # device-side copy into another pinned block
    sync()
    np.testing.assert_array_equal(host_view(copy.ptr, n), np.arange(n, dtype=np.int32))


def test_explicit_direction_copies_treat_pool_pinned_memory_as_host(gpu):
    # CUDA's own rule, pinned here so a change in a driver is noticed: pool-allocated pinned
    # memory is host memory to cudaMemcpy. Host-to-device copies from it and device-to-host
    # copies into it work; copies that call it device memory (DeviceBuffer.copy_from_host
    # into it, CuPy's .get() from it) fail with cudaErrorInvalidValue, unlike cudaHostAlloc
    # memory. cudaMemcpyDefault works in every direction. The README says so.
    cupy = require_module("cupy")
    rt = cupy.cuda.runtime
    mr = AsyncPinnedMR()
    n = 4096
    ptr = mr.allocate(n)
    dev = cupy.zeros(n, dtype=cupy.uint8)
    sync()
    rt.memcpy(ptr, dev.data.ptr, n, rt.memcpyDeviceToHost)  # into pinned: fine
    rt.memcpy(dev.data.ptr, ptr, n, rt.memcpyHostToDevice)  # from pinned: fine
    rt.memcpy(dev.data.ptr, ptr, n, rt.memcpyDefault)
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError, match="cudaErrorInvalidValue"):
        rt.memcpy(dev.data.ptr, ptr, n, rt.memcpyDeviceToDevice)
    mr.deallocate(ptr, n)
    sync()


@pytest.mark.parametrize("kind", list(MAKERS))
def test_current_device_resource(gpu, kind):
    mr = MAKERS[kind]()
    rmm.mr.set_current_device_resource(mr)
    assert rmm.mr.get_current_device_resource() is mr
    used = mr.attributes.used_mem_current
    buf = rmm.DeviceBuffer(size=MiB)
    sync()
    assert mr.attributes.used_mem_current >= used + MiB
    del buf


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("kind", list(MAKERS))
def test_cupy_through_rmm_allocator(gpu, kind, pool):
    cupy = require_module("cupy")
    mr, _owner = make(kind, pool)
    stats = rmm.mr.StatisticsResourceAdaptor(mr)
    n = 1 << 20
    with rmm_cupy(stats):
        x = cupy.arange(n, dtype=cupy.float64)
        y = cupy.sqrt(x * x + 1.0) - 1.0
        result = (2 * y).sum()
        sync()
        # Read the result from the host: CuPy's .get() copies device-to-host, which CUDA
        # refuses for pool pinned memory (see the test below on explicit-direction copies).
        total = float(host_view(result.data.ptr, 1, np.float64)[0]) if kind != "device" \
            else float(result)
        del x, y, result
    host = np.arange(n, dtype=np.float64)
    assert total == pytest.approx(float((2 * (np.sqrt(host * host + 1.0) - 1.0)).sum()), rel=1e-12)
    assert stats.allocation_counts.total_count >= 3


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("kind", HOST_VISIBLE)
def test_host_and_kernel_read_write(gpu, kind, pool):
    mr, _owner = make(kind, pool)
    n = MiB // 4
    ptr = mr.allocate(n * 4)
    sync()  # the host may touch the block only once the stream reached the allocation
    host = host_view(ptr, n)
    host[:] = np.arange(n, dtype=np.int32)  # host writes
    dev = device_view(ptr, n)
    dev *= 3  # a kernel reads and writes (pinned: needs the access the resource granted)
    sync()
    np.testing.assert_array_equal(host, 3 * np.arange(n, dtype=np.int32))
    mr.deallocate(ptr, n * 4)
    sync()


@pytest.mark.parametrize("pool", POOLS)
def test_pinned_pools_grant_device_access(gpu, pool):
    mr, _owner = make("pinned", pool)
    for d in range(asyncmr.device_count()):
        assert mr.pool.access(d) == "rw"


def test_pinned_accessible_from_lists_devices(gpu):
    mr = AsyncPinnedMR(pool="new", accessible_from=[])
    assert mr.pool.access(0) == "none"  # host-only: kernels must not touch it
    mr2 = AsyncPinnedMR(pool="new", accessible_from=0)
    assert mr2.pool.access(0) == "rw"


def test_managed_pool_on_the_host(gpu):
    mr = AsyncManagedMR(pool="new", location=Location.host())
    assert mr.location == Location.host()
    assert mr.pool.access(0) == "rw"
    n = 4096
    ptr = mr.allocate(n * 4)
    sync()
    dev = device_view(ptr, n)
    dev[:] = 7
    sync()
    assert (host_view(ptr, n) == 7).all()
    mr.deallocate(ptr, n * 4)


def test_pinned_written_by_kernels_on_two_gpus(two_gpus):
    cupy = require_module("cupy")
    mr = AsyncPinnedMR()
    n = 1 << 16
    ptr = mr.allocate(2 * n * 4)
    sync()
    for d in (0, 1):
        with cupy.cuda.Device(d):
            view = device_view(ptr + d * n * 4, n, device_id=d)
            view[:] = d + 1
            cupy.cuda.runtime.deviceSynchronize()
    host = host_view(ptr, 2 * n)
    assert (host[:n] == 1).all() and (host[n:] == 2).all()
    mr.deallocate(ptr, 2 * n * 4)
    sync()


def test_new_pool_is_destroyed_with_the_resource(gpu):
    cupy = require_module("cupy")
    mr = AsyncDeviceMR(pool="new")
    assert mr.owns_pool and mr.pool.owned
    ptr = mr.allocate(256 * MiB)
    mr.deallocate(ptr, 256 * MiB)
    sync()
    assert mr.attributes.reserved_mem_current >= 256 * MiB  # kept: threshold is the maximum
    free_before, _ = cupy.cuda.runtime.memGetInfo()
    del mr
    gc.collect()
    free_after, _ = cupy.cuda.runtime.memGetInfo()
    assert free_after - free_before >= 200 * MiB  # the pool and its reservation are gone


def test_closing_the_pool_stops_the_resource(gpu):
    mr = AsyncDeviceMR(pool="new")
    mr.pool.close()
    assert mr.pool.closed
    with pytest.raises(asyncmr.PoolClosedError):
        mr.attributes.release_threshold
    with pytest.raises(RuntimeError, match="closed"):
        mr.allocate(1024)
    # Its repr still answers (a log line or a debugger must not raise), naming the closed pool.
    assert repr(mr) == ("AsyncDeviceMR(allocation_type='device', location=Location.device(0), "
                        "owns_pool=True, pool_handle=<closed>)")


@pytest.mark.parametrize("kind", list(MAKERS))
def test_adopted_handle_is_never_destroyed(gpu, kind):
    loc, atype = SHARED[kind]
    owner = MemPool.create(loc, atype)
    mr = MAKERS[kind](pool=owner.handle)
    assert not mr.owns_pool and mr.pool_handle == owner.handle
    ptr = mr.allocate(MiB)
    mr.deallocate(ptr, MiB)
    del mr
    gc.collect()
    # The pool still works: attributes answer and a new resource allocates from it.
    assert owner.attributes.release_threshold == UINT64_MAX
    mr2 = MAKERS[kind](pool=owner)
    ptr = mr2.allocate(MiB)
    mr2.deallocate(ptr, MiB)
    sync()
    owner.close()


def test_a_numa_node_an_adopted_pinned_pool_is_not_on_is_refused_not_ignored(gpu):
    # The pool's memory stays where the pool is: numa_node=0 on a pool of plain host memory was
    # silently dropped.
    owner = MemPool.create(Location.host(), "pinned")
    with pytest.raises(ValueError, match=r"numa_node=0: the adopted pool's memory is at host "
                                         r"\(an adopted pool stays where it is; drop numa_node\)"):
        AsyncPinnedMR(pool=owner, numa_node=0)
    assert owner.attributes.reserved_mem_current == 0  # nothing was allocated from it
    owner.close()


@pytest.mark.parametrize("kind", list(MAKERS))
def test_threshold_policy_raises_zero(gpu, kind):
    pool = MemPool.default(*SHARED[kind])
    pool.attributes.release_threshold = 0
    MAKERS[kind]()
    assert pool.attributes.release_threshold == UINT64_MAX


@pytest.mark.parametrize("kind", list(MAKERS))
def test_threshold_policy_keeps_someone_elses_value(gpu, kind):
    pool = MemPool.default(*SHARED[kind])
    pool.attributes.release_threshold = 12345
    MAKERS[kind]()
    assert pool.attributes.release_threshold == 12345


@pytest.mark.parametrize("value", [0, 777, UINT64_MAX])
@pytest.mark.parametrize("kind", list(MAKERS))
def test_threshold_policy_applies_an_explicit_value(gpu, kind, value):
    pool = MemPool.default(*SHARED[kind])
    pool.attributes.release_threshold = 12345
    MAKERS[kind](release_threshold=value)
    assert pool.attributes.release_threshold == value


@pytest.mark.parametrize("kind", list(MAKERS))
def test_threshold_policy_for_owned_pools(gpu, kind):
    assert MAKERS[kind](pool="new").attributes.release_threshold == UINT64_MAX
    assert MAKERS[kind](pool="new", release_threshold=0).attributes.release_threshold == 0
    assert MAKERS[kind](pool="new", release_threshold=5 * MiB).attributes.release_threshold == 5 * MiB


@pytest.mark.parametrize("call, error, match", [
    (lambda mr, p: mr.allocate(True), TypeError, "nbytes must be an int, got bool"),
    (lambda mr, p: mr.allocate(1.0), TypeError, "nbytes must be an int, got float"),
    (lambda mr, p: mr.allocate(-1), ValueError, r"nbytes must be in \[0, 2\*\*64\), got -1"),
    (lambda mr, p: mr.deallocate(p, True), TypeError, "nbytes must be an int, got bool"),
    (lambda mr, p: mr.deallocate(p, 1024.9), TypeError, "nbytes must be an int, got float"),
    (lambda mr, p: mr.deallocate(p, -1), ValueError, r"nbytes must be in \[0, 2\*\*64\)"),
    (lambda mr, p: mr.deallocate(float(p), 1024), TypeError, "ptr must be an int, got float"),
    (lambda mr, p: mr.deallocate(True, 1024), TypeError, "ptr must be an int, got bool"),
])
def test_bad_sizes_and_addresses_are_refused_and_nothing_is_freed(gpu, call, error, match):
    mr = AsyncDeviceMR(pool="new")
    p = mr.allocate(1024)
    sync()
    used = mr.attributes.used_mem_current
    with pytest.raises(error, match=match):
        call(mr, p)
    sync()
    assert mr.attributes.used_mem_current == used
    mr.deallocate(p, 1024)


def test_freeing_null_is_a_no_op_that_changes_nothing(gpu):
    mr = AsyncDeviceMR(pool="new")
    p = mr.allocate(MiB)
    sync()
    used = mr.attributes.used_mem_current
    mr.deallocate(0, 2**62)  # RMM's rule: nothing to free
    assert mr.attributes.used_mem_current == used
    mr.deallocate(p, MiB)


@pytest.mark.parametrize("kind", list(MAKERS))
def test_impossible_allocation_raises_memory_error(gpu, kind):
    loc, atype = SHARED[kind]
    if kind == "device":
        mr, nbytes = AsyncDeviceMR(), 1 << 50  # far beyond any GPU
    elif kind == "pinned":
        # Never ask the driver for more pinned memory than exists: bound the pool.
        mr = MAKERS[kind](pool=MemPool.create(loc, atype, max_size=64 * MiB, release_threshold=0))
        nbytes = 128 * MiB
    else:
        not_applicable("managed pools cannot be bounded (cudaMemPoolCreate refuses max_size for "
                    "them) and asking for more managed memory than the card has can hang it")
    with pytest.raises(MemoryError, match="out of memory"):
        mr.allocate(nbytes)
    ptr = mr.allocate(MiB)  # the process goes on allocating
    mr.deallocate(ptr, MiB)
    sync()


@pytest.mark.parametrize("kind", list(MAKERS))
def test_limiting_adaptor_on_top(gpu, kind):
    mr = rmm.mr.LimitingResourceAdaptor(MAKERS[kind](), allocation_limit=4 * MiB)
    buf = rmm.DeviceBuffer(size=2 * MiB, mr=mr)
    with pytest.raises(MemoryError):
        rmm.DeviceBuffer(size=4 * MiB, mr=mr)
    assert mr.get_allocated_bytes() == 2 * MiB
    del buf


@pytest.mark.parametrize("kind", list(MAKERS))
def test_statistics_adaptor_on_top(gpu, kind):
    mr = rmm.mr.StatisticsResourceAdaptor(MAKERS[kind]())
    bufs = [rmm.DeviceBuffer(size=MiB, mr=mr) for _ in range(3)]
    assert mr.allocation_counts.current_bytes == 3 * MiB
    del bufs
    assert mr.allocation_counts.current_bytes == 0
    assert mr.allocation_counts.total_count == 3


@pytest.mark.parametrize("kind", list(MAKERS))
def test_zero_byte_allocation(gpu, kind):
    mr = MAKERS[kind]()
    assert mr.allocate(0) == 0
    mr.deallocate(0, 0)


def test_device_out_of_range(gpu):
    with pytest.raises(ValueError, match="device 64 does not exist"):
        AsyncDeviceMR(64)
    with pytest.raises(ValueError, match="does not exist"):
        AsyncManagedMR(64)


def test_exported_enums_are_taken_where_their_names_are(gpu):
    from asyncmr import AllocationType, Location, PoolSource

    mr = asyncmr.AsyncPinnedMR(pool=PoolSource.new_pool)  # not pool handle 2
    assert mr.owns_pool
    assert asyncmr.pool_support(Location.host(), AllocationType.pinned, PoolSource.new_pool) == \
        asyncmr.pool_support(Location.host(), "pinned", "new")
    pool = asyncmr.MemPool.default(Location.device(0), AllocationType.device)
    assert pool == asyncmr.MemPool.default(Location.device(0), "device")
