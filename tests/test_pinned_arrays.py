# SPDX-License-Identifier: Apache-2.0
"""NumPy arrays on pool-pinned memory (asyncmr.pinned_empty and friends).

CPU tests: bad input raises a clear exception before anything touches CUDA (on a machine
without a GPU, reaching CUDA would raise NoDeviceError instead). GPU tests: the arrays live in
the pool (its used bytes rise and fall back when they die), copies from and into them with
CuPy and with explicit-kind cudaMemcpyAsync carry the right data.
"""

import copy
import ctypes
import gc
import pickle
import re
import sys
import threading

import numpy as np
import pytest

import asyncmr
from asyncmr import pinned_empty, pinned_empty_like, pinned_full, pinned_full_like
from asyncmr import pinned_zeros, pinned_zeros_like

MiB = 1 << 20


@pytest.fixture
def cp(gpu):
    # The GPU host has CuPy: missing it there is a failure, not a skip.
    import cupy

    return cupy


@pytest.fixture
def owned(gpu):
    """An AsyncPinnedMR on a pool of its own, so its used bytes are this test's alone."""
    return asyncmr.AsyncPinnedMR(pool="new")


def settle(cupy):
    """Every queued stream-ordered free has run (asyncmr's private streams included)."""
    gc.collect()
    cupy.cuda.runtime.deviceSynchronize()


# ---- validation (CPU) --------------------------------------------------------------------

BAD = [
    (lambda: pinned_empty(-1), ValueError, "negative dimensions"),
    (lambda: pinned_empty((2, -3)), ValueError, "negative dimensions"),
    (lambda: pinned_empty(2.5), TypeError, "shape"),
    (lambda: pinned_empty((2, "a")), TypeError, "shape entries"),
    (lambda: pinned_empty(True), TypeError, "bool"),
    (lambda: pinned_empty(4, dtype="not-a-dtype"), TypeError, "not a NumPy data type"),
    (lambda: pinned_empty(4, dtype=object), TypeError, "Python objects"),
    (lambda: pinned_empty(4, order="X"), ValueError, "order"),
    (lambda: pinned_empty(4, mr="pinned"), TypeError, "AsyncPinnedMR"),
    (lambda: pinned_empty(4, mr=object()), TypeError, "AsyncPinnedMR"),
    (lambda: pinned_empty(4, stream="s"), TypeError, "stream"),
    (lambda: pinned_empty(4, synchronize=False), ValueError, "explicit stream"),
    (lambda: pinned_empty(4, synchronize=1), TypeError, "synchronize"),
    (lambda: pinned_empty((1 << 40, 1 << 40)), ValueError, "too big"),
    (lambda: pinned_empty((1,) * 70), ValueError, "70 dimensions"),
    (lambda: pinned_zeros((1,) * 60, dtype=("f4", (1,) * 10)), ValueError, "70 dimensions"),
    (lambda: pinned_full((1,) * 64 + (2,), 0.0), ValueError, "65 dimensions"),
    (lambda: pinned_zeros(-2), ValueError, "negative dimensions"),
    (lambda: pinned_full(3, "abc", dtype=np.float64), ValueError, "fill_value"),
    (lambda: pinned_full((3,), [1, 2]), ValueError, "fill_value"),
    # As numpy.full: an integer the item type cannot hold is refused, not wrapped.
    (lambda: pinned_full(4, -1, dtype=np.uint8), OverflowError, "-1 out of bounds for uint8"),
    (lambda: pinned_full(4, 300, dtype=np.uint8), OverflowError, "300 out of bounds for uint8"),
    (lambda: pinned_full(4, 2**70, dtype=np.int64), OverflowError, "fill_value"),
    (lambda: pinned_empty_like(np.zeros(3), order="Q"), ValueError, "order"),
    (lambda: pinned_zeros_like(np.zeros(3), shape=(-1,)), ValueError, "negative"),
    (lambda: asyncmr.PinnedBlock(-1), ValueError, "nbytes"),
    (lambda: asyncmr.PinnedBlock(1.0), TypeError, "nbytes"),
]


@pytest.mark.parametrize("call,exc,match", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_input_is_refused_before_cuda(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("shape,fill", [((1,), [1, 2, 3]), ((2, 1), [[1, 2], [3, 4]]),
                                        ((3,), np.zeros((2, 3))), (4, np.ones((1, 4, 1)))])
def test_a_fill_value_that_does_not_broadcast_to_the_shape_is_refused(shape, fill):
    # Broadcast together, the two shapes agree; the array would need a bigger shape than asked.
    dims = np.shape(fill)
    with pytest.raises(ValueError, match=rf"fill_value of shape {re.escape(str(dims))} cannot "
                                         rf"be broadcast to the array's shape "):
        pinned_full(shape, fill)


def test_a_subarray_dtypes_fill_value_broadcasts_to_the_expanded_shape():
    with pytest.raises(ValueError, match=r"fill_value of shape \(3,\) cannot be broadcast to "
                                         r"the array's shape \(3, 2\)"):
        pinned_full(3, [1, 2, 3], ("f4", (2,)))


@pytest.mark.parametrize("shape", [
    {}, {3: "a"}, {0: "a"}, {2, 3}, {0}, frozenset({0}), iter([0]), (d for d in (2, 0)),
    b"\x02", b"", bytearray(b"\x02\x03"), memoryview(b"\x02"), memoryview(b""),
    memoryview(np.array([2, 3])),
], ids=["empty-dict", "dict", "dict-0", "set", "set-0", "frozenset", "iterator", "generator",
        "bytes", "empty-bytes", "bytearray", "memoryview", "empty-memoryview",
        "memoryview-of-ints"])
def test_a_shape_that_is_not_a_sequence_of_ints_is_refused(shape):
    # numpy.empty refuses the first eight ("expected a sequence of integers or a single
    # integer"): a mapping's keys, a set's items in no set order, an iterator used up by the
    # check. It reads a buffer's items as dimensions (b"\x02" is shape (2,), b"" shape ()): here
    # a buffer is refused as one passed where a shape was meant, as accessible_from refuses
    # bytes for a list of devices (asyncmr._validate.items).
    for call in (pinned_empty, pinned_zeros, lambda s: pinned_full(s, 0.0),
                 lambda s: pinned_empty_like(np.zeros(0), shape=s),
                 lambda s: asyncmr.PinnedBlock(0).as_array(s, np.uint8)):
        with pytest.raises(TypeError, match=r"shape must be an int or a sequence of ints, got "
                                            rf"{type(shape).__name__}$"):
            call(shape)


@pytest.mark.parametrize("order", ["", "cf", "CF", "FC", "AK", "FA", "KA", "CA", "A", "K", "Ca",
                                   None, 1, b"C"])
def test_an_order_other_than_c_or_f_is_refused_naming_it(order):
    for call in (pinned_empty, pinned_zeros, lambda shape, order: pinned_full(shape, 0, None,
                                                                             order)):
        with pytest.raises(ValueError, match=rf"order must be one of \('C', 'F'\), got "
                                             rf"{re.escape(repr(order))}$"):
            call(4, order=order)


@pytest.mark.parametrize("order", ["", "cf", "AK", "FA", "CK", "KK", "Q", None, 0])
def test_a_like_order_other_than_c_f_a_or_k_is_refused_naming_it(order):
    for call in (pinned_empty_like, pinned_zeros_like,
                 lambda p, order: pinned_full_like(p, 0, order=order)):
        with pytest.raises(ValueError, match=rf"order must be one of \('C', 'F', 'A', 'K'\), "
                                             rf"got {re.escape(repr(order))}$"):
            call(np.zeros(3), order=order)


@pytest.mark.parametrize("order,c_prototype,f_prototype", [
    ("c", "C", "C"), ("f", "F", "F"), ("a", "C", "F"), ("k", "C", "F"), ("K", "C", "F")])
def test_like_orders_are_read_in_either_case_as_numpy_does(order, c_prototype, f_prototype):
    c, f = np.zeros((2, 3)), np.asfortranarray(np.zeros((2, 3)))
    assert asyncmr.pinned._like(c, None, order, None)[2] == c_prototype
    assert asyncmr.pinned._like(f, None, order, None)[2] == f_prototype


# A block over an ordinary host buffer: PinnedBlock's own layout code without a GPU. A
# zero-byte block allocates nothing (it reaches no CUDA call); its pointer and size are then
# pointed at the buffer, and back to nothing before it dies, so that it frees nothing.
_HOST_BUFFER = (ctypes.c_uint8 * 4096)()


@pytest.fixture
def host_block():
    block = asyncmr.PinnedBlock._new(0, "a host buffer", None, True)
    block.ptr, block.size = ctypes.addressof(_HOST_BUFFER), len(_HOST_BUFFER)
    yield block
    gc.collect()
    block.ptr, block.size = 0, 0


def test_a_block_over_a_host_buffer_gives_views_of_it(host_block):
    a = host_block.as_array((4, 8), np.int32, order="F")
    assert a.base is host_block and a.shape == (4, 8) and a.flags.f_contiguous
    assert a.ctypes.data == host_block.ptr
    u = np.asarray(host_block)
    assert u.base is host_block and u.shape == (4096,) and u.dtype == np.uint8
    assert host_block.as_array((4, 8), np.int32, order="f").flags.f_contiguous
    for order in ("A", "K", "", "CF", "fc"):
        with pytest.raises(ValueError, match=rf"order must be one of \('C', 'F'\), got "
                                             rf"{order!r}$"):
            host_block.as_array((4, 8), np.int32, order=order)
    aligned = np.dtype([("x", "i4"), ("y", "f8")], align=True)
    s = host_block.as_array((3,), aligned)
    assert s.dtype == aligned and s.shape == (3,) and s.ctypes.data == host_block.ptr


@pytest.mark.parametrize("how", ["copy", "deepcopy"] + [f"pickle-{p}" for p in
                                                          range(pickle.HIGHEST_PROTOCOL + 1)])
def test_a_block_is_never_copied_or_pickled(host_block, how):
    # A copy would be a second owner of the allocation: each frees it when it dies, and the
    # second free goes to memory the pool may have handed to someone else by then (a pickle
    # names the address in another process). The empty block is refused alike.
    for block in (host_block, asyncmr.PinnedBlock(0)):
        with pytest.raises(TypeError, match="PinnedBlock .*cannot be copied or pickled"):
            if how == "copy":
                copy.copy(block)
            elif how == "deepcopy":
                copy.deepcopy(block)
            else:
                pickle.dumps(block, protocol=int(how.split("-")[1]))


def test_threads_viewing_one_block_each_get_the_layout_they_asked_for(host_block):
    # (shape, dtype, order) for as_array; None for numpy.asarray(block), its uint8 view.
    layouts = [((8, 4), np.dtype(np.float64), "C"), ((5, 3), np.dtype(np.int16), "F"),
               None, ((64,), np.dtype(np.uint8), "C"), ((2, 3, 4), np.dtype(np.float32), "F"),
               ((7,), np.dtype(np.complex128), "C")]
    threads, calls = 4, 25_000
    start = threading.Barrier(threads)
    wrong: list[str] = []

    def view(k):
        start.wait()
        for i in range(calls):
            layout = layouts[(i + k) % len(layouts)]
            if layout is None:
                shape, dtype, order = (4096,), np.dtype(np.uint8), "C"
            else:
                shape, dtype, order = layout
            try:
                a = np.asarray(host_block) if layout is None else host_block.as_array(*layout)
            except Exception as e:  # another call's layout can make the view raise
                wrong.append(f"asked {shape} {dtype} {order}, got {type(e).__name__}: {e}")
                continue
            laid_out = a.flags.f_contiguous if order == "F" else a.flags.c_contiguous
            if a.shape != shape or a.dtype != dtype or not laid_out or a.base is not host_block:
                wrong.append(f"asked {shape} {dtype} {order}, got {a.shape} {a.dtype} "
                             f"strides {a.strides}")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        workers = [threading.Thread(target=view, args=(k,)) for k in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not wrong, (f"{len(wrong)} of {threads * calls} views had another call's layout: "
                       f"{wrong[:3]}")


def test_non_pinned_asyncmr_resource_is_refused_by_type(gpu):
    before = asyncmr.MemPool.default(asyncmr.Location.device(0), "device").attributes
    used = before.used_mem_current
    with pytest.raises(TypeError, match="AsyncPinnedMR.*got AsyncDeviceMR"):
        pinned_empty(16, mr=asyncmr.AsyncDeviceMR())
    assert before.used_mem_current == used


# ---- on the GPU ----------------------------------------------------------------------------

def test_arrays_are_numpy_arrays_on_the_pool(cp, owned):
    used0 = owned.attributes.used_mem_current
    a = pinned_empty((256, 512), np.float32, mr=owned)
    assert type(a) is np.ndarray and a.shape == (256, 512) and a.dtype == np.float32
    assert a.flags.c_contiguous and a.flags.writeable
    assert isinstance(a.base, asyncmr.PinnedBlock) and a.base.mr is owned
    assert owned.attributes.used_mem_current >= used0 + a.nbytes
    # To CUDA it is host memory (cudaMemoryTypeHost == 1).
    assert cp.cuda.runtime.pointerGetAttributes(a.ctypes.data).type == 1
    f = pinned_zeros((3, 5), np.int64, order="F", mr=owned)
    assert f.flags.f_contiguous and not f.flags.c_contiguous and (f == 0).all()
    v = pinned_full((4,), 7.5, mr=owned)
    assert v.dtype == np.float64 and (v == 7.5).all()
    del a, f, v
    settle(cp)
    assert owned.attributes.used_mem_current == used0


def test_like_variants_follow_numpy(cp, owned):
    c = np.zeros((6, 4), np.int16)
    fort = np.asfortranarray(np.zeros((6, 4), np.float32))
    e = pinned_empty_like(c, mr=owned)
    assert e.shape == c.shape and e.dtype == c.dtype and e.flags.c_contiguous
    k = pinned_zeros_like(fort, mr=owned)
    assert k.flags.f_contiguous and (k == 0).all()
    d = cp.arange(10, dtype=cp.float32)
    fl = pinned_full_like(d, 3, mr=owned)  # a CuPy prototype: only shape and dtype are read
    assert fl.shape == (10,) and fl.dtype == np.float32 and (fl == 3).all()
    s = pinned_empty_like(c, dtype=np.float64, shape=(2, 3), mr=owned)
    assert s.shape == (2, 3) and s.dtype == np.float64


def test_structured_and_subarray_dtypes(cp, owned):
    aligned = np.dtype([("x", "i4"), ("y", "f8")], align=True)
    a = pinned_zeros(5, aligned, mr=owned)
    assert a.dtype == aligned and a.shape == (5,)
    a["y"] = 1.5
    assert (a["y"] == 1.5).all() and (a["x"] == 0).all()
    b = pinned_empty((3,), ("f4", (2,)), mr=owned)  # NumPy expands the subarray
    assert b.shape == (3, 2) and b.dtype == np.float32
    c = pinned_full(3, [1.0, 2.0], ("f4", (2,)), mr=owned)  # as numpy.full fills it
    np.testing.assert_array_equal(c, np.full(3, [1.0, 2.0], ("f4", (2,))))


def test_zero_size_arrays_allocate_nothing(cp, owned):
    used0 = owned.attributes.used_mem_current
    z = pinned_empty((0, 5), np.float64, mr=owned)
    assert z.shape == (0, 5) and z.size == 0
    assert pinned_zeros(0, mr=owned).shape == (0,)
    assert owned.attributes.used_mem_current == used0


def test_bad_input_on_gpu_allocates_nothing(cp, owned):
    used0 = owned.attributes.used_mem_current
    for call in (lambda: pinned_empty(-1, mr=owned),
                 lambda: pinned_empty(4, dtype=object, mr=owned),
                 lambda: pinned_full(3, "abc", dtype=np.float64, mr=owned),
                 lambda: pinned_empty(4, mr=owned, synchronize=False)):
        with pytest.raises((TypeError, ValueError)):
            call()
    assert owned.attributes.used_mem_current == used0


def test_cupy_copies_from_and_into_pinned_arrays(cp, owned):
    n = 1 << 20
    h = pinned_empty(n, np.float64, mr=owned)
    h[:] = np.arange(n, dtype=np.float64)
    d = cp.asarray(h)                       # CuPy sees pinned memory: an async H2D from it
    assert float(d[n - 1]) == n - 1
    out = pinned_empty_like(h, mr=owned)
    (d * 3).get(out=out)                    # D2H into pinned memory
    np.testing.assert_array_equal(out, np.arange(n, dtype=np.float64) * 3)
    d2 = cp.empty(n, dtype=cp.float64)
    d2.set(out)                             # H2D from pinned memory
    cp.testing.assert_array_equal(d2, d * 3)
    back = d2.get()                         # into pageable memory, for comparison
    np.testing.assert_array_equal(back, out)


def test_explicit_kind_memcpy_async(cp, owned):
    rt = cp.cuda.runtime
    n = 1 << 18
    stream = cp.cuda.Stream(non_blocking=True)
    src = pinned_full(n, 42, dtype=np.int32, mr=owned, stream=stream)
    dst = pinned_zeros(n, np.int32, mr=owned, stream=stream)
    d = cp.empty(n, dtype=cp.int32)
    rt.memcpyAsync(d.data.ptr, src.ctypes.data, src.nbytes, rt.memcpyHostToDevice, stream.ptr)
    with stream:
        d += 1
    rt.memcpyAsync(dst.ctypes.data, d.data.ptr, dst.nbytes, rt.memcpyDeviceToHost, stream.ptr)
    stream.synchronize()
    assert (dst == 43).all()
    assert src.base.stream.__cuda_stream__()[1] == stream.ptr  # allocated (and freed) there


def test_unsynchronized_allocation_on_a_stream(cp, owned):
    stream = cp.cuda.Stream(non_blocking=True)
    a = pinned_empty(1024, np.uint8, mr=owned, stream=stream, synchronize=False)
    stream.synchronize()                    # the caller's part of the stream rule
    a[:] = 5
    assert (a == 5).all()


def test_pool_bytes_rise_and_fall_with_the_arrays(cp, owned):
    used0 = owned.attributes.used_mem_current
    arrays = [pinned_empty(MiB, np.uint8, mr=owned) for _ in range(8)]
    used_all = owned.attributes.used_mem_current
    assert used_all >= used0 + 8 * MiB
    view = arrays[3][10:20]                 # a view keeps its block alive
    del arrays
    settle(cp)
    assert used0 + MiB <= owned.attributes.used_mem_current < used_all
    del view
    settle(cp)
    assert owned.attributes.used_mem_current == used0


def test_many_arrays_leave_nothing_behind(cp, owned):
    used0 = owned.attributes.used_mem_current
    for i in range(2000):
        a = pinned_empty(4096 + 64 * (i % 17), np.uint8, mr=owned)
        a[0] = i % 256
        assert a[0] == i % 256
    del a
    settle(cp)
    assert owned.attributes.used_mem_current == used0


def test_default_resource_is_the_default_pinned_pool(cp):
    a = pinned_empty(16, np.int8)
    mr = a.base.mr
    assert mr is asyncmr.pinned.default_pinned_mr()
    assert mr.pool_handle == asyncmr.MemPool.default(asyncmr.Location.host(), "pinned").handle


def test_block_as_array_and_bounds(cp, owned):
    block = asyncmr.PinnedBlock(64, mr=owned)
    arr = block.as_array((4, 2), np.float64)
    assert arr.base is block
    arr[:] = 1
    assert np.asarray(block).nbytes == 64
    with pytest.raises(ValueError, match="needs 128 bytes"):
        block.as_array((16,), np.float64)
