# SPDX-License-Identifier: Apache-2.0
"""The per-stream front cache (``cache=`` on the resources): same-stream reuse, isolation of
streams (the per-thread default stream of two threads included), the cap, trim, capture
bypass, closed pools, and honest accounting."""

import threading

import pytest
import rmm
from rmm.pylibrmm.stream import PER_THREAD_DEFAULT_STREAM, Stream

import asyncmr
from asyncmr import AsyncDeviceMR, AsyncManagedMR, AsyncPinnedMR

from gpu_helpers import require_module, sync

KiB, MiB = 1 << 10, 1 << 20
MAKERS = {"pinned": AsyncPinnedMR, "device": AsyncDeviceMR, "managed": AsyncManagedMR}


def make(kind, cap=16 * MiB, **kwargs):
    return MAKERS[kind](pool="new", cache=cap, **kwargs)


def test_no_cache_by_default(gpu):
    mr = AsyncDeviceMR(pool="new")
    assert mr.cache_info is None
    mr.release_cache()  # a no-op


@pytest.mark.parametrize("kind", list(MAKERS))
def test_a_block_freed_on_a_stream_serves_the_next_allocation_there(gpu, kind):
    mr, s = make(kind), Stream()
    p = mr.allocate(4 * KiB, s)
    mr.deallocate(p, 4 * KiB, s)
    info = mr.cache_info
    assert info["blocks"] == 1 and info["bytes"] == 4 * KiB
    assert mr.allocate(4 * KiB, s) == p  # same class, same stream: the cached block
    assert mr.cache_info["hits"] == 1 and mr.cache_info["blocks"] == 0
    mr.deallocate(p, 4 * KiB, s)
    # A request of the same size class (4097..5120 bytes -> 5 KiB class) is another class.
    q = mr.allocate(4 * KiB + 1, s)
    assert q != p
    mr.deallocate(q, 4 * KiB + 1, s)
    s.synchronize()


def test_other_streams_never_get_the_block(gpu):
    mr, a, b = make("device"), Stream(), Stream()
    p = mr.allocate(64 * KiB, a)
    mr.deallocate(p, 64 * KiB, a)
    q = mr.allocate(64 * KiB, b)
    assert q != p and mr.cache_info["hits"] == 0
    mr.deallocate(q, 64 * KiB, b)
    sync()


def test_per_thread_default_streams_of_two_threads_are_two_streams(gpu):
    # cudaStreamPerThread is one handle value for a different stream in every thread.
    mr = make("pinned")
    freed = {}

    def free_one():
        p = mr.allocate(4 * KiB, PER_THREAD_DEFAULT_STREAM)
        mr.deallocate(p, 4 * KiB, PER_THREAD_DEFAULT_STREAM)
        freed["ptr"] = p
        Stream(PER_THREAD_DEFAULT_STREAM).synchronize()

    t = threading.Thread(target=free_one)
    t.start()
    t.join()
    q = mr.allocate(4 * KiB, PER_THREAD_DEFAULT_STREAM)
    assert mr.cache_info["hits"] == 0 and q != freed["ptr"]
    mr.deallocate(q, 4 * KiB, PER_THREAD_DEFAULT_STREAM)
    sync()


def test_the_cap_is_never_exceeded(gpu):
    cap = 1 * MiB
    mr, s = make("device", cap=cap), Stream()
    ptrs = [mr.allocate(64 * KiB, s) for _ in range(40)]  # 2.5 MiB live
    for p in ptrs:
        mr.deallocate(p, 64 * KiB, s)
    info = mr.cache_info
    assert info["bytes"] <= cap and info["charged_high"] <= cap
    assert info["refused_cap"] > 0  # the rest went back to the pool
    s.synchronize()
    assert mr.attributes.used_mem_current == info["bytes"]  # cached blocks count as used


def test_large_blocks_bypass_the_cache(gpu):
    mr, s = make("device", cap=64 * MiB), Stream()
    p = mr.allocate(32 * MiB, s)  # above the largest cached block (1 MiB by default)
    mr.deallocate(p, 32 * MiB, s)
    info = mr.cache_info
    assert info["blocks"] == 0 and info["hits"] == 0 and info["misses"] == 0
    s.synchronize()


def test_trim_empties_the_cache_before_the_pool(gpu):
    mr, s = make("pinned"), Stream()
    for _ in range(8):
        ptrs = [mr.allocate(256 * KiB, s) for _ in range(4)]
        for p in ptrs:
            mr.deallocate(p, 256 * KiB, s)
    assert mr.cache_info["bytes"] > 0 and mr.attributes.used_mem_current > 0
    mr.trim_to(0)
    assert mr.cache_info["bytes"] == 0 and mr.cache_info["blocks"] == 0
    assert mr.attributes.used_mem_current == 0
    assert mr.attributes.reserved_mem_current == 0


def test_a_hit_takes_nothing_new_from_the_pool(gpu):
    mr, s = make("device"), Stream()
    mr.deallocate(mr.allocate(MiB // 2, s), MiB // 2, s)  # now cached
    s.synchronize()
    with mr.track_peak() as hit_phase:
        p = mr.allocate(MiB // 2, s)  # a hit: the pool gives out nothing new
        mr.deallocate(p, MiB // 2, s)
    with mr.track_peak() as miss_phase:
        a = mr.allocate(MiB // 2, s)  # the hit again
        b = mr.allocate(MiB // 2, s)  # a miss: the pool gives out a second block
        mr.deallocate(a, MiB // 2, s)
        mr.deallocate(b, MiB // 2, s)
    # The cached block counts as used all along (the pool gave it out); a hit adds nothing.
    assert hit_phase.used == MiB // 2
    assert miss_phase.used == MiB
    assert mr.cache_info["hits"] == 2 and mr.cache_info["misses"] == 2
    s.synchronize()


@pytest.mark.parametrize("kind", ["device", "managed"])
def test_a_capture_bypasses_the_cache_and_its_blocks_stay_out(gpu, kind):
    cupy = require_module("cupy")
    mr = make(kind)
    s = cupy.cuda.Stream(non_blocking=True)
    rs = Stream(obj=s)
    warm = mr.allocate(MiB, rs)
    mr.deallocate(warm, MiB, rs)  # cached for this stream
    hits = mr.cache_info["hits"]
    with s:
        s.begin_capture(cupy.cuda.runtime.streamCaptureModeThreadLocal)
        ptr = mr.allocate(MiB, rs)  # a graph allocation node, not the cached block
        cupy.cuda.runtime.memsetAsync(ptr, 7, MiB, s.ptr)
        graph = s.end_capture()
    assert ptr != warm and mr.cache_info["hits"] == hits
    graph.launch(s)
    s.synchronize()
    mr.deallocate(ptr, MiB, rs)  # the graph's block goes back to the pool, never the cache
    assert mr.cache_info["blocks"] == 1
    s.synchronize()
    del graph


def test_a_closed_pool_serves_no_cached_block(gpu):
    mr, s = make("device"), Stream()
    mr.deallocate(mr.allocate(4 * KiB, s), 4 * KiB, s)
    assert mr.cache_info["blocks"] == 1
    refused = asyncmr.failed_deallocations()
    mr.pool.close()  # the cached block goes back to the pool, which is then destroyed
    assert mr.cache_info["blocks"] == 0, mr.cache_info
    with pytest.raises(asyncmr.PoolClosedError):
        mr.allocate(4 * KiB, s)
    del mr
    assert asyncmr.failed_deallocations() == refused, "the cache's free into the closed pool failed"
    fresh = asyncmr.AsyncDeviceMR(pool="new")
    p = fresh.allocate(4 * KiB, s)
    fresh.deallocate(p, 4 * KiB, s)
    sync()


def test_device_buffers_through_rmm_use_the_cache(gpu):
    mr, s = make("device"), Stream()
    for _ in range(100):
        buf = rmm.DeviceBuffer(size=16 * KiB, stream=s, mr=mr)
        del buf
    assert mr.cache_info["hits"] >= 99
    s.synchronize()


def test_bad_cache_caps_change_nothing(gpu):
    from asyncmr import Location, MemPool

    pool = MemPool.default(Location.host(), "pinned")
    before = pool.attributes.release_threshold
    with pytest.raises(ValueError, match="cache must be 0"):
        AsyncPinnedMR(cache=255, release_threshold=12345)
    assert pool.attributes.release_threshold == before
