# SPDX-License-Identifier: Apache-2.0
"""The CUDA 12 build on a CUDA 12 driver, on a GPU whose driver is 13.x: asyncmr is made to act
as if the driver were 12.9 (``_set_testing_driver_version``), which takes the paths a 12.x
driver takes: the stand-in default host pool, no current host pool, no managed pools. (The CUDA
13 build on a 12.x driver is refused outright.)"""

import numpy as np
import pytest

import asyncmr
from asyncmr import AsyncDeviceMR, AsyncManagedMR, AsyncPinnedMR, Location, MemPool
from asyncmr import _core

from gpu_helpers import device_view, host_view, not_applicable, require_module, sync

MiB = 1 << 20


@pytest.fixture
def driver_12_9(gpu):
    _core._set_testing_driver_version(12090)
    try:
        yield
    finally:
        _core._set_testing_driver_version(0)


def test_a_cuda13_build_refuses_a_12x_driver_naming_the_cu12_package(driver_12_9):
    if asyncmr.runtime_version() < 13000:
        not_applicable("this is the CUDA 12 build")
    with pytest.raises(asyncmr.NoDeviceError, match="older than the CUDA runtime.*asyncmr-cu12"):
        AsyncDeviceMR()


def test_the_stand_in_default_host_pool(driver_12_9):
    if asyncmr.runtime_version() >= 13000:
        not_applicable("the stand-in serves the CUDA 12 build")
    cupy = require_module("cupy")
    assert asyncmr.pool_support(Location.host(), "pinned") == ("stand_in", "")
    first, second = MemPool.default(Location.host(), "pinned"), MemPool.default(Location.host(),
                                                                                  "pinned")
    assert first == second and not first.owned  # one process-wide pool, asyncmr's
    assert first.location == Location.host() and first.allocation_type == "pinned"
    with pytest.raises(ValueError, match="process-wide default host pool"):
        MemPool.from_handle(first.handle, owned=True)
    mr = AsyncPinnedMR()  # on the stand-in: grants access, raises its zero threshold
    assert mr.pool == first and mr.pool.access(0) == "rw"
    assert mr.attributes.release_threshold == 2**64 - 1
    ptr = mr.allocate(MiB)
    device_view(ptr, MiB // 4, dtype=np.uint32)[:] = cupy.arange(MiB // 4, dtype=cupy.uint32)
    sync()
    np.testing.assert_array_equal(host_view(ptr, MiB // 4, np.uint32),
                                  np.arange(MiB // 4, dtype=np.uint32))
    mr.deallocate(ptr, MiB)
    sync()


def test_what_a_12x_driver_cannot_do_says_so(driver_12_9):
    if asyncmr.runtime_version() >= 13000:
        not_applicable("the CUDA 12 build's paths")
    with pytest.raises(asyncmr.UnsupportedError, match="current host pool.*CUDA 13 driver"):
        MemPool.current(Location.host(), "pinned")
    with pytest.raises(asyncmr.UnsupportedError, match="managed memory pools.*12.9"):
        AsyncManagedMR()
    with pytest.raises(asyncmr.UnsupportedError, match="CUDA 13 driver feature"):
        MemPool.create(Location.host(), "pinned").make_current()
    # What it can do: device pools of every kind, created host pools.
    for pool in ("default", "current", "new"):
        mr = AsyncDeviceMR(pool=pool)
        mr.deallocate(mr.allocate(MiB), MiB)
    created = AsyncPinnedMR(pool="new")
    created.deallocate(created.allocate(MiB), MiB)
    sync()


def test_host_pools_need_a_12_6_driver(gpu):
    if asyncmr.runtime_version() >= 13000:
        not_applicable("the CUDA 12 build's paths")
    _core._set_testing_driver_version(12040)
    try:
        with pytest.raises(asyncmr.UnsupportedError, match="12.6.*this driver is 12.4"):
            AsyncPinnedMR(pool="new")
        mr = AsyncDeviceMR(pool="new")  # device pools are older than that
        mr.deallocate(mr.allocate(MiB), MiB)
        sync()
    finally:
        _core._set_testing_driver_version(0)


def test_placement_needs_a_12_2_driver(gpu):
    # The CUDA 12 build's prefetch and advice are cudaMemPrefetchAsync_v2 and cudaMemAdvise_v2,
    # CUDA 12.2 driver functions: on a 12.0 or 12.1 driver they are refused naming 12.2 before
    # the call, not with the runtime's generic error.
    if asyncmr.runtime_version() >= 13000:
        not_applicable("the CUDA 12 build's paths")
    cupy = require_module("cupy")
    managed = cupy.cuda.malloc_managed(MiB)  # cudaMallocManaged: any driver has it
    _core._set_testing_driver_version(12010)
    try:
        for call in (lambda: asyncmr.prefetch((managed.ptr, MiB), "device"),
                     lambda: asyncmr.advise((managed.ptr, MiB), "set_read_mostly")):
            with pytest.raises(asyncmr.UnsupportedError,
                               match=r"needs a CUDA 12\.2 or newer driver.*this driver is 12\.1"):
                call()
    finally:
        _core._set_testing_driver_version(0)
    asyncmr.prefetch((managed.ptr, MiB), "device")  # the real driver has them
    asyncmr.advise((managed.ptr, MiB), "set_read_mostly")
    sync()
