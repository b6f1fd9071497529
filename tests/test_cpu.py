# SPDX-License-Identifier: Apache-2.0
"""What a machine without a GPU can check: import, class hierarchy, validation, messages."""

import pytest
import rmm

import asyncmr
from asyncmr import AsyncDeviceMR, AsyncManagedMR, AsyncPinnedMR, Location, MemPool

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


def test_attribute_table_matches_the_driver_enum():
    names = [row.name for row in asyncmr.attribute_table]
    assert len(names) == len(set(names)) == 14
    assert [row.cuda_value for row in asyncmr.attribute_table] == list(range(1, 15))
    assert {row.access for row in asyncmr.attribute_table} == {
        "read_only", "read_write", "reset_only"}
    settable = {r.name for r in asyncmr.attribute_table if r.access == "read_write"}
    assert settable == {"release_threshold", "reuse_follow_event_dependencies",
                        "reuse_allow_opportunistic", "reuse_allow_internal_dependencies"}
    assert {r.name for r in asyncmr.attribute_table if r.access == "reset_only"} == {
        "used_mem_high", "reserved_mem_high"}
    assert all(r.min_driver == 13020 for r in asyncmr.attribute_table if r.cuda_value > 8)


def test_every_table_row_is_a_property():
    for row in asyncmr.attribute_table:
        assert isinstance(getattr(asyncmr.PoolAttributes, row.name), property)


def test_location_constructors():
    assert Location.device(1) == ("device", 1)
    assert Location.host() == ("host", None)
    assert Location.host_numa(0) == ("host_numa", 0)
    assert Location.host_numa_current().kind == "host_numa_current"
    assert Location.none().kind == "none"
    assert repr(Location.device(2)) == "Location.device(2)"
    assert Location.host().is_host and not Location.device(0).is_host


@pytest.mark.parametrize("call, exc, match", [
    (lambda: Location.device(-1), ValueError, "device ordinal must be in"),
    (lambda: Location.device("0"), TypeError, "device ordinal must be an int"),
    (lambda: Location.host_numa(-2), ValueError, "NUMA node must be in"),
    (lambda: AsyncManagedMR(pool="bogus"), ValueError, "pool must be 'default'"),
    (lambda: AsyncManagedMR(pool=1.5), TypeError, "pool must be"),
    (lambda: AsyncManagedMR(pool=0), ValueError, "pool handle must be a non-zero"),
    (lambda: AsyncManagedMR(pool=-5), ValueError, "pool handle"),
    (lambda: AsyncManagedMR(device=-1), ValueError, "device must be in"),
    (lambda: AsyncManagedMR(device=True), TypeError, "device must be an int"),
    (lambda: AsyncManagedMR(location="host"), TypeError, "location must be an asyncmr.Location"),
    (lambda: AsyncManagedMR(location=Location("moon", 1)), ValueError, "unknown location kind"),
    (lambda: AsyncManagedMR(release_threshold=-1), ValueError, "release_threshold must be in"),
    (lambda: AsyncManagedMR(release_threshold=2**64), ValueError, "release_threshold"),
    (lambda: AsyncManagedMR(release_threshold="1GB"), TypeError, "release_threshold must be an int"),
    (lambda: AsyncPinnedMR(numa_node=-1), ValueError, "numa_node must be in"),
    (lambda: AsyncPinnedMR(accessible_from="some"), ValueError, "accessible_from must be 'all'"),
    (lambda: AsyncPinnedMR(accessible_from=[0, -1]), ValueError, "accessible_from device"),
    (lambda: AsyncPinnedMR(accessible_from=3.0), TypeError, "accessible_from must be"),
    (lambda: AsyncPinnedMR(pool=None), TypeError, "pool must be"),
    (lambda: AsyncDeviceMR(release_threshold=True), TypeError, "release_threshold"),
    (lambda: AsyncDeviceMR(1, 2), TypeError, "positional"),
    (lambda: MemPool.default(Location.host(), "shared"), ValueError, "unknown allocation_type"),
    (lambda: MemPool.default("host", "pinned"), TypeError, "location must be"),
    (lambda: MemPool.create(Location.host(), "pinned", max_size=-1), ValueError, "max_size"),
    (lambda: MemPool.create(Location.host(), "pinned", export_handle_types=-1), TypeError,
     "export_handle_types"),
    (lambda: MemPool.from_handle(0), ValueError, "non-zero"),
    (lambda: MemPool.from_handle("0x1"), TypeError, "pool handle must be an int"),
])
def test_bad_arguments_fail_before_cuda(call, exc, match):
    # These raise the same way with or without a GPU: validation runs first.
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("call", [
    lambda: AsyncManagedMR(),
    lambda: AsyncPinnedMR(),
    lambda: AsyncDeviceMR(),
    lambda: AsyncDeviceMR(pool="new"),
    lambda: MemPool.default(Location.device(0), "device"),
    lambda: MemPool.create(Location.host(), "pinned"),
    lambda: asyncmr.device_count(),
])
def test_no_gpu_message(no_gpu, call):
    with pytest.raises(asyncmr.NoDeviceError, match="no CUDA driver|no CUDA device|older than"):
        call()


def test_no_gpu_error_is_not_rmms_misleading_message(no_gpu):
    with pytest.raises(RuntimeError) as info:
        AsyncManagedMR()
    assert "cudaMallocAsync not supported" not in str(info.value)


def test_failed_constructions_keep_the_type_alive():
    # Regression: RMM's base type is a heap type whose dealloc releases a reference to the
    # instance's type; a static subclass lost one reference per instance and the interpreter
    # eventually freed the class and crashed.
    import sys

    before = sys.getrefcount(AsyncManagedMR)
    for _ in range(2000):
        with pytest.raises(ValueError):
            AsyncManagedMR(release_threshold=-1)
    assert sys.getrefcount(AsyncManagedMR) == before
