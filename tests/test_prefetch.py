# SPDX-License-Identifier: Apache-2.0
"""``AsyncManagedMR(prefetch=...)``: every allocation, cache hits too, is prefetched on its own
stream to the target the resource names; never on a capturing stream; the driver is asked where
each range was last sent (``cudaMemRangeGetAttribute(LastPrefetchLocation)``)."""

import pytest
from rmm.pylibrmm.stream import Stream

import asyncmr
from asyncmr import AsyncManagedMR, Location

from gpu_helpers import captured_elsewhere, not_applicable, require_module

MiB = 1 << 20
CPU = -1  # cudaCpuDeviceId: what LastPrefetchLocation answers for the host


def last_prefetch(ptr, nbytes):
    return range_attribute(ptr, nbytes, "cudaMemRangeAttributeLastPrefetchLocation")


def range_attribute(ptr, nbytes, name):
    """A device-ordinal attribute of a managed range (cudaMemRangeGetAttribute), as an int."""
    cudart = require_module("cuda.bindings.runtime", "the test asks the driver about a range")
    attr = getattr(cudart.cudaMemRangeAttribute, name)
    err, value = cudart.cudaMemRangeGetAttribute(4, attr, ptr, nbytes)
    assert err == cudart.cudaError_t.cudaSuccess, err
    return int.from_bytes(value if isinstance(value, bytes) else int(value).to_bytes(
        4, "little", signed=True), "little", signed=True)


def prefetch_by_hand(ptr, nbytes, device, stream):
    """Sends a range somewhere else with the runtime (to see the resource send it back)."""
    cudart = require_module("cuda.bindings.runtime", "the test moves a range by hand")
    if asyncmr.runtime_version() >= 13000:
        loc = cudart.cudaMemLocation()
        loc.type = (cudart.cudaMemLocationType.cudaMemLocationTypeHost if device == CPU
                    else cudart.cudaMemLocationType.cudaMemLocationTypeDevice)
        loc.id = 0 if device == CPU else device
        (err,) = cudart.cudaMemPrefetchAsync(ptr, nbytes, loc, 0, stream)
    else:
        (err,) = cudart.cudaMemPrefetchAsync(ptr, nbytes, device, stream)
    assert err == cudart.cudaError_t.cudaSuccess, err


@pytest.mark.parametrize("target,expected", [("device", 0), (0, 0), ("host", CPU),
                                             (Location.host(), CPU)])
def test_every_allocation_goes_to_the_target(gpu, target, expected):
    mr = AsyncManagedMR(pool="new", prefetch=target)
    s = Stream()
    failed = asyncmr.failed_prefetches()
    p = mr.allocate(2 * MiB, s)
    s.synchronize()
    assert last_prefetch(p, 2 * MiB) == expected
    assert asyncmr.failed_prefetches() == failed
    assert mr.prefetch == (Location.host() if expected == CPU else Location.device(0))
    mr.deallocate(p, 2 * MiB, s)
    s.synchronize()


def test_a_cache_hit_is_prefetched_again(gpu):
    cupy = require_module("cupy")
    mr = AsyncManagedMR(pool="new", cache=64 << 20, prefetch="host")
    cs = cupy.cuda.Stream(non_blocking=True)
    s = Stream(obj=cs)
    p = mr.allocate(MiB, s)
    mr.deallocate(p, MiB, s)  # kept by the cache
    prefetch_by_hand(p, MiB, 0, cs.ptr)
    s.synchronize()
    assert last_prefetch(p, MiB) == 0
    q = mr.allocate(MiB, s)  # the same block, from the cache
    assert q == p and mr.cache_info["hits"] == 1
    s.synchronize()
    assert last_prefetch(q, MiB) == CPU, "the hit was not prefetched"
    mr.deallocate(q, MiB, s)
    s.synchronize()


def test_no_prefetch_by_default(gpu):
    assert AsyncManagedMR(pool="new").prefetch is None


def test_an_allocation_inside_a_capture_is_not_prefetched_and_the_capture_stays_valid(gpu):
    cupy = require_module("cupy")
    mr = AsyncManagedMR(pool="new", prefetch="device")
    cs = cupy.cuda.Stream(non_blocking=True)
    rs = Stream(obj=cs)
    with cs:
        cs.begin_capture(cupy.cuda.runtime.streamCaptureModeThreadLocal)
        g = mr.allocate(MiB, rs)  # a graph allocation: no prefetch (it would invalidate)
        mr.deallocate(g, MiB, rs)
        graph = cs.end_capture()  # raises if the capture was invalidated
    graph.launch(cs)
    cs.synchronize()


@pytest.mark.parametrize("call", ["prefetch", "discard_and_prefetch"])
def test_placement_beside_another_threads_global_capture_leaves_it_valid(gpu, call):
    """PyTorch captures in global mode: a prefetch on another, non-capturing stream, made while
    that capture runs, must neither be refused nor invalidate it (relaxed capture mode, as every
    pool call; allocations beside such a capture: test_cache_soundness.py)."""
    cupy = require_module("cupy")
    if call == "discard_and_prefetch" and not asyncmr.can_discard():
        not_applicable("discard_and_prefetch needs the CUDA 13 build")
    mr = AsyncManagedMR(pool="new", prefetch="device")
    s = Stream()
    p = mr.allocate(MiB, s)
    s.synchronize()
    with captured_elsewhere(cupy, "global") as outcome:
        if call == "prefetch":
            asyncmr.prefetch((p, MiB), "host", stream=s)
        else:
            asyncmr.discard_and_prefetch((p, MiB), "device", stream=s)
    assert outcome["capture"] == "valid", outcome
    s.synchronize()
    mr.deallocate(p, MiB, s)
    s.synchronize()


def test_discard_places_each_allocation_and_keeps_its_neighbours_bytes(gpu):
    """``discard=True``: an allocation's old contents are dropped as it is prefetched; a block
    sharing a 4 KiB page with it keeps every byte (the driver drops only whole pages inside the
    range: ci/probes/discard_facts.cu). The CUDA 12 build refuses the option."""
    import ctypes

    if not asyncmr.can_discard():
        with pytest.raises(asyncmr.UnsupportedError, match="discard needs the CUDA 13 build"):
            AsyncManagedMR(pool="new", prefetch="device", discard=True)
        return
    mr = AsyncManagedMR(pool="new", prefetch="device", discard=True)
    assert mr.discard is True and mr.prefetch == Location.device(0)
    s = Stream()
    failed = asyncmr.failed_prefetches()
    small = 3000  # blocks 3072 bytes apart: most 4 KiB pages are shared
    first = mr.allocate(small, s)
    s.synchronize()
    expected = bytes((i * 7 + 3) & 0xFF for i in range(small))
    ctypes.memmove(first, expected, small)  # the host writes it
    others = [mr.allocate(small, s) for _ in range(8)]  # each one discarded and prefetched
    s.synchronize()

    def pages(p):
        return set(range(p // 4096, (p + small - 1) // 4096 + 1))

    assert any(pages(o) & pages(first) for o in others), "no neighbour shares a page: proves nothing"
    assert ctypes.string_at(first, small) == expected, "a neighbour's discard dropped its bytes"
    assert last_prefetch(others[0], small) == 0
    big = mr.allocate(8 * MiB, s)  # pool memory the host touches, freed, allocated again
    s.synchronize()
    ctypes.memset(big, 1, 8 * MiB)
    mr.deallocate(big, 8 * MiB, s)
    again = mr.allocate(8 * MiB, s)
    s.synchronize()
    assert last_prefetch(again, 8 * MiB) == 0
    assert asyncmr.failed_prefetches() == failed
    for p in [again, *others, first]:
        mr.deallocate(p, 8 * MiB if p == again else small, s)
    s.synchronize()


def test_discard_on_the_legacy_default_stream_places_the_allocation_or_says_why(gpu):
    """What RMM, CuPy's null stream and cuDF use when no stream is named: the driver's batched
    discards refuse the legacy NULL stream (its header says "must not be legacy NULL stream").
    An allocation there is still placed (prefetched, never silently left where it was), and the
    placement calls either work or raise UnsupportedError naming the stream, never a wrong
    "not managed memory"."""
    if not asyncmr.can_discard():
        pytest.skip("not applicable: discard needs the CUDA 13 build")
    mr = AsyncManagedMR(pool="new", prefetch="device", discard=True)
    failed = asyncmr.failed_prefetches()
    p = mr.allocate(2 * MiB)  # no stream named: the legacy default stream
    Stream().synchronize()
    cudart = require_module("cuda.bindings.runtime", "the test waits for the legacy stream")
    cudart.cudaStreamSynchronize(0)
    assert last_prefetch(p, 2 * MiB) == 0, "the allocation was not placed"
    assert asyncmr.failed_prefetches() == failed
    for call in (lambda: asyncmr.discard((p, 2 * MiB)),
                 lambda: asyncmr.discard_and_prefetch((p, 2 * MiB), to="device")):
        try:
            call()
        except asyncmr.UnsupportedError as e:
            assert "legacy default stream" in str(e), e
    cudart.cudaStreamSynchronize(0)
    mr.deallocate(p, 2 * MiB)
    cudart.cudaStreamSynchronize(0)


def test_discard_is_off_by_default(gpu):
    assert AsyncManagedMR(pool="new", prefetch="device").discard is False
