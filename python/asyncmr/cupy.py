# SPDX-License-Identifier: Apache-2.0
"""CuPy's pinned memory allocator on an asyncmr pinned pool.

CuPy stages host-to-device transfers through pinned memory it takes from its *pinned memory
allocator*: ``cupy.asarray(numpy_array)`` (and ``cupy.array`` of a list of NumPy arrays)
copies pageable data into a pinned buffer and starts an async copy from it, and
``cupyx.empty_pinned`` / ``zeros_pinned`` / ``empty_like_pinned`` build NumPy arrays on it.
(``ndarray.get`` and ``ndarray.set`` copy straight from and into the NumPy array you give
them; to make those copies asynchronous, give them ``cupyx.empty_pinned`` arrays or
:func:`asyncmr.pinned_empty` ones.)

::

    import asyncmr, asyncmr.cupy, cupy, cupyx

    asyncmr.cupy.set_pinned_allocator()             # the default host pinned pool
    with asyncmr.cupy.pinned_allocator(asyncmr.AsyncPinnedMR(pool="new")) as alloc:
        d = cupy.asarray(host_array, blocking=False)  # staged through alloc.mr's pool
        h = cupyx.empty_pinned(d.shape, d.dtype)      # on alloc.mr's pool
        d.get(out=h)

CuPy's *device* allocations go through RMM (and so onto an asyncmr device or managed
resource) with RMM's own hook, which this module does not repeat::

    from rmm.allocators.cupy import rmm_cupy_allocator
    rmm.mr.set_current_device_resource(asyncmr.AsyncManagedMR())
    cupy.cuda.set_allocator(rmm_cupy_allocator)

Importing this module imports CuPy; ``import asyncmr`` does not.
"""

from __future__ import annotations

import contextlib
import threading

try:
    import cupy
    from cupy.cuda.pinned_memory import PinnedMemoryPointer
    from cupy_backends.cuda.api.runtime import CUDARuntimeError
except ImportError as _missing:  # pragma: no cover - depends on the environment
    from asyncmr import runtime_version

    raise ImportError(
        f"asyncmr.cupy needs CuPy (pip install cupy-cuda{runtime_version() // 1000}x, the CuPy "
        "of this build's CUDA major, or asyncmr's [demo] extra)") from _missing

from asyncmr import _validate
from asyncmr.pinned import PinnedBlock, _check_mr, _check_size, default_pinned_mr

__all__ = [
    "PinnedAllocator",
    "PinnedOutOfMemoryError",
    "current_pinned_allocator",
    "pinned_allocator",
    "pinned_memory_pointer",
    "restore_pinned_allocator",
    "set_pinned_allocator",
]

# cudaErrorMemoryAllocation: the status CuPy looks for before falling back (see below).
_CUDA_ERROR_MEMORY_ALLOCATION = 2


class PinnedOutOfMemoryError(CUDARuntimeError, MemoryError):
    """The pinned pool could not provide the bytes CuPy asked for.

    It is the ``CUDARuntimeError`` with status ``cudaErrorMemoryAllocation`` that CuPy catches
    around pinned allocation: ``cupy.asarray`` then warns (``cupy._util.PerformanceWarning``)
    and copies synchronously from the pageable source, and ``cupy.cuda.PinnedMemoryPool``
    frees its cached blocks and retries. It is also a ``MemoryError``, as asyncmr's own
    out-of-memory errors are. ``nbytes`` is the request; the asyncmr error is the
    ``__cause__``.
    """

    def __init__(self, nbytes: int, detail: str = ""):
        super().__init__(_CUDA_ERROR_MEMORY_ALLOCATION)
        self.nbytes = nbytes
        self.detail = detail

    def __str__(self):
        text = f"{super().__str__()}: the asyncmr pinned pool cannot provide {self.nbytes} bytes"
        return f"{text} ({self.detail})" if self.detail else text

    def __reduce__(self):
        return (type(self), (self.nbytes, self.detail))


class _EmptyMemory:
    """What a zero-byte request gets: no pool memory. It names its allocator, which lets
    :func:`current_pinned_allocator` see which allocator CuPy holds without allocating."""

    __slots__ = ("ptr", "size", "allocator")

    def __init__(self, allocator):
        self.ptr = 0
        self.size = 0
        self.allocator = allocator


class PinnedAllocator:
    """A CuPy pinned memory allocator (``f(nbytes) -> PinnedMemoryPointer``) on ``mr``, an
    :class:`asyncmr.AsyncPinnedMR` (default: :func:`asyncmr.pinned.default_pinned_mr`, the
    process-wide resource on the default host pinned pool).

    **What is synchronized, and why.** CuPy's hook gets no stream, and CuPy writes into the
    buffer from the host as soon as it is returned (``cupy.asarray`` copies the NumPy data into
    it, then queues the copy to the device). A pool block is ready for the host only once the
    stream it was allocated on has reached the allocation: the pool may hand back a block that
    earlier work on that stream still reads, or make the allocation wait for another stream's
    free. So each block is allocated on asyncmr's private non-blocking stream for the current
    device, on which only asyncmr's pinned allocations and frees run, and that stream is
    synchronized before the pointer is returned. That waits for the allocation and any
    dependency the pool put in front of it, never for your kernels: synchronizing CuPy's
    current stream instead would hold every transfer back until all queued work is done.

    **Freeing.** The block goes back to the pool in stream order, on that same private stream,
    when CuPy drops the pointer; nothing waits. CuPy drops the buffers it staged through only
    after their copy finished: it puts them on its watch list
    (``cupy.cuda.pinned_memory._add_to_watch_list``) with an event recorded after the copy and
    releases them once the event is done. Arrays you build on this allocator
    (``cupyx.empty_pinned``) are yours: as with CuPy's own pinned pool, which hands a freed
    block to the next request at once, keep such an array alive until the copies that use it
    are done.

    **Out of memory** raises :class:`PinnedOutOfMemoryError`, which CuPy treats as it treats
    its own pinned allocation failures.
    """

    __slots__ = ("mr", "__weakref__")

    def __init__(self, mr=None):
        mr = _check_mr(mr)
        self.mr = default_pinned_mr() if mr is None else mr

    def __call__(self, nbytes) -> PinnedMemoryPointer:
        nbytes = _check_size(nbytes)
        if nbytes == 0:
            return PinnedMemoryPointer(_EmptyMemory(self), 0)
        try:
            block = PinnedBlock._new(nbytes, self.mr, None, True)
        except MemoryError as e:
            raise PinnedOutOfMemoryError(nbytes, str(e)) from e
        return PinnedMemoryPointer(block, 0)

    #: CuPy's pools spell their hook ``malloc``.
    malloc = __call__

    def __repr__(self):
        return f"asyncmr.cupy.PinnedAllocator(mr={self.mr!r})"


def pinned_memory_pointer(block: PinnedBlock, offset: int = 0) -> PinnedMemoryPointer:
    """CuPy's pointer object over a :class:`asyncmr.PinnedBlock` (it keeps the block, and so
    its allocation, alive), ``offset`` bytes into it."""
    if not isinstance(block, PinnedBlock):
        raise TypeError(f"block must be an asyncmr.PinnedBlock, got {type(block).__name__}")
    offset = _validate.as_integer(offset, "offset")
    if not 0 <= offset <= block.size:
        raise ValueError(f"offset must be in [0, {block.size}], got {offset}")
    return PinnedMemoryPointer(block, offset)


# CuPy keeps its pinned allocator in a C-level global with no getter
# (cupy/cuda/pinned_memory.pyx). Which allocator is current is therefore read back by asking
# it for zero bytes: an asyncmr allocator answers with an _EmptyMemory naming itself (no pool
# call), CuPy's own allocators allocate nothing for zero bytes. A foreign allocator cannot be
# named that way; the last one asyncmr saw (at first CuPy's default pool, which `import cupy`
# installs) stands for it.
_lock = threading.RLock()
_foreign = cupy.get_default_pinned_memory_pool().malloc


def current_pinned_allocator():
    """The asyncmr :class:`PinnedAllocator` CuPy uses now, or None if CuPy's pinned allocator is
    not one of asyncmr's. (It calls the current allocator once with zero bytes.)"""
    mem = cupy.cuda.alloc_pinned_memory(0).mem
    return mem.allocator if isinstance(mem, _EmptyMemory) else None


def _previous():
    current = current_pinned_allocator()
    return _foreign if current is None else current


def restore_pinned_allocator(allocator) -> None:
    """Make ``allocator`` CuPy's pinned allocator again: what :func:`set_pinned_allocator`
    returned, any CuPy pinned allocator, or None for CuPy's unpooled ``cudaHostAlloc``."""
    global _foreign
    if allocator is not None and not callable(allocator):
        raise TypeError(f"allocator must be callable or None, got {type(allocator).__name__}")
    with _lock:
        cupy.cuda.set_pinned_memory_allocator(allocator)
        if not isinstance(allocator, PinnedAllocator):
            _foreign = allocator


def _install(allocator: PinnedAllocator):
    with _lock:
        previous = _previous()
        cupy.cuda.set_pinned_memory_allocator(allocator)
    return previous


def set_pinned_allocator(mr=None):
    """Install a :class:`PinnedAllocator` on ``mr`` (default: the process-wide
    ``AsyncPinnedMR()`` on the default host pinned pool) as CuPy's pinned memory allocator.

    Process-wide: CuPy has one pinned allocator for every thread. Returns the previous
    allocator, to hand to :func:`restore_pinned_allocator` (or to
    ``cupy.cuda.set_pinned_memory_allocator``). CuPy has no getter for it: asyncmr recognises
    its own allocators, and otherwise returns the last non-asyncmr allocator it knows of, at
    first CuPy's default ``cupy.get_default_pinned_memory_pool().malloc``. If you installed
    another allocator with ``cupy.cuda.set_pinned_memory_allocator`` yourself, restore it
    yourself too.
    """
    return _install(PinnedAllocator(mr))


@contextlib.contextmanager
def pinned_allocator(mr=None):
    """``with pinned_allocator(mr) as alloc:`` installs a :class:`PinnedAllocator` on ``mr``
    (see :func:`set_pinned_allocator`) for the block and restores the previous allocator on
    exit, exceptions included. Process-wide while the block runs, in every thread. Blocks that
    CuPy still holds keep ``alloc.mr`` alive and are freed to its pool later."""
    allocator = PinnedAllocator(mr)
    previous = _install(allocator)
    try:
        yield allocator
    finally:
        restore_pinned_allocator(previous)
