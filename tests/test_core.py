# SPDX-License-Identifier: Apache-2.0
"""asyncmr's face without a GPU: the resources are RMM's, the errors, the enums C++ defines,
the names the package no longer has, and what a failed construction leaves behind."""

import sys

import pytest
import rmm

import asyncmr
from asyncmr import AsyncDeviceMR, AsyncManagedMR, AsyncPinnedMR, MemPool


RESOURCES = [AsyncManagedMR, AsyncPinnedMR, AsyncDeviceMR]


@pytest.mark.parametrize("cls", RESOURCES)
def test_resources_are_rmm_resources(cls):
    assert issubclass(cls, rmm.mr.DeviceMemoryResource)


def test_errors_are_runtime_errors():
    for exc in (asyncmr.NoDeviceError, asyncmr.UnsupportedError, asyncmr.PoolClosedError,
                asyncmr.CUDAError):
        assert issubclass(exc, asyncmr.AsyncMRError)
        assert issubclass(exc, RuntimeError)


def test_runtime_version_is_the_build_toolkit():
    assert asyncmr.runtime_version() >= 12060


def test_mempool_cannot_be_built_directly():
    with pytest.raises(TypeError, match="MemPool.default"):
        MemPool()
    # Nor by skipping __init__: every use names the problem (not SystemError).
    bare = MemPool.__new__(MemPool)
    for use in (lambda: bare.handle, lambda: bare.closed, bare.close):
        with pytest.raises(TypeError, match="MemPool.__new__ made an empty MemPool"):
            use()


def test_the_resources_shared_base_cannot_be_built_empty():
    # An instance with no C++ resource behind it crashed the interpreter at its first use
    # (trim_to, cache_info, allocate: a null dereference; RMM's DeviceBuffer: an abort).
    from asyncmr._core import _PoolResource

    class Mine(_PoolResource):
        pass

    for make in (_PoolResource, lambda: _PoolResource.__new__(_PoolResource), Mine,
                 lambda: Mine.__new__(Mine)):
        with pytest.raises(TypeError, match="AsyncManagedMR, AsyncPinnedMR or AsyncDeviceMR"):
            make()


@pytest.mark.parametrize("cls", RESOURCES)
def test_a_subclass_of_a_resource_is_built_as_the_resource(no_gpu, cls):
    class Mine(cls):
        pass

    with pytest.raises(asyncmr.NoDeviceError):  # the resource's own path, not the guard's
        Mine()


def test_a_zero_size_pinned_block_makes_no_resource(no_gpu):
    # It allocates nothing, so it asks for no pool: on a GPU the process-wide pinned resource
    # would otherwise be made (raising the default pool's threshold, granting access).
    block = asyncmr.PinnedBlock(0)
    assert (block.ptr, block.size, block.mr) == (0, 0, None)
    assert asyncmr.pinned._default_mr is None


def test_no_gpu_error_is_not_rmms_misleading_message(no_gpu):
    with pytest.raises(RuntimeError) as info:
        AsyncManagedMR()
    assert "cudaMallocAsync not supported" not in str(info.value)


def test_failed_constructions_keep_the_type_alive():
    # Regression: RMM's base type is a heap type whose dealloc releases a reference to the
    # instance's type; a static subclass lost one reference per instance and the interpreter
    # eventually freed the class and crashed. Garbage is collected before each count: a
    # subclass an earlier test made holds references to its base until the collector frees it.
    import gc
    import sys

    gc.collect()
    before = sys.getrefcount(AsyncManagedMR)
    for _ in range(2000):
        with pytest.raises(ValueError):
            AsyncManagedMR(release_threshold=-1)
    gc.collect()
    assert sys.getrefcount(AsyncManagedMR) == before


def test_enums_are_the_cpp_enums():
    from asyncmr import _core

    assert [k.name for k in asyncmr.LocationKind] == [
        "none", "device", "host", "host_numa", "host_numa_current"]
    assert [t.name for t in asyncmr.AllocationType] == ["device", "pinned", "managed"]
    # The Python spellings of pool= map onto the C++ enum by C++'s own to_string.
    assert _core.POOL_SOURCES == {"default": asyncmr.PoolSource.default_pool,
                                  "current": asyncmr.PoolSource.current,
                                  "new": asyncmr.PoolSource.new_pool}
    assert set(_core.ACCESS_MODES.values()) == set(asyncmr.AccessMode)


def test_the_names_deprecated_in_0_2_are_removed():
    for cls in (MemPool, AsyncManagedMR, AsyncPinnedMR, AsyncDeviceMR):
        assert callable(cls.trim_to) and callable(cls.reset_peaks)
        assert not hasattr(cls, "trim") and not hasattr(cls, "reset_peak"), cls
