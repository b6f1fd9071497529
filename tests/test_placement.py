# SPDX-License-Identifier: Apache-2.0
"""``asyncmr.prefetch`` / ``discard`` / ``discard_and_prefetch`` / ``advise``: what they accept
(checked before any CUDA call, on any machine), and on the GPU where the driver says each range
went, what memory they refuse without harming the context, and that a capture is never
touched."""

import re

import pytest
from rmm.pylibrmm.stream import Stream

import asyncmr
from asyncmr import AsyncDeviceMR, AsyncManagedMR, Location
from asyncmr._ranges import ranges

from gpu_helpers import require_module, rmm_cupy
from test_prefetch import CPU, last_prefetch, range_attribute

MiB = 1 << 20


class _Interface:
    """An object that offers the CUDA array interface (the protocol, as CuPy arrays do)."""

    def __init__(self, ptr, shape, typestr="<f4", strides=None):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape,
                                         "typestr": typestr, "strides": strides, "version": 3}


class _NoTypestr:
    """The interface without its required typestr."""

    def __init__(self, ptr, shape):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "version": 3}


# ---- what is accepted, without a GPU -----------------------------------------------------------

def test_a_pair_a_list_and_array_interfaces_become_ranges():
    assert ranges((4096, 100)) == [(4096, 100)]
    assert ranges([(4096, 100), (8192, 0)]) == [(4096, 100), (8192, 0)]
    assert ranges(_Interface(4096, (10, 3))) == [(4096, 120)]
    assert ranges(_Interface(4096, (0, 3))) == [(4096, 0)]
    # Every other row of a 10 x 4 float32 array: rows 16 bytes apart, 32 with the step.
    assert ranges(_Interface(4096, (5, 4), strides=(32, 4))) == [(4096, 4 * 32 + 16)]
    # A reversed view: it starts below its data pointer.
    assert ranges(_Interface(4096 + 36, (10,), strides=(-4,))) == [(4096, 40)]


@pytest.mark.parametrize("bad,error,match", [
    ((4096, -1), ValueError, r"size must be in \[0, 2\*\*64\) bytes, got -1"),
    ((0, 16), ValueError, r"null pointer of 16 bytes"),
    ([(4096, 1), "x"], TypeError, r"range 1 must be a \(pointer, nbytes\) pair"),
    ((4096, True), TypeError, r"the range size must be an int, got bool"),
    # A pair with a value of the wrong type is named as the pair's pointer or size.
    ((4096, 1.0), TypeError, r"the range size must be an int, got float"),
    ((4096, None), TypeError, r"the range size must be an int, got NoneType"),
    ((1.5, 64), TypeError, r"the range pointer must be an int, got float"),
    # The interface's typestr is required, and names an item of at least one byte.
    (_Interface(4096, (4,), typestr="<f0"), ValueError, r"unknown typestr '<f0'"),
    (_Interface(4096, (4,), typestr="zz8"), ValueError, r"unknown typestr 'zz8'"),
    (_NoTypestr(4096, (4,)), ValueError, r"__cuda_array_interface__ has no typestr"),
    (1.5, TypeError, r"the range must be"),
    (_Interface(4096, (2,), typestr="<x?"), ValueError, r"unknown typestr"),
    # A range past the end of the address space, alone or after a good one.
    ((2**64 - 4096, 8192), ValueError, r"ends past 2\*\*64"),
    ([(4096, 16), (2**64 - 256, 512)], ValueError, r"range 1 \(.*\) ends past 2\*\*64"),
    # A shape or strides that are not sequences, an item size of 5000 digits: named as such.
    (_Interface(4096, 8), TypeError, r"shape must be a tuple of ints, got int"),
    (_Interface(4096, (2,), strides=4), TypeError, r"strides must be None or a tuple of ints"),
    (_Interface(4096, (2,), typestr="<f" + "9" * 5000), ValueError, r"unknown typestr"),
])
def test_bad_ranges_are_refused_before_cuda(bad, error, match):
    with pytest.raises(error, match=match):
        asyncmr.prefetch(bad)
    with pytest.raises(error, match=match):
        asyncmr.discard(bad)
    with pytest.raises(error, match=match):
        asyncmr.advise(bad, "set_read_mostly")


@pytest.mark.parametrize("bad,match", [
    ((0x1000, 2**64 - 1), r"the range \(0x1000, 18446744073709551615 bytes\) ends past 2\*\*64"),
    ((2**64 - 1, 2), r"the range \(0xffffffffffffffff, 2 bytes\) ends past 2\*\*64"),
    ([(4096, 16), (2**63, 2**63 + 1)], r"range 1 \(0x8000000000000000, 9223372036854775809 "
                                       r"bytes\) ends past 2\*\*64"),
    (_Interface(2**64 - 8, (4,)), r"the range \(0xfffffffffffffff8, 16 bytes\) ends past"),
])
def test_a_range_that_wraps_past_the_end_of_the_address_space_is_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        ranges(bad)
    with pytest.raises(ValueError, match=match):
        asyncmr.prefetch(bad, to="host")
    with pytest.raises(ValueError, match=match):
        asyncmr.discard(bad)
    with pytest.raises(ValueError, match=match):
        asyncmr.advise(bad, "set_read_mostly")


def test_the_last_byte_of_the_address_space_is_a_range():
    assert ranges((2**64 - 16, 16)) == [(2**64 - 16, 16)]
    assert ranges(_Interface(2**64 - 16, (4,))) == [(2**64 - 16, 16)]


@pytest.mark.parametrize("shape,strides,match", [
    ((-1,), (4,), r"shape entries must be >= 0, got shape \(-1,\)"),
    ((-2, -2), None, r"shape entries must be >= 0, got shape \(-2, -2\)"),
    ((0, -1), None, r"shape entries must be >= 0, got shape \(0, -1\)"),
    ((0, "x"), None, r"shape must be an int, got str"),
    ((5, 4), (32,), r"strides \(32,\) do not match shape \(5, 4\)"),
    ((5,), (32, 4), r"strides \(32, 4\) do not match shape \(5,\)"),
    ((5, 4), (), r"strides \(\) do not match shape \(5, 4\)"),
])
def test_an_array_interface_with_a_bad_shape_or_strides_is_refused(shape, strides, match):
    bad = _Interface(4096, shape, strides=strides)
    with pytest.raises((ValueError, TypeError), match=match):
        ranges(bad)
    with pytest.raises((ValueError, TypeError), match=match):
        asyncmr.prefetch([(8192, 16), bad], to="host")


@pytest.mark.parametrize("data,strides,error,match", [
    # A strided view's pointer is checked as a contiguous one's is, before it is used.
    ((True, False), (1,), TypeError, r"the range pointer must be an int, got bool"),
    ((4096.0, False), (1,), TypeError, r"the range pointer must be an int, got float"),
    ((None, False), (1,), ValueError, r"the range is a null pointer of 8 bytes"),
    ((), None, ValueError, r"malformed __cuda_array_interface__ data entry"),
    ((4096, False, 1), (1,), ValueError, r"malformed __cuda_array_interface__ data entry"),
])
def test_an_array_interfaces_data_pointer_is_checked_before_it_is_used(data, strides, error,
                                                                       match):
    bad = _Interface(4096, (8,), typestr="|u1", strides=strides)
    bad.__cuda_array_interface__["data"] = data
    with pytest.raises(error, match=match):
        ranges(bad)
    with pytest.raises(error, match=match):
        asyncmr.prefetch(bad, to="host")


def test_numpy_integers_are_taken_as_ranges_and_targets():
    np = pytest.importorskip("numpy")
    assert ranges((np.uint64(4096), np.int32(16))) == [(4096, 16)]
    assert ranges(_Interface(np.uint64(4096), (np.int64(2),))) == [(4096, 8)]
    assert all(type(v) is int for v in ranges((np.uint64(4096), np.int32(16)))[0])
    with pytest.raises(TypeError, match=r"the range pointer must be an int, got numpy\.bool"):
        ranges((np.bool_(True), 16))


@pytest.mark.parametrize("call", [
    lambda: asyncmr.prefetch((4096, 16), stream=None),
    lambda: asyncmr.discard_and_prefetch((4096, 16), stream=None),
    lambda: asyncmr.discard((4096, 16), stream=None),
])
def test_a_missing_stream_is_refused_before_cuda(call):
    # to="device" asks the driver which device is current: the stream is checked first.
    with pytest.raises(TypeError, match="stream"):
        call()


@pytest.mark.parametrize("typestr", ["<f-4", "<f+4", "<f 4", "<f\u0664"])
def test_an_array_interface_item_size_must_be_decimal_digits(typestr):
    with pytest.raises(ValueError, match=rf"unknown typestr {re.escape(repr(typestr))}"):
        ranges(_Interface(4096, (3,), typestr=typestr, strides=(4,)))


def test_a_bad_target_is_refused_before_cuda():
    with pytest.raises(ValueError, match=r'to must be "device", a device ordinal, "host"'):
        asyncmr.prefetch((4096, 16), to="gpu")
    with pytest.raises(TypeError, match=r"to must be .*got True \(bool\)"):
        asyncmr.discard_and_prefetch((4096, 16), to=True)
    with pytest.raises(ValueError, match=r"to must be in \[0, 2\*\*31\), got -1"):
        asyncmr.prefetch((4096, 16), to=-1)
    with pytest.raises(ValueError, match=r'to must be "device", a device ordinal, "host"'):
        asyncmr.advise((4096, 16), "set_preferred_location", to="gpu")
    # A Location that is neither a device nor the host is named as the argument it came in.
    for call in (lambda: asyncmr.prefetch((4096, 16), to=Location.none()),
                 lambda: asyncmr.discard_and_prefetch((4096, 16), to=Location.none()),
                 lambda: asyncmr.advise((4096, 16), "set_read_mostly", to=Location.none())):
        with pytest.raises(ValueError, match=r"to must be a device or the host, got none$"):
            call()
    with pytest.raises(ValueError, match=r"prefetch must be a device or the host, got none$"):
        asyncmr.AsyncManagedMR(prefetch=Location.none())


@pytest.mark.parametrize("advice", ["prefer_gpu", "SetReadMostly", ""])
def test_an_unknown_advice_is_refused_before_cuda(advice):
    with pytest.raises(ValueError, match=r"advice must be one of \('set_read_mostly', .*"
                                         rf"got {re.escape(repr(advice))}$"):
        asyncmr.advise((4096, 16), advice)


@pytest.mark.parametrize("advice", [2, None, True, b"set_read_mostly", ["set_read_mostly"],
                                    asyncmr.LocationKind.host])
def test_an_advice_of_the_wrong_type_is_a_type_error(advice):
    # As to=0.0 is: TypeError naming the type, before any CUDA call (an advice is a name).
    name = asyncmr._validate.type_name(advice)
    with pytest.raises(TypeError, match=r"advice must be one of \('set_read_mostly', .*"
                                        rf"got {re.escape(name)}$"):
        asyncmr.advise((4096, 16), advice)


# ---- on the GPU ---------------------------------------------------------------------------------

@pytest.mark.parametrize("to,expected", [("device", 0), (0, 0), ("host", CPU),
                                         (Location.host(), CPU)])
def test_prefetch_sends_every_range_where_asked(gpu, to, expected):
    mr = AsyncManagedMR(pool="new")
    s = Stream()
    blocks = [mr.allocate(MiB, s) for _ in range(3)]
    asyncmr.prefetch([(p, MiB) for p in blocks], to=to, stream=s)
    s.synchronize()
    assert [last_prefetch(p, MiB) for p in blocks] == [expected] * 3
    for p in blocks:
        mr.deallocate(p, MiB, s)
    s.synchronize()


def test_prefetch_takes_cupy_arrays_on_managed_memory(gpu):
    cupy = require_module("cupy")
    mr = AsyncManagedMR(pool="new")
    with rmm_cupy(mr):
        x = cupy.arange(1 << 20, dtype=cupy.float32)
        asyncmr.prefetch(x, to="host")
        cupy.cuda.runtime.deviceSynchronize()
        assert last_prefetch(x.data.ptr, x.nbytes) == CPU
        asyncmr.prefetch([x[::2], x[1::2]], to="device")
        cupy.cuda.runtime.deviceSynchronize()
        assert last_prefetch(x.data.ptr, x.nbytes) == 0
        assert float(x[-1]) == float((1 << 20) - 1)
        del x


def test_device_memory_is_refused_and_the_context_keeps_working(gpu):
    mr = AsyncDeviceMR(pool="new")
    s = Stream()
    p = mr.allocate(MiB, s)
    with pytest.raises(ValueError, match="not managed memory"):
        asyncmr.prefetch((p, MiB), stream=s)
    q = mr.allocate(MiB, s)  # the context is fine
    for b in (p, q):
        mr.deallocate(b, MiB, s)
    s.synchronize()


def test_a_capturing_stream_is_refused_and_the_capture_stays_valid(gpu):
    cupy = require_module("cupy")
    mr = AsyncManagedMR(pool="new")
    cs = cupy.cuda.Stream(non_blocking=True)
    rs = Stream(obj=cs)
    p = mr.allocate(MiB, rs)
    cs.synchronize()
    buf = cupy.zeros(16, dtype=cupy.int32)
    with cs:
        cs.begin_capture(cupy.cuda.runtime.streamCaptureModeThreadLocal)
        buf.fill(3)
        with pytest.raises(asyncmr.UnsupportedError, match="capturing stream"):
            asyncmr.prefetch((p, MiB), stream=rs)
        graph = cs.end_capture()
    graph.launch(cs)
    cs.synchronize()
    assert int(buf[0]) == 3
    mr.deallocate(p, MiB, rs)
    cs.synchronize()


def test_discard_then_write_and_discard_and_prefetch(gpu):
    cupy = require_module("cupy")
    if not asyncmr.can_discard():
        with pytest.raises(asyncmr.UnsupportedError, match="CUDA 13 build"):
            asyncmr.discard((4096, 16))
        return
    mr = AsyncManagedMR(pool="new")
    cs = cupy.cuda.Stream(non_blocking=True)
    s = Stream(obj=cs)
    p = mr.allocate(2 * MiB, s)
    asyncmr.discard((p, 2 * MiB), stream=s)
    cupy.cuda.runtime.memsetAsync(p, 7, 2 * MiB, cs.ptr)  # written after the discard: defined
    asyncmr.discard_and_prefetch([(p, MiB), (p + MiB, MiB)], to="host", stream=s)
    cs.synchronize()
    assert last_prefetch(p, 2 * MiB) == CPU
    mr.deallocate(p, 2 * MiB, s)
    cs.synchronize()


# ---- advice ---------------------------------------------------------------------------------

def _preferred_location(ptr, nbytes):
    return range_attribute(ptr, nbytes, "cudaMemRangeAttributePreferredLocation")


@pytest.mark.parametrize("advice", asyncmr.ADVICE)
def test_managed_pool_memory_takes_no_advice_and_the_message_names_what_works(gpu, advice):
    # docs/DRIVER_FACTS.md: driver 580 refuses every kind on managed pool memory. A driver that
    # starts to take advice fails this test, and the table and the message must change with it.
    mr = AsyncManagedMR(pool="new")
    s = Stream()
    p = mr.allocate(MiB, s)
    s.synchronize()
    with pytest.raises(asyncmr.UnsupportedError,
                       match=rf"advise\({advice}\) of range 0 \(1048576 bytes\): the driver takes "
                             r"no advice .*AsyncManagedMR\(location=\.\.\.\)\), set_access, or "
                             r"prefetch"):
        asyncmr.advise((p, MiB), advice, to="device")
    q = mr.allocate(MiB, s)  # the context is fine
    for b in (p, q):
        mr.deallocate(b, MiB, s)
    s.synchronize()


def test_cuda_malloc_managed_memory_takes_every_advice(gpu):
    import rmm

    buf = rmm.DeviceBuffer(size=2 * MiB, mr=rmm.mr.ManagedMemoryResource())
    asyncmr.advise(buf, "set_preferred_location", to="host")
    assert _preferred_location(buf.ptr, buf.size) == CPU
    asyncmr.advise((buf.ptr, buf.size), "set_preferred_location", to=0)
    assert _preferred_location(buf.ptr, buf.size) == 0
    for advice in asyncmr.ADVICE:
        asyncmr.advise([(buf.ptr, MiB), (buf.ptr + MiB, MiB)], advice, to="device")
    # unset_accessed_by came last; unset_preferred_location before it cleared the preference.
    assert _preferred_location(buf.ptr, buf.size) == -2  # cudaInvalidDeviceId: none set


def test_advice_on_device_memory_is_refused_and_the_context_keeps_working(gpu):
    mr = AsyncDeviceMR(pool="new")
    s = Stream()
    p = mr.allocate(MiB, s)
    s.synchronize()
    with pytest.raises((ValueError, asyncmr.UnsupportedError), match=r"advise\(set_read_mostly\)"):
        asyncmr.advise((p, MiB), "set_read_mostly")
    q = mr.allocate(MiB, s)
    for b in (p, q):
        mr.deallocate(b, MiB, s)
    s.synchronize()


def test_advice_during_another_threads_capture_leaves_it_valid(gpu):
    import threading

    import rmm

    cupy = require_module("cupy")
    buf = rmm.DeviceBuffer(size=MiB, mr=rmm.mr.ManagedMemoryResource())
    cs = cupy.cuda.Stream(non_blocking=True)
    out = cupy.zeros(16, dtype=cupy.int32)
    errors = []
    with cs:
        cs.begin_capture(cupy.cuda.runtime.streamCaptureModeGlobal)
        out.fill(5)

        def other():
            try:
                asyncmr.advise(buf, "set_accessed_by", to="device")
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        graph = cs.end_capture()
    assert not errors, errors
    graph.launch(cs)
    cs.synchronize()
    assert int(out[0]) == 5
