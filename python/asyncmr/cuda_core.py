# SPDX-License-Identifier: Apache-2.0
"""asyncmr for cuda.core users, both ways (docs/cuda_core.md).

asyncmr's pools behind cuda.core's ``MemoryResource``: :class:`Resource` wraps an asyncmr
resource, so ``Buffer``, ``launch`` and graphs built with ``GraphBuilder`` allocate from it,
through its front cache, its recording and its prefetch::

    import asyncmr, asyncmr.cuda_core
    from cuda.core import Device

    dev = Device(0); dev.set_current(); stream = dev.create_stream()
    mr = asyncmr.cuda_core.Resource(asyncmr.AsyncManagedMR(cache=64 << 20))
    buf = mr.allocate(1 << 20, stream=stream)   # a cuda.core ManagedBuffer
    buf.close(stream)                           # back to asyncmr, in stream order

cuda.core's pools under asyncmr's control: :meth:`asyncmr.MemPool.from_handle` takes a cuda.core
``DeviceMemoryResource``, ``PinnedMemoryResource`` or ``ManagedMemoryResource`` (or a
cuda.bindings pool handle) as it is, and returns a view of its pool with asyncmr's whole control
surface (settable attributes, peaks, trim, access, routing)::

    from cuda.core import DeviceMemoryResource

    pool = asyncmr.MemPool.from_handle(DeviceMemoryResource(0))
    pool.attributes.release_threshold = 0       # cuda.core set it to the maximum

Importing this module imports cuda.core; ``import asyncmr`` does not.
"""

from __future__ import annotations

import reprlib
from typing import Any

try:
    from cuda.core import (
        LEGACY_DEFAULT_STREAM,
        PER_THREAD_DEFAULT_STREAM,
        Buffer,
        DeviceMemoryResource,
        ManagedBuffer,
        ManagedMemoryResource,
        MemoryResource,
        PinnedMemoryResource,
        Stream,
    )
    from cuda.core.graph import GraphBuilder
except ImportError as _missing:  # pragma: no cover - depends on the environment
    raise ImportError("asyncmr.cuda_core needs cuda.core 1.2 or later (pip install cuda-core, "
                      "or asyncmr's [test] extra)") from _missing

from rmm.pylibrmm.stream import Stream as _RmmStream

from asyncmr import _validate
from asyncmr._attributes import PoolAttributes
from asyncmr._core import AsyncDeviceMR, AsyncManagedMR, AsyncPinnedMR, MemPool
from asyncmr._exceptions import PoolClosedError
from asyncmr._foreign_pools import ForeignPool, name_of
from asyncmr._location import Location

__all__ = ["Resource"]

_RESOURCES = (AsyncManagedMR, AsyncPinnedMR, AsyncDeviceMR)
_STREAM_EXPECTED = ("stream must be a cuda.core Stream or GraphBuilder, or an object with "
                    "__cuda_stream__ (a CuPy, PyTorch, Numba or rmm stream)")


class Resource(MemoryResource):
    """An asyncmr resource as a cuda.core ``MemoryResource``: ``Resource(asyncmr.AsyncDeviceMR())``.

    :meth:`allocate` returns a cuda.core ``Buffer`` (a ``ManagedBuffer`` from a managed
    resource) that frees itself through the asyncmr resource when closed or collected, in stream
    order: on the stream it was allocated on, or the one ``Buffer.close(stream)`` names. What the
    wrapped resource does, it does here: its front cache (``mr.cache_info``), its recording
    (``mr.record_history()``) and its prefetch at allocation; ``mr.track_peak()``,
    ``mr.trim_to()`` and the pool's settable ``attributes`` control its pool.

    Streams: a cuda.core ``Stream`` or ``GraphBuilder``, or any object with ``__cuda_stream__``
    (CuPy, PyTorch, Numba, rmm); another type is a TypeError before any driver call. A buffer
    freed without a stream is freed on the stream it was allocated on: keep a foreign stream alive
    as long as its buffers, or close them with a stream. Inside a ``GraphBuilder``'s capture,
    device pools and managed pools located on a device record a graph allocation; host pools
    (pinned, managed at the host) raise :class:`asyncmr.UnsupportedError` and leave the capture
    valid.

    Properties follow the pool's kind: device memory is device-accessible, pinned and managed
    memory is host- and device-accessible (pinned memory as the pool grants the devices:
    ``accessible_from``), managed memory is managed. ``device_id`` is the resource's device, -1
    for pinned memory (as for cuda.core's ``PinnedMemoryResource``).
    """

    def __init__(self, mr: AsyncManagedMR | AsyncPinnedMR | AsyncDeviceMR) -> None:
        if not isinstance(mr, _RESOURCES):
            raise TypeError("asyncmr.cuda_core.Resource wraps an asyncmr resource (AsyncManagedMR, "
                            f"AsyncPinnedMR or AsyncDeviceMR), got {_validate.type_name(mr)}")
        self._mr = mr
        self._kind: str = mr.allocation_type
        self._device_id: int = -1 if mr.device is None else mr.device

    @property
    def mr(self) -> AsyncManagedMR | AsyncPinnedMR | AsyncDeviceMR:
        """The wrapped asyncmr resource."""
        return self._mr

    @property
    def pool(self) -> MemPool:
        """The pool the wrapped resource allocates from."""
        return self._mr.pool

    @property
    def attributes(self) -> PoolAttributes:
        """The pool's :class:`asyncmr.PoolAttributes`, settable where CUDA allows (process-wide
        for a shared pool)."""
        return self._mr.attributes

    def allocate(self, size: int, *, stream: Any) -> Buffer:
        """A ``Buffer`` of ``size`` bytes, allocated in stream order on ``stream`` (keyword-only,
        as cuda.core asks). Raises what the asyncmr resource raises: MemoryError when the pool
        cannot grow, :class:`asyncmr.UnsupportedError` inside a capture a host pool cannot
        join, :class:`asyncmr.PoolClosedError` after its pool was closed."""
        nbytes = _nbytes(size)
        buffer_stream, rmm_stream = _streams(stream)
        ptr = self._mr.allocate(nbytes, rmm_stream)
        try:
            if buffer_stream is None:  # a foreign stream, seen by cuda.core by its handle
                buffer_stream = _core_stream(rmm_stream.__cuda_stream__()[1])
            kind = ManagedBuffer if self._kind == "managed" else Buffer
            return kind.from_handle(ptr, nbytes, mr=self, stream=buffer_stream)
        except BaseException:
            # The caller never gets the block: it goes back, and the first error is the one raised.
            try:
                self._mr.deallocate(ptr, nbytes, rmm_stream)
            except Exception:  # noqa: BLE001
                pass
            raise

    def deallocate(self, ptr: Any, size: int, *, stream: Any) -> None:
        """Free ``ptr`` (``size`` bytes, an int address or a cuda.bindings ``CUdeviceptr``) in
        stream order on ``stream``; cuda.core's ``Buffer`` calls this when it is closed. Refused
        as the asyncmr resource refuses it (a block of another pool, a wrong size for a cached
        block: see ``AsyncManagedMR.deallocate``)."""
        address, nbytes = _address(ptr), _nbytes(size)
        _, rmm_stream = _streams(stream)
        self._mr.deallocate(address, nbytes, rmm_stream)

    @property
    def is_device_accessible(self) -> bool:
        """True (pinned memory: where its pool grants the devices access, ``accessible_from``)."""
        return True

    @property
    def is_host_accessible(self) -> bool:
        """True for pinned and managed memory."""
        return self._kind != "device"

    @property
    def is_managed(self) -> bool:
        """True for managed memory."""
        return self._kind == "managed"

    @property
    def device_id(self) -> int:
        """The wrapped resource's device; -1 for pinned memory, which is the host's."""
        return self._device_id

    def __repr__(self) -> str:
        return f"asyncmr.cuda_core.Resource({self._mr!r})"


def _nbytes(size: Any) -> int:
    """A byte count, refused by name (``size``) as asyncmr refuses ``nbytes``."""
    nbytes = _validate.size("size", size, optional=False)
    assert nbytes is not None  # optional=False never gives None
    return nbytes


def _streams(stream: Any) -> tuple[Any, _RmmStream]:
    """(the stream a Buffer records: the cuda.core Stream or GraphBuilder given, None for a
    foreign stream; the rmm Stream asyncmr works on). TypeError for anything that is no stream,
    before any driver call."""
    if isinstance(stream, GraphBuilder):
        return stream, _RmmStream(stream.stream)
    if isinstance(stream, Stream):
        return stream, _RmmStream(stream)
    method = getattr(stream, "__cuda_stream__", None)
    if not callable(method):
        raise TypeError(f"{_STREAM_EXPECTED}, got {_validate.type_name(stream)}")
    info = method()
    try:
        version, handle = info
    except (TypeError, ValueError):
        raise TypeError(f"{_validate.type_name(stream)}.__cuda_stream__() must return (0, handle), "
                        f"got {reprlib.repr(info)}") from None
    number = _validate.integer(handle)
    if version != 0 or number is None or not 0 <= number < 2**64:
        raise ValueError(f"{_validate.type_name(stream)}.__cuda_stream__() must return (0, handle) "
                         f"with an int handle, got {reprlib.repr(info)}")
    return None, _RmmStream(stream)


def _core_stream(handle: int) -> Stream:
    """A foreign stream as cuda.core sees it (the default streams by their own objects)."""
    if handle in (0, 1):  # 0 is the legacy default stream here, as for asyncmr's C++
        return LEGACY_DEFAULT_STREAM
    if handle == 2:
        return PER_THREAD_DEFAULT_STREAM
    return Stream.from_handle(handle)


def _address(ptr: Any) -> int:
    """An address cuda.core hands back: an int, or a cuda.bindings ``CUdeviceptr`` (which has no
    ``__index__``)."""
    number = _validate.integer(ptr)
    if number is None and type(ptr).__name__ == "CUdeviceptr":
        number = int(ptr)
    if number is None:
        raise TypeError(f"ptr must be an int address or a cuda.bindings CUdeviceptr, got "
                        f"{_validate.type_name(ptr)}")
    return number


def _pool_of(resource: MemoryResource) -> ForeignPool:
    """The pool of a cuda.core resource, as MemPool.from_handle adopts it (read without a driver
    call). TypeError for a resource without a pool, PoolClosedError for a closed one."""
    what = name_of(resource)
    if isinstance(resource, Resource):
        pool = resource.pool
        return ForeignPool(pool.handle, pool.location, pool.allocation_type, resource)
    if not isinstance(resource, (DeviceMemoryResource, PinnedMemoryResource,
                                 ManagedMemoryResource)):
        raise TypeError(f"a {what} allocates from no memory pool asyncmr can adopt (cuda.core's "
                        "pool resources are DeviceMemoryResource, PinnedMemoryResource and "
                        "ManagedMemoryResource)")
    handle = None if getattr(resource, "is_closed", False) else resource.handle
    if handle is None or int(handle) == 0:
        raise PoolClosedError(f"this {what} is closed: it holds no pool to adopt")
    return ForeignPool(int(handle), *_kind_of(resource), resource)


def _kind_of(resource: MemoryResource) -> tuple[Location | None, str]:
    """Where a cuda.core pool resource's pool lives (None where it does not say) and what it
    holds: cuda.core asked the driver for the pool of that location, or made it there."""
    if isinstance(resource, DeviceMemoryResource):
        return Location.device(resource.device_id), "device"
    if isinstance(resource, PinnedMemoryResource):
        numa = getattr(resource, "numa_id", -1)
        return (Location.host_numa(numa) if numa >= 0 else Location.host()), "pinned"
    preferred = getattr(resource, "preferred_location", None)
    if preferred is None:
        return Location.none(), "managed"
    kind, ident = preferred
    kind = getattr(kind, "value", kind)  # a str enum in cuda.core 1.2
    if kind == "host":
        return Location.host(), "managed"
    if kind == "device" and ident is not None:
        return Location.device(ident), "managed"
    if kind == "host_numa" and ident is not None:
        return Location.host_numa(ident), "managed"
    return None, "managed"
