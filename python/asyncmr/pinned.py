# SPDX-License-Identifier: Apache-2.0
"""NumPy arrays on pool-pinned host memory, freed in stream order when they die.

``pinned_empty``, ``pinned_zeros``, ``pinned_full`` and their ``*_like`` forms take NumPy's
arguments and return plain ``numpy.ndarray`` objects whose memory comes from an
:class:`asyncmr.AsyncPinnedMR` (by default one process-wide resource on the default host
pinned pool). The array's ``base`` is a :class:`PinnedBlock`, which owns the allocation and
keeps the resource alive; the block goes back to the pool, in stream order on the stream it
was allocated on, when the last array over it dies.

The stream rule
---------------
A pool allocation is ready for the host only once its stream has reached it: the pool may
hand back a block that earlier work on that stream still reads, or make the allocation wait
for another stream's free. So every function here synchronizes before returning:

* ``stream=None`` (the default): the block is allocated on asyncmr's private non-blocking
  stream for the current device (only asyncmr's pinned allocations and frees run there), and
  that stream is synchronized. This never waits for your kernels.
* ``stream=s``: the block is allocated on ``s`` and ``s`` is synchronized (which waits for
  the work already queued on ``s``), unless you pass ``synchronize=False``; then the host must
  not touch the array before ``s`` has reached the allocation (``s.synchronize()``, or an
  event recorded on ``s`` after the call).

When the array dies its block is freed on the allocation stream at once. If other streams
still read or write the array asynchronously (an H2D or D2H copy in flight), make the
allocation stream wait for them first (``alloc_stream.wait_event(other_stream.record())`` in
CuPy) or keep the array alive until they are done.

Pool pinned memory is host memory to ``cudaMemcpy``: copies from these arrays host-to-device
and into them device-to-host work (``cupy.asarray(a)``, ``d.get(out=a)``, ``d.set(a)``,
``cudaMemcpyAsync`` with an explicit kind).
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Set as AbstractSet

import numpy as np

from asyncmr import _validate
from asyncmr._exceptions import CUDAError

__all__ = [
    "PinnedBlock",
    "default_pinned_mr",
    "pinned_empty",
    "pinned_empty_like",
    "pinned_full",
    "pinned_full_like",
    "pinned_zeros",
    "pinned_zeros_like",
]

_lock = threading.Lock()
_default_mr = None
_private_streams: dict = {}


def default_pinned_mr():
    """The process-wide ``AsyncPinnedMR()`` that pinned arrays and CuPy's pinned allocator use
    when no ``mr`` is given; made on first use.

    Process-wide effects (those of ``AsyncPinnedMR()``): the default host pinned pool gets
    read-write access for every visible device, and a release threshold of 0 is raised to the
    maximum so the pool keeps its memory across synchronizations.
    """
    global _default_mr
    if _default_mr is None:
        with _lock:
            if _default_mr is None:
                from asyncmr._core import AsyncPinnedMR

                _default_mr = AsyncPinnedMR()
    return _default_mr


def _cudart():
    from cuda.bindings import runtime

    return runtime


def _check(result, call: str):
    err, *values = result
    if int(err) != 0:
        raise CUDAError(f"{call} failed: {err.name}")
    return values[0] if values else None


def current_device() -> int:
    """The calling thread's current CUDA device."""
    return _check(_cudart().cudaGetDevice(), "cudaGetDevice")


def private_stream(device: int):
    """asyncmr's private non-blocking stream for ``device`` (an ``rmm.pylibrmm.stream.Stream``),
    made on first use while ``device`` is current. Only asyncmr's pinned allocations and frees
    run on it, so synchronizing it waits for them (and for any dependency the pool inserted
    into them), never for other work; being non-blocking, it does not wait for the legacy
    default stream either."""
    stream = _private_streams.get(device)
    if stream is None:
        from rmm.pylibrmm.stream import CudaStreamFlags, Stream

        with _lock:
            stream = _private_streams.get(device)
            if stream is None:
                stream = Stream(flags=CudaStreamFlags.NON_BLOCKING)
                _private_streams[device] = stream
    return stream


class _OnDevice:
    """Makes ``device`` current for a block (only if it is not), then restores the previous."""

    __slots__ = ("device", "previous")

    def __init__(self, device: int):
        self.device = device
        self.previous = None

    def __enter__(self):
        current = current_device()
        if current != self.device:
            _check(_cudart().cudaSetDevice(self.device), "cudaSetDevice")
            self.previous = current
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            _check(_cudart().cudaSetDevice(self.previous), "cudaSetDevice")
        return False


# ---- argument checks: all made before anything is allocated -------------------------------

def _check_mr(mr):
    """None or an AsyncPinnedMR; anything else raises TypeError."""
    if mr is None:
        return None
    from asyncmr._core import AsyncPinnedMR

    if not isinstance(mr, AsyncPinnedMR):
        raise TypeError(
            "mr must be an asyncmr.AsyncPinnedMR (pool pinned host memory) or None for the "
            f"process-wide default, got {type(mr).__name__}")
    return mr


def _check_stream(stream):
    """None or an ``rmm.pylibrmm.stream.Stream`` made from ``stream`` (an RMM, CuPy or Numba
    stream, or any object with ``__cuda_stream__``)."""
    if stream is None:
        return None
    from rmm.pylibrmm.stream import Stream

    if isinstance(stream, Stream):
        return stream
    try:
        return Stream(stream)
    except (TypeError, NotImplementedError, AttributeError) as e:
        raise TypeError(
            "stream must be None, an rmm Stream, a CuPy or Numba stream, or an object with "
            f"__cuda_stream__; got {type(stream).__name__} ({e})") from None


def _check_synchronize(synchronize, stream) -> bool:
    if not isinstance(synchronize, bool):
        raise TypeError(f"synchronize must be a bool, got {type(synchronize).__name__}")
    if not synchronize and stream is None:
        raise ValueError(
            "synchronize=False needs an explicit stream: with stream=None the block is "
            "allocated on asyncmr's private stream, which only asyncmr synchronizes")
    return synchronize


def _check_size(nbytes) -> int:
    n = _validate.as_integer(nbytes, "nbytes")
    if n < 0:
        raise ValueError(f"nbytes must be >= 0, got {n}")
    if n >= 2**63:
        raise ValueError(f"nbytes must be < 2**63, got {n}")
    return n


def _check_shape(shape) -> tuple[int, ...]:
    one = _validate.integer(shape)
    if one is not None:
        dims: tuple[int, ...] = (one,)
    elif isinstance(shape, bool):
        raise TypeError("shape must be an int or a sequence of ints, got bool")
    else:
        expected = "shape must be an int or a sequence of ints"
        # As numpy.empty: a set (no order) or an iterator (used up here) is no sequence of
        # dimensions; _validate.items refuses a mapping (its keys) and, unlike numpy.empty, a
        # buffer (bytes, a memoryview: data passed where a shape was meant).
        try:
            one_shot = isinstance(shape, AbstractSet) or iter(shape) is shape
        except TypeError:
            one_shot = False  # not iterable: _validate.items says so
        if one_shot:
            raise TypeError(f"{expected}, got {_validate.type_name(shape)}")
        items = _validate.items(shape, expected)
        dims = tuple(_validate.as_integer(d, "shape entries", "ints") for d in items)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimensions are not allowed: shape {dims}")
    return dims


def _check_dtype(dtype) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"dtype {dtype!r} is not a NumPy data type ({e})") from None
    if dt.hasobject:
        raise TypeError(
            f"dtype {dt} holds Python objects, which cannot live in pinned memory")
    return dt


def _check_order(order, allowed: str) -> str:
    """One of the letters in ``allowed``, in either case (as NumPy reads them)."""
    if not isinstance(order, str) or len(order) != 1 or order.upper() not in allowed:
        raise ValueError(f"order must be one of {tuple(allowed)}, got {order!r}")
    return order.upper()


def _layout(shape, dtype) -> tuple[tuple[int, ...], np.dtype, int]:
    """NumPy's expansion of a subarray dtype into the shape, and the size in bytes; a shape
    NumPy cannot make an array of is refused here, before anything is allocated."""
    if dtype.subdtype is not None:
        base, sub = dtype.subdtype
        shape, dtype = shape + sub, base
    if len(shape) > 32:  # NumPy's limit: 64 dimensions (32 before NumPy 2); under 33, any holds
        try:
            np.empty((0,) * len(shape), dtype)  # nothing allocated: NumPy's own limit, asked
        except ValueError:
            raise ValueError(f"shape {shape} has {len(shape)} dimensions, more than a NumPy "
                             "array can have") from None
    count = 1
    for d in shape:
        count *= d
    nbytes = count * dtype.itemsize
    if nbytes >= 2**63:
        raise ValueError(f"array is too big: shape {shape} of {dtype} needs {nbytes} bytes")
    return shape, dtype, nbytes


# ---- the block ---------------------------------------------------------------------------

class PinnedBlock:
    """One allocation of ``size`` bytes from a pinned pool at address ``ptr``, freed in stream
    order on its allocation ``stream`` when the object dies.

    ``PinnedBlock(nbytes, *, mr=None, stream=None, synchronize=True)`` allocates (``nbytes``
    in bytes; see the module's stream rule). It keeps ``mr`` alive. It has ``.ptr`` and
    ``.size``, the shape CuPy's ``PinnedMemoryPointer`` wants (``asyncmr.cupy`` wraps blocks
    that way), and ``__array_interface__`` (``numpy.asarray(block)`` is a ``uint8`` view whose
    ``base`` is the block). A zero-size block allocates nothing and has ``ptr`` 0.
    """

    __slots__ = ("ptr", "size", "mr", "stream", "device", "__weakref__")

    def __init__(self, nbytes, *, mr=None, stream=None, synchronize=True):
        self.ptr = 0  # __del__ frees nothing if a check below raises
        nbytes = _check_size(nbytes)
        mr = _check_mr(mr)
        stream = _check_stream(stream)
        synchronize = _check_synchronize(synchronize, stream)
        self._allocate(nbytes, mr, stream, synchronize)

    @classmethod
    def _new(cls, nbytes, mr, stream, synchronize):
        """Allocate with arguments already checked."""
        self = cls.__new__(cls)
        self._allocate(nbytes, mr, stream, synchronize)
        return self

    def _allocate(self, nbytes, mr, stream, synchronize):
        self.ptr = 0  # __del__ frees nothing unless the allocation below succeeded
        self.size = 0
        if nbytes == 0:  # allocates nothing: no resource made, no CUDA call
            self.mr = mr
            self.stream = stream
            self.device = None
            return
        self.mr = default_pinned_mr() if mr is None else mr
        device = current_device()
        if stream is None:
            stream = private_stream(device)
        self.stream = stream
        self.device = device
        self.ptr = self.mr.allocate(nbytes, stream)
        self.size = nbytes
        if synchronize:
            # If this raises, __del__ still gives the block back.
            stream.synchronize()

    def _free(self):
        ptr, self.ptr = self.ptr, 0
        if ptr:
            with _OnDevice(self.device):
                self.mr.deallocate(ptr, self.size, self.stream)

    def __del__(self):
        # At interpreter exit CUDA may already be torn down; the process gives the memory back.
        if not sys.is_finalizing():
            self._free()

    @property
    def __array_interface__(self):
        layout = getattr(_asking, "layout", None)
        if layout is not None and layout[0] is self:
            return layout[1]
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.ptr, False),
                "version": 3}

    def as_array(self, shape, dtype, order="C") -> np.ndarray:
        """A NumPy array over the block (``base`` is the block). ``shape`` times the item size
        must not exceed ``size``."""
        shape = _check_shape(shape)
        shape, dtype, nbytes = _layout(shape, _check_dtype(dtype))
        order = _check_order(order, "CF")
        if nbytes > self.size:
            raise ValueError(f"shape {shape} of {dtype} needs {nbytes} bytes; the block has "
                             f"{self.size}")
        return _view(self, shape, dtype, order)

    def __reduce_ex__(self, protocol):
        # copy, deepcopy and pickle all come here: a copy would free the allocation again.
        raise TypeError("a PinnedBlock owns its allocation and cannot be copied or pickled "
                        "(copy the array over it instead: numpy.array(a) or a.copy())")

    def __repr__(self):
        return f"PinnedBlock(ptr={self.ptr:#x}, size={self.size}, mr={self.mr!r})"


#: The layout one ``_view`` call is asking NumPy for: (block, interface), per thread. NumPy
#: reads ``__array_interface__`` on the calling thread, during the call, so another thread
#: viewing the same block (``as_array`` or ``numpy.asarray``) never sees it.
_asking = threading.local()


def _view(block: PinnedBlock, shape, dtype: np.dtype, order: str) -> np.ndarray:
    strides: tuple[int, ...] | None = None
    if order == "F":
        steps, step = [], dtype.itemsize
        for d in shape:
            steps.append(step)
            step *= max(d, 1)
        strides = tuple(steps)
    # numpy.asarray reads the layout from __array_interface__, so the array's base is the
    # block itself. The layout is this call's own, handed over through this thread's slot.
    iface = {"shape": shape, "typestr": dtype.str, "descr": dtype.descr, "strides": strides,
             "data": (block.ptr, False), "version": 3}
    outer = getattr(_asking, "layout", None)
    _asking.layout = (block, iface)
    try:
        arr = np.asarray(block)
    finally:
        _asking.layout = outer
    if arr.dtype != dtype:
        # Interfaces cannot spell every dtype (aligned structs); the item size is the same.
        arr = arr.view(dtype)
    return arr


# ---- NumPy-style constructors ------------------------------------------------------------

def _new_array(shape, dtype, order, mr, stream, synchronize, *, host_writes=False):
    """Check everything, then allocate. ``host_writes``: the caller fills the array from the
    host at once, so the stream is synchronized whatever ``synchronize`` says."""
    shape = _check_shape(shape)
    dtype = _check_dtype(dtype)
    order = _check_order(order, "CF")
    mr = _check_mr(mr)
    stream = _check_stream(stream)
    synchronize = _check_synchronize(synchronize, stream) or host_writes
    shape, dtype, nbytes = _layout(shape, dtype)
    if nbytes == 0:
        # Nothing to allocate: an ordinary empty array of the right shape and type.
        return np.empty(shape, dtype, order=order)
    return _view(PinnedBlock._new(nbytes, mr, stream, synchronize), shape, dtype, order)


def pinned_empty(shape, dtype=float, order="C", *, mr=None, stream=None, synchronize=True):
    """A new uninitialized array on pool-pinned host memory, like ``numpy.empty``.

    Parameters
    ----------
    shape : int or sequence of int
    dtype : data-type, default float
        Any NumPy dtype without Python objects.
    order : {"C", "F"}
    mr : AsyncPinnedMR, optional
        The resource to allocate from (default: :func:`default_pinned_mr`). The array keeps it
        alive.
    stream : optional
        The stream the block is allocated and later freed on (an RMM, CuPy or Numba stream, or
        any ``__cuda_stream__`` object). Default: asyncmr's private stream for the current
        device.
    synchronize : bool, default True
        Synchronize ``stream`` before returning, so the host may use the array at once.
        ``False`` (only with an explicit ``stream``) leaves that to you: do not touch the
        array from the host before ``stream`` has reached the allocation.

    Returns
    -------
    numpy.ndarray
        Its ``base`` is the :class:`PinnedBlock` that owns the memory. When the array (and
        every view of it) dies, the block is freed in stream order on the allocation stream;
        if another stream still copies from or into the array then, make the allocation stream
        wait for it first. Zero-size arrays allocate nothing.

    Raises
    ------
    TypeError, ValueError
        Bad ``shape`` (negative entries), ``dtype``, ``order``, ``mr`` (not an
        ``AsyncPinnedMR``), ``stream`` or ``synchronize``, before anything is allocated.
    MemoryError
        The pool cannot provide the bytes.
    """
    return _new_array(shape, dtype, order, mr, stream, synchronize)


def pinned_zeros(shape, dtype=float, order="C", *, mr=None, stream=None, synchronize=True):
    """Like :func:`pinned_empty`, filled with zeros (like ``numpy.zeros``).

    With ``synchronize=False`` the host writes the zeros only after ``stream`` has reached
    the allocation, so this synchronizes ``stream`` regardless.
    """
    arr = _new_array(shape, dtype, order, mr, stream, synchronize, host_writes=True)
    _memset_zero(arr)
    return arr


def pinned_full(shape, fill_value, dtype=None, order="C", *, mr=None, stream=None,
                synchronize=True):
    """Like :func:`pinned_empty`, filled with ``fill_value`` (like ``numpy.full``; ``dtype``
    defaults to ``numpy.array(fill_value).dtype``). Synchronizes ``stream`` regardless of
    ``synchronize``: the host writes the values."""
    if dtype is None:
        dtype = np.array(fill_value).dtype
    dtype = _check_dtype(dtype)
    # The array's own shape and item type (a subarray dtype adds dimensions).
    dims, item, _ = _layout(_check_shape(shape), dtype)
    # Convert and broadcast the value first, so a bad one allocates nothing. Copied into the
    # item type as numpy.full does: an integer the type cannot hold is refused, not wrapped (an
    # astype of np.asarray's int64 would wrap -1 to 255 for uint8).
    try:
        value = np.empty(np.shape(fill_value), item)
        np.copyto(value, fill_value, casting="unsafe")
    except OverflowError as e:
        raise OverflowError(f"fill_value {fill_value!r} cannot fill an array of dtype {dtype}: "
                            f"{e}") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"fill_value {fill_value!r} cannot fill an array of shape {shape} "
                         f"and dtype {dtype}: {e}") from None
    try:
        fits = np.broadcast_shapes(value.shape, dims) == dims
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"fill_value of shape {value.shape} cannot be broadcast to the "
                         f"array's shape {dims}")
    arr = _new_array(shape, dtype, order, mr, stream, synchronize, host_writes=True)
    np.copyto(arr, value, casting="unsafe")
    return arr


def _like(prototype, dtype, order, shape):
    """shape, dtype and "C"/"F" for a *_like function, following NumPy's rules for order
    ("K" keeps the prototype's layout when it is Fortran-contiguous, else C)."""
    if not (hasattr(prototype, "shape") and hasattr(prototype, "dtype")):
        prototype = np.asarray(prototype)
    order = _check_order(order, "CFAK")
    if dtype is None:
        dtype = prototype.dtype
    if shape is None:
        shape = prototype.shape
    flags = getattr(prototype, "flags", None)
    f_contig = bool(flags is not None and flags.f_contiguous)
    c_contig = bool(flags is not None and flags.c_contiguous)
    same_ndim = len(_check_shape(shape)) == len(prototype.shape)
    if order == "A":
        order = "F" if f_contig else "C"
    elif order == "K":
        order = "F" if (f_contig and not c_contig and same_ndim) else "C"
    return shape, dtype, order


def pinned_empty_like(prototype, dtype=None, order="K", *, shape=None, mr=None, stream=None,
                      synchronize=True):
    """Like ``numpy.empty_like``, on pool-pinned memory (see :func:`pinned_empty`).

    ``prototype`` may be any array-like, including a CuPy array (only its shape, dtype and
    layout are read). ``order="K"`` keeps a Fortran-contiguous prototype's layout and uses C
    order otherwise.
    """
    shape, dtype, order = _like(prototype, dtype, order, shape)
    return _new_array(shape, dtype, order, mr, stream, synchronize)


def pinned_zeros_like(prototype, dtype=None, order="K", *, shape=None, mr=None, stream=None,
                      synchronize=True):
    """Like ``numpy.zeros_like``, on pool-pinned memory (see :func:`pinned_zeros`)."""
    shape, dtype, order = _like(prototype, dtype, order, shape)
    return pinned_zeros(shape, dtype, order, mr=mr, stream=stream, synchronize=synchronize)


def pinned_full_like(prototype, fill_value, dtype=None, order="K", *, shape=None, mr=None,
                     stream=None, synchronize=True):
    """Like ``numpy.full_like``, on pool-pinned memory (see :func:`pinned_full`)."""
    shape, dtype, order = _like(prototype, dtype, order, shape)
    return pinned_full(shape, fill_value, dtype, order, mr=mr, stream=stream,
                       synchronize=synchronize)


def _memset_zero(arr: np.ndarray) -> None:
    if arr.nbytes:
        ctypes.memset(arr.ctypes.data, 0, arr.nbytes)
