# SPDX-License-Identifier: Apache-2.0
"""asyncmr's pinned pool as cuDF's pinned memory resource (asyncmr.cudf), with the real libcudf:
pylibcudf I/O stages its host buffers through the pool, the results are right, and the
previous resource comes back."""

import importlib.util
import os

import numpy as np
import pytest

import asyncmr

from gpu_helpers import not_applicable, require_module, sync

MiB = 1 << 20


@pytest.fixture
def cudf_door(gpu):
    # libcudf is a 301 MB wheel that only ci/gpu.sh's cudf stage brings (and sets
    # ASYNCMR_REQUIRE_CUDF=1): there its absence fails, elsewhere the door is not testable.
    if importlib.util.find_spec("pylibcudf") is None and os.environ.get(
            "ASYNCMR_REQUIRE_CUDF") != "1":
        not_applicable("pylibcudf is not installed (ci/gpu.sh's cudf stage installs it)")
    plc = require_module("pylibcudf", "the cuDF door is tested with the real libcudf")
    pa = require_module("pyarrow", "the test builds its table with pyarrow")
    door = require_module("asyncmr.cudf", "asyncmr must be built where libcudf is installed")
    before = door.get_pinned_memory_resource()
    yield plc, pa, door
    assert door.get_pinned_memory_resource() is not None
    door.set_pinned_memory_resource(before)


def _table(pa, rows: int):
    rng = np.random.default_rng(7)
    return pa.table({
        "key": np.arange(rows, dtype=np.int64),
        "value": rng.standard_normal(rows),
        "small": rng.integers(0, 1000, rows, dtype=np.int32),
    })


def _round_trip(plc, pa, table, path):
    t = plc.Table.from_arrow(table)
    options = plc.io.parquet.ParquetWriterOptions.builder(
        plc.io.types.SinkInfo([str(path)]), t).build()
    plc.io.parquet.write_parquet(options)
    read = plc.io.parquet.read_parquet(
        plc.io.parquet.ParquetReaderOptions.builder(
            plc.io.types.SourceInfo([str(path)])).build())
    return pa.table(read.tbl.to_arrow())


def test_parquet_round_trip_stages_through_the_asyncmr_pool(cudf_door, tmp_path):
    plc, pa, door = cudf_door
    mr = asyncmr.AsyncPinnedMR(pool="new")  # its own pool: the peaks below are cuDF's alone
    table = _table(pa, 2_000_000)
    with door.pinned_memory_resource(mr):
        assert door.get_pinned_memory_resource() is mr
        with mr.track_peak() as peak:
            got = _round_trip(plc, pa, table, tmp_path / "t.parquet")
            sync()
    assert door.get_pinned_memory_resource() is not mr
    for i, name in enumerate(table.column_names):
        np.testing.assert_array_equal(got.column(i).to_numpy(), table.column(name).to_numpy())
    assert peak.used > 0 and peak.reserved > 0, "cuDF did not take pinned memory from the pool"
    sync()
    assert mr.attributes.used_mem_current == 0  # cuDF gave everything back


def test_the_previous_resource_comes_back_and_can_be_reinstalled(cudf_door, tmp_path):
    plc, pa, door = cudf_door
    first, second = asyncmr.AsyncPinnedMR(pool="new"), asyncmr.AsyncPinnedMR(pool="new")
    original = door.set_pinned_memory_resource(first)
    assert isinstance(original, door.CudfPinnedResource)  # cuDF's own default pool
    assert door.set_pinned_memory_resource(second) is first
    assert door.set_pinned_memory_resource(original) is second
    with first.track_peak() as peak:  # the restored cuDF default serves, not `first`
        _round_trip(plc, pa, _table(pa, 100_000), tmp_path / "u.parquet")
    assert peak.used == 0


def test_the_context_manager_restores_after_an_error(cudf_door):
    _, _, door = cudf_door
    mr = asyncmr.AsyncPinnedMR(pool="new")
    before = door.get_pinned_memory_resource()
    with pytest.raises(KeyError):
        with door.pinned_memory_resource(mr):
            raise KeyError("boom")
    assert door.get_pinned_memory_resource() is not mr
    assert type(door.get_pinned_memory_resource()) is type(before)


def test_bad_input_is_refused(cudf_door):
    _, _, door = cudf_door
    with pytest.raises(TypeError, match="AsyncPinnedMR"):
        door.set_pinned_memory_resource(asyncmr.AsyncDeviceMR(pool="new"))
    with pytest.raises(TypeError, match="AsyncPinnedMR"):
        door.set_pinned_memory_resource(None)


def _fill_with_cached_blocks(mr, stream):
    """Allocates from ``mr`` until its pool has no byte left (1 MiB blocks, then ever smaller
    ones down to the cache's smallest class), then frees every block into ``mr``'s front cache.
    Returns the bytes cached."""
    blocks = []
    for size in (MiB, 64 << 10, 4 << 10, 256):
        for _ in range(256):
            try:
                blocks.append((mr.allocate(size, stream), size))
            except MemoryError:
                break
    for ptr, size in blocks:
        mr.deallocate(ptr, size, stream)
    return sum(size for _, size in blocks)


def test_a_cudf_allocation_the_pool_cannot_serve_gets_the_python_sides_cached_blocks(
        cudf_door, tmp_path):
    # cuDF calls the installed resource through libasyncmr.so, the library asyncmr._core's modules link,
    # so one registry holds both resources' caches. An allocation on cuDF's side that the pool
    # cannot serve gets back the blocks the Python side's resource caches on the same pool. (With
    # the C++ library linked statically into each extension, cuDF's side asked only the caches
    # of its own copy, which held none: the allocation failed, or cuDF went without the pool.)
    from rmm.pylibrmm.stream import Stream

    plc, pa, door = cudf_door
    pool = asyncmr.MemPool.create(asyncmr.Location.host(), "pinned", max_size=64 * MiB,
                                  release_threshold=0)
    # A cap above the pool's size: the cache never refuses a put, so nothing but an allocation
    # that runs out of memory gives its blocks back.
    python_side = asyncmr.AsyncPinnedMR(pool=pool, cache=128 * MiB)
    cudf_side = asyncmr.AsyncPinnedMR(pool=pool, cache=64 * MiB)
    stream = Stream()
    cached = _fill_with_cached_blocks(python_side, stream)
    assert cached >= 32 * MiB, f"the 64 MiB pool served only {cached} bytes"
    assert python_side.cache_info["bytes"] == cached, python_side.cache_info
    table = _table(pa, 2_000_000)  # the size the first test shows cuDF staging through the pool
    with door.pinned_memory_resource(cudf_side):
        with cudf_side.track_peak() as peak:
            got = _round_trip(plc, pa, table, tmp_path / "full.parquet")
            sync()
    for i, name in enumerate(table.column_names):
        np.testing.assert_array_equal(got.column(i).to_numpy(), table.column(name).to_numpy())
    assert peak.used > 0, "cuDF took no pinned memory from the pool"
    assert python_side.cache_info["blocks"] == 0, (
        f"cuDF's side did not get the Python side's cached blocks back: {python_side.cache_info}")
    cudf_side.release_cache()  # cuDF keeps the resource alive: its blocks go back now
    sync()
