# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3, embedsignature=True
"""Moving managed memory in stream order (include/asyncmr/placement.hpp)."""

from libcpp.optional cimport optional

from rmm.pylibrmm.stream cimport Stream
from rmm.pylibrmm.utils cimport as_stream

from asyncmr._core.conversions cimport target_location

from rmm.pylibrmm.stream import DEFAULT_STREAM

from asyncmr import _validate
from asyncmr._ranges import ranges as _ranges


cdef location_t _placement_target(to) except *:
    cdef optional[int] none
    return target_location(_validate.target("to", to), none)


cdef vector[memory_range] as_ranges(obj) except *:
    cdef vector[memory_range] out
    cdef memory_range r
    for p, n in _ranges(obj):
        r.ptr = <void*><uintptr_t>p
        r.bytes = n
        out.push_back(r)
    return out


def prefetch(obj, to="device", Stream stream=DEFAULT_STREAM):
    """Prefetch managed memory to ``to`` ("device": the current device, a device ordinal,
    "host", or a :class:`Location`) in stream order on ``stream``.

    ``obj`` is a ``(pointer, nbytes)`` pair, anything with ``__cuda_array_interface__`` (CuPy,
    Numba, PyTorch, ``rmm.DeviceBuffer``), or a list of those; everything is checked before the
    first CUDA call. One driver call per range (a loop is never slower than the batched call).
    Raises :class:`asyncmr.UnsupportedError` on a capturing stream (the driver
    would invalidate the capture) and ValueError for memory that is not managed (the ranges
    before it are already queued).
    """
    cdef vector[memory_range] rs = as_ranges(obj)
    stream = as_stream(stream)  # before the target, which may ask the driver (the current device)
    cdef location_t where = _placement_target(to)
    cdef uintptr_t s = <uintptr_t>stream._cuda_stream
    with nogil:
        prefetch_ranges(rs, where, s)


def discard(obj, Stream stream=DEFAULT_STREAM):
    """Discard the contents of managed memory in stream order (no migration: what is read
    before the next write is unspecified). ``obj`` as for :func:`prefetch`. CUDA 13 build only:
    :class:`asyncmr.UnsupportedError` elsewhere, on a capturing stream, and on the legacy
    default stream (the default here), which the driver's batched discards refuse: pass a
    stream."""
    cdef vector[memory_range] rs = as_ranges(obj)
    stream = as_stream(stream)
    cdef uintptr_t s = <uintptr_t>stream._cuda_stream
    with nogil:
        discard_ranges(rs, s)


def discard_and_prefetch(obj, to="device", Stream stream=DEFAULT_STREAM):
    """Discard managed memory and prefetch it to ``to`` in one driver call: for memory about to
    be overwritten where it will be used. As :func:`discard` and :func:`prefetch`."""
    cdef vector[memory_range] rs = as_ranges(obj)
    stream = as_stream(stream)  # before the target, which may ask the driver (the current device)
    cdef location_t where = _placement_target(to)
    cdef uintptr_t s = <uintptr_t>stream._cuda_stream
    with nogil:
        discard_and_prefetch_ranges(rs, where, s)


#: The advice :func:`advise` takes, in the order of asyncmr::memory_advice.
ADVICE = ("set_read_mostly", "unset_read_mostly", "set_preferred_location",
          "unset_preferred_location", "set_accessed_by", "unset_accessed_by")


def advise(obj, advice, to="device"):
    """Give the driver ``advice`` (one of :data:`ADVICE`, the ``cudaMemAdvise`` kinds) about
    managed memory, for ``to`` ("device": the current device, a device ordinal, "host", or a
    :class:`Location`; the read-mostly kinds and ``unset_preferred_location`` do not use it).
    ``obj`` as for :func:`prefetch`. Not stream-ordered: the advice applies when the call
    returns.

    Managed *pool* memory takes no advice on the drivers measured (every kind is refused:
    docs/DRIVER_FACTS.md): then :class:`asyncmr.UnsupportedError` says what works instead (the
    pool's ``location``, ``set_access``, :func:`prefetch`). Advice works on ``cudaMallocManaged``
    memory. ValueError for an unknown advice or a bad ``to`` (TypeError for an advice or a
    ``to`` of the wrong type), before any CUDA call, and for memory that is not managed.
    """
    _validate.choice(f"asyncmr: advise: advice must be one of {ADVICE}", advice, ADVICE)
    cdef vector[memory_range] rs = as_ranges(obj)
    cdef location_t where = _placement_target(to)
    cdef int kind = ADVICE.index(advice)
    with nogil:
        advise_ranges(rs, kind, where)


def can_discard():
    """True on the CUDA 13 build, which can :func:`discard`."""
    return c_can_discard()


def failed_prefetches():
    """How many prefetches of new allocations (``AsyncManagedMR(prefetch=...)``) the driver
    refused since the process started; each left its allocation where it was."""
    return c_failed_prefetches()
