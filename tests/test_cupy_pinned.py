# SPDX-License-Identifier: Apache-2.0
"""asyncmr's pool as CuPy's pinned memory allocator (asyncmr.cupy).

Every GPU test uses a pool of its own (AsyncPinnedMR(pool="new")) so the used bytes and peaks
it reads are its own. CuPy releases the buffers it staged through only after their copy is
done, at its next pinned allocation (its watch list); `flush` does that with a zero-byte
request, which asyncmr answers without touching the pool.
"""

import gc
import threading
import warnings

import numpy as np
import pytest

import asyncmr
from asyncmr import Location, MemPool

MiB = 1 << 20


@pytest.fixture
def cp(gpu):
    # The GPU host has CuPy: missing it there is a failure, not a skip.
    import cupy

    import asyncmr.cupy

    yield cupy
    # CuPy's pinned allocator is process-wide: hand CuPy its default pool back.
    asyncmr.cupy.restore_pinned_allocator(cupy.get_default_pinned_memory_pool().malloc)


@pytest.fixture
def owned(gpu):
    return asyncmr.AsyncPinnedMR(pool="new")


def flush(cupy):
    """Wait for every copy, let CuPy drop the staging buffers it kept for them, and let the
    stream-ordered frees run."""
    cupy.cuda.runtime.deviceSynchronize()
    cupy.cuda.alloc_pinned_memory(0)  # CuPy releases finished watch-list entries here
    gc.collect()
    cupy.cuda.runtime.deviceSynchronize()


def uses_cupy_default_pool(cupy) -> bool:
    mem = cupy.cuda.alloc_pinned_memory(1).mem
    return (isinstance(mem, cupy.cuda.pinned_memory.PooledPinnedMemory)
            and mem.pool() is cupy.get_default_pinned_memory_pool())


# ---- CPU -----------------------------------------------------------------------------------

def test_out_of_memory_error_is_what_cupy_catches():
    runtime = pytest.importorskip("cupy_backends.cuda.api.runtime")
    import pickle

    import asyncmr.cupy as acp

    e = acp.PinnedOutOfMemoryError(1 << 30, "asyncmr: out of memory")
    assert isinstance(e, runtime.CUDARuntimeError) and isinstance(e, MemoryError)
    assert e.status == 2  # cudaErrorMemoryAllocation, the status CuPy checks
    assert "1073741824 bytes" in str(e)
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is acp.PinnedOutOfMemoryError and again.status == 2


def test_foreign_allocator_is_not_mistaken_for_asyncmr():
    cupy = pytest.importorskip("cupy")
    import asyncmr.cupy as acp

    assert acp.current_pinned_allocator() is None  # CuPy's own pool answers zero bytes
    with pytest.raises(TypeError, match="callable"):
        acp.restore_pinned_allocator(42)
    with pytest.raises(TypeError, match="AsyncPinnedMR"):
        acp.set_pinned_allocator(mr=asyncmr.Location.host())
    with pytest.raises(TypeError, match="PinnedBlock"):
        acp.pinned_memory_pointer(bytearray(8))
    assert acp.current_pinned_allocator() is None
    del cupy


# ---- GPU -----------------------------------------------------------------------------------

def test_set_returns_previous_and_restore_works(cp, owned):
    import asyncmr.cupy as acp

    assert uses_cupy_default_pool(cp)
    previous = acp.set_pinned_allocator(owned)
    assert previous == cp.get_default_pinned_memory_pool().malloc
    first = acp.current_pinned_allocator()
    assert isinstance(first, acp.PinnedAllocator) and first.mr is owned
    assert acp.set_pinned_allocator() is first           # the one asyncmr installed
    assert acp.current_pinned_allocator().mr is asyncmr.pinned.default_pinned_mr()
    acp.restore_pinned_allocator(previous)
    assert acp.current_pinned_allocator() is None and uses_cupy_default_pool(cp)


def test_context_manager_restores_even_on_exception(cp, owned):
    import asyncmr.cupy as acp

    other = asyncmr.AsyncPinnedMR(pool="new")
    with pytest.raises(KeyError):
        with acp.pinned_allocator(owned) as outer:
            assert acp.current_pinned_allocator() is outer and outer.mr is owned
            with acp.pinned_allocator(other) as inner:
                assert acp.current_pinned_allocator() is inner
            assert acp.current_pinned_allocator() is outer
            raise KeyError("boom")
    assert acp.current_pinned_allocator() is None
    assert uses_cupy_default_pool(cp)


def test_asarray_stages_through_the_pool(cp, owned):
    import asyncmr.cupy as acp

    host = np.arange(1 << 20, dtype=np.float64)  # 8 MiB, pageable: CuPy stages it
    with acp.pinned_allocator(owned):
        with owned.track_peak() as peak:
            d = cp.asarray(host, blocking=False)
            cp.cuda.get_current_stream().synchronize()
        assert peak.used >= host.nbytes and peak.reserved >= host.nbytes
        np.testing.assert_array_equal(d.get(), host)
        flush(cp)
        assert owned.attributes.used_mem_current == 0
        # A list of NumPy arrays is concatenated into a staging buffer too.
        parts = [np.full(1000, i, dtype=np.int32) for i in range(4)]
        with owned.track_peak() as peak:
            d2 = cp.array(parts, blocking=True)
        assert peak.used >= 4000 * 4
        np.testing.assert_array_equal(d2.get(), np.stack(parts))
    flush(cp)
    assert owned.attributes.used_mem_current == 0


def test_empty_pinned_set_get_round_trip(cp, owned):
    import cupyx

    import asyncmr.cupy as acp

    n = 1 << 18
    with acp.pinned_allocator(owned):
        h = cupyx.empty_pinned((n,), dtype=np.float32)   # built on the pool
        assert owned.attributes.used_mem_current >= h.nbytes
        h[:] = np.arange(n, dtype=np.float32)
        d = cp.empty(n, dtype=cp.float32)
        d.set(h)                                          # H2D from pool memory
        out = cupyx.zeros_pinned((n,), dtype=np.float32)
        (d * 2).get(out=out)                              # D2H into pool memory
        np.testing.assert_array_equal(out, np.arange(n, dtype=np.float32) * 2)
        np.testing.assert_array_equal(d.get(), h)
        used = owned.attributes.used_mem_current
        like = cupyx.empty_like_pinned(d)
        assert like.shape == (n,) and owned.attributes.used_mem_current >= used + like.nbytes
        del h, out, like
    flush(cp)
    assert owned.attributes.used_mem_current == 0


def test_thousands_of_transfers_leave_nothing_behind(cp, owned):
    import asyncmr.cupy as acp

    rng = np.random.default_rng(0)
    with acp.pinned_allocator(owned):
        for i in range(3000):
            host = rng.integers(0, 1000, size=256 + 37 * (i % 50), dtype=np.int64)
            d = cp.asarray(host, blocking=False)
            if i % 100 == 0:
                np.testing.assert_array_equal(d.get(), host)
        cp.cuda.get_current_stream().synchronize()
        np.testing.assert_array_equal(d.get(), host)
        del d
    flush(cp)
    assert owned.attributes.used_mem_current == 0
    assert owned.attributes.used_mem_high > 0


def test_transfers_from_several_threads(cp, owned):
    import asyncmr.cupy as acp

    errors = []

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            stream = cp.cuda.Stream(non_blocking=True)
            with stream:
                for _ in range(500):
                    host = rng.standard_normal(1024 + int(rng.integers(0, 4096)))
                    d = cp.asarray(host, blocking=False)
                    back = (d + 1).get()          # synchronizes this thread's stream
                    if not np.array_equal(back, host + 1):
                        errors.append(f"thread {seed}: wrong data")
                        return
        except Exception as e:  # reported below, with the thread that raised it
            errors.append(f"thread {seed}: {e!r}")

    with acp.pinned_allocator(owned):
        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    flush(cp)
    assert owned.attributes.used_mem_current == 0


def test_out_of_memory_falls_back_the_way_cupy_expects(cp):
    import cupyx

    import asyncmr.cupy as acp

    pool = MemPool.create(Location.host(), "pinned", max_size=64 * MiB, release_threshold=0)
    small = asyncmr.AsyncPinnedMR(pool=pool)
    with acp.pinned_allocator(small) as alloc:
        with pytest.raises(acp.PinnedOutOfMemoryError) as info:
            alloc(128 * MiB)
        assert info.value.status == 2 and isinstance(info.value.__cause__, MemoryError)
        # cupy.asarray warns and copies synchronously from the pageable source instead.
        host = np.arange(128 * MiB // 8, dtype=np.float64)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            d = cp.asarray(host)
        assert any("synchronous transfer" in str(w.message) for w in caught), caught
        assert float(d[-1]) == host[-1]
        # cupyx.empty_pinned has no fallback: CuPy's own error type reaches the caller.
        with pytest.raises(cp.cuda.runtime.CUDARuntimeError):
            cupyx.empty_pinned((128 * MiB,), dtype=np.uint8)
        # The pool goes on serving what fits.
        ok = cp.asarray(np.ones(1000))
        assert float(ok.sum()) == 1000.0
        del d, ok
    flush(cp)
    assert small.attributes.used_mem_current == 0


def test_zero_bytes_and_pointer_helper(cp, owned):
    import asyncmr.cupy as acp

    alloc = acp.PinnedAllocator(owned)
    empty = alloc(0)
    assert empty.ptr == 0 and empty.size() == 0
    assert owned.attributes.used_mem_current == 0
    block = asyncmr.PinnedBlock(4096, mr=owned)
    ptr = acp.pinned_memory_pointer(block, 96)
    assert ptr.ptr == block.ptr + 96 and ptr.size() == 4000 and ptr.mem is block
    view = np.frombuffer(ptr, dtype=np.uint8)       # CuPy's pointer exposes a buffer
    view[:] = 3
    assert np.asarray(block)[96:].sum() == 3 * 4000
    with pytest.raises(ValueError, match="offset"):
        acp.pinned_memory_pointer(block, 5000)
    for bad in (True, 1.5):  # once taken as offsets 1 and 1
        with pytest.raises(TypeError, match=f"offset must be an int, got {type(bad).__name__}"):
            acp.pinned_memory_pointer(block, bad)
    del block, ptr, view
    flush(cp)
    assert owned.attributes.used_mem_current == 0
