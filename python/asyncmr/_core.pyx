# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3, embedsignature=True
"""MemPool and the three pool-backed RMM memory resources."""

import contextlib
import operator

from cython.operator cimport dereference as deref
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libcpp cimport bool as cbool
from libcpp.memory cimport unique_ptr
from libcpp.optional cimport optional
from libcpp.vector cimport vector

from rmm.librmm.memory_resource cimport device_async_resource_ref
from rmm.pylibrmm.memory_resource._memory_resource cimport DeviceMemoryResource
from rmm.pylibrmm.stream cimport Stream
from rmm.pylibrmm.utils cimport as_stream

from rmm.pylibrmm.stream import DEFAULT_STREAM

from asyncmr._cpp cimport (
    async_device_memory_resource,
    async_managed_memory_resource,
    async_pinned_memory_resource,
    attribute_access_of,
    attribute_count,
    attribute_cuda_value,
    attribute_kind_of,
    attribute_min_driver,
    attribute_name,
    copy_pool,
    get_access,
    get_attribute,
    make_current,
    mem_pool,
    new_adopted_pool,
    new_created_pool,
    new_device,
    new_managed,
    new_pinned,
    new_pool,
    pool_created,
    pool_handle,
    pool_location_id,
    pool_location_kind,
    pool_type,
    set_access,
    set_attribute,
    set_exception_types,
    translate_exception,
)
from asyncmr._cpp cimport driver_version as c_driver_version
from asyncmr._cpp cimport runtime_version as c_runtime_version
from asyncmr._cpp cimport device_count as c_device_count

from asyncmr import _attributes, _validate
from asyncmr._exceptions import CUDAError, NoDeviceError, PoolClosedError, UnsupportedError
from asyncmr._location import (
    ALLOCATION_TYPES,
    KINDS,
    Location,
    check_allocation_type,
    check_location,
)

set_exception_types(NoDeviceError, UnsupportedError, PoolClosedError, CUDAError)

# RMM's make_device_async_resource_ref is a template; naming it again lets it take our types.
cdef extern from *:
    optional[device_async_resource_ref] make_managed_ref "make_device_async_resource_ref"(
        async_managed_memory_resource&) except +translate_exception
    optional[device_async_resource_ref] make_pinned_ref "make_device_async_resource_ref"(
        async_pinned_memory_resource&) except +translate_exception
    optional[device_async_resource_ref] make_device_ref "make_device_async_resource_ref"(
        async_device_memory_resource&) except +translate_exception


# Allocation through the resource's RMM reference, with asyncmr's exception translation
# (RMM's own allocate() turns every non-allocation C++ error into RuntimeError).
cdef extern from *:
    """
    #include <cuda/stream>
    #include <rmm/aligned.hpp>
    static inline std::uintptr_t resource_allocate(
        std::optional<cython_device_async_resource_ref> const& ref,
        std::uintptr_t stream, std::size_t bytes)
    {
        rmm::device_async_resource_ref r = ref.value();
        return reinterpret_cast<std::uintptr_t>(r.allocate(
            cuda::stream_ref{reinterpret_cast<cudaStream_t>(stream)}, bytes,
            rmm::CUDA_ALLOCATION_ALIGNMENT));
    }
    static inline void resource_deallocate(
        std::optional<cython_device_async_resource_ref> const& ref,
        std::uintptr_t stream, std::uintptr_t ptr, std::size_t bytes) noexcept
    {
        rmm::device_async_resource_ref r = ref.value();
        r.deallocate(
            cuda::stream_ref{reinterpret_cast<cudaStream_t>(stream)},
            reinterpret_cast<void*>(ptr), bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    }
    """
    uintptr_t resource_allocate(const optional[device_async_resource_ref]&, uintptr_t,
                                size_t) except +translate_exception nogil
    void resource_deallocate(const optional[device_async_resource_ref]&, uintptr_t,
                             uintptr_t, size_t) noexcept nogil


# The raw floor for the benchmark, in this process: the two driver calls and nothing else, so
# a Python resource and the floor of its pool are timed in the same interleaved rounds.
cdef extern from "cuda_runtime_api.h" nogil:
    ctypedef void* cudaMemPool_t  # opaque handles: only passed through
    ctypedef void* cudaStream_t

cdef extern from "asyncmr/detail/raw_pool_pairs.hpp" namespace "asyncmr::detail" nogil:
    int64_t raw_pool_pairs(cudaMemPool_t, cudaStream_t, size_t, int64_t) \
        except +translate_exception


_ACCESS_NAMES = ("none", "r", "rw")


def attribute_table():
    """The rows of the C++ attribute table: (name, cuda value, kind, access, min driver)."""
    return [
        (attribute_name(i).decode(), attribute_cuda_value(i), attribute_kind_of(i),
         attribute_access_of(i), attribute_min_driver(i))
        for i in range(attribute_count())
    ]


_attributes.install(attribute_table())


def driver_version():
    """The CUDA driver version (13000 = 13.0); 0 when no driver is installed."""
    return c_driver_version()


def runtime_version():
    """The CUDA runtime version asyncmr was built with (13000 = 13.0)."""
    return c_runtime_version()


cdef inline int _kind_code(loc):
    return KINDS.index(loc.kind)


cdef inline int _id_code(loc):
    return 0 if loc.id is None else loc.id


cdef class MemPool:
    """A CUDA memory pool, owned or viewed.

    Build one with :meth:`default`, :meth:`current`, :meth:`create` or :meth:`from_handle`.
    Owned pools (``create``, ``from_handle(owned=True)``) are destroyed at :meth:`close`, at
    the end of a ``with`` block, or when the last reference (including resources allocating
    from it) goes away; live allocations stay valid until freed. Default and current pools
    are shared by the whole process.
    """

    cdef unique_ptr[mem_pool] c_pool
    cdef object _attrs
    cdef object __weakref__

    def __init__(self, *args, **kwargs):
        raise TypeError(
            "use MemPool.default(), MemPool.current(), MemPool.create() or MemPool.from_handle()"
        )

    @staticmethod
    cdef MemPool _wrap(mem_pool* pool):
        cdef MemPool self = MemPool.__new__(MemPool)
        self.c_pool.reset(pool)
        return self

    cdef mem_pool* _get(self):
        return self.c_pool.get()

    @staticmethod
    def default(location, allocation_type):
        """The default pool of ``allocation_type`` at ``location`` (``cudaMemGetDefaultMemPool``).

        ``allocation_type`` is "device", "pinned" or "managed". Shared by the whole process.
        """
        loc = check_location(location)
        cdef int t = check_allocation_type(allocation_type)
        return MemPool._wrap(new_pool(0, _kind_code(loc), _id_code(loc), t))

    @staticmethod
    def current(location, allocation_type):
        """The current pool of ``allocation_type`` at ``location`` (``cudaMemGetMemPool``)."""
        loc = check_location(location)
        cdef int t = check_allocation_type(allocation_type)
        return MemPool._wrap(new_pool(1, _kind_code(loc), _id_code(loc), t))

    @staticmethod
    def create(location, allocation_type, *, max_size=0, release_threshold=None,
               export_handle_types=None):
        """A new pool owned by the returned object (``cudaMemPoolCreate``).

        ``max_size`` bounds the pool's reserved bytes (0: the driver's default);
        ``release_threshold`` in bytes defaults to the maximum (keep what was reserved);
        ``export_handle_types`` is an int of ``cudaMemAllocationHandleType`` bits (IPC).
        """
        loc = check_location(location)
        cdef int t = check_allocation_type(allocation_type)
        cdef uint64_t c_max = _validate.size("max_size", max_size, optional=False)
        threshold = _validate.size("release_threshold", release_threshold)
        handles = 0 if export_handle_types is None else export_handle_types
        if isinstance(handles, bool) or not isinstance(handles, int) or handles < 0:
            raise TypeError(f"export_handle_types must be a non-negative int, got {handles!r}")
        return MemPool._wrap(new_created_pool(
            _kind_code(loc), _id_code(loc), t, c_max, handles,
            threshold is not None, 0 if threshold is None else threshold))

    @staticmethod
    def from_handle(handle, *, owned=False, location=None, allocation_type=None):
        """Adopt an existing ``cudaMemPool_t`` (an int address).

        ``owned=True`` hands its destruction to asyncmr. ``location`` and ``allocation_type``
        let drivers older than 13.2, which cannot report them, route the pool.
        """
        if isinstance(handle, MemPool):
            handle = handle.handle
        h = _validate.handle(handle)
        loc = None if location is None else check_location(location)
        cdef int t = -1 if allocation_type is None else check_allocation_type(allocation_type)
        return MemPool._wrap(new_adopted_pool(
            <uintptr_t>h, bool(owned), loc is not None,
            0 if loc is None else _kind_code(loc), 0 if loc is None else _id_code(loc), t))

    @property
    def handle(self):
        """The ``cudaMemPool_t`` as an int."""
        return pool_handle(deref(self._get()))

    @property
    def owned(self):
        """True if asyncmr destroys this pool."""
        return self._get().owned()

    @property
    def closed(self):
        """True once :meth:`close` ran."""
        return self._get().closed()

    @property
    def location(self):
        """Where the memory lives (a :class:`Location`), or None if the driver cannot say."""
        cdef int kind = pool_location_kind(deref(self._get()))
        if kind < 0:
            return None
        loc_id = pool_location_id(deref(self._get()))
        return Location(KINDS[kind], loc_id if KINDS[kind] in ("device", "host_numa") else None)

    @property
    def allocation_type(self):
        """"device", "pinned" or "managed"; None if the driver cannot say."""
        cdef int t = pool_type(deref(self._get()))
        return None if t < 0 else ALLOCATION_TYPES[t]

    @property
    def attributes(self):
        """The pool's :class:`PoolAttributes`."""
        if self._attrs is None:
            self._attrs = _attributes.PoolAttributes(self)
        return self._attrs

    def _get_attribute(self, int index):
        return get_attribute(deref(self._get()), index)

    def _set_attribute(self, int index, uint64_t value):
        set_attribute(deref(self._get()), index, value)

    def trim(self, min_bytes_to_keep=0):
        """Release unused reserved memory, keeping at least ``min_bytes_to_keep`` bytes.

        Frees still pending on a stream are not unused yet: synchronize first.
        """
        cdef size_t keep = _validate.size("min_bytes_to_keep", min_bytes_to_keep, optional=False)
        self._get().trim_to(keep)

    def reset_peak(self):
        """Reset both watermarks (``used_mem_high``, ``reserved_mem_high``)."""
        self._get().reset_peaks()

    def track_peak(self):
        """``with pool.track_peak() as peak:`` measures one phase's peaks (bytes)."""
        return _attributes.PeakTracker(self)

    def set_access(self, devices, mode="rw"):
        """Grant ``mode`` ("rw", "r" or "none") access to ``devices`` ("all", an id or ids).

        On a shared pool this changes access for every user in the process.
        """
        all_devices, ids = _validate.devices(devices)
        cdef int c_mode = _validate.access_mode(mode)
        if all_devices:
            ids = list(range(c_device_count()))
        cdef vector[int] c_ids = ids
        set_access(deref(self._get()), c_ids, c_mode)

    def access(self, device):
        """The access ("rw", "r" or "none") ``device`` has to this pool's memory."""
        if device is None:
            raise TypeError("device must be an int, got None")
        cdef int d = _validate.device(device)
        return _ACCESS_NAMES[get_access(deref(self._get()), d)]

    def make_current(self):
        """Make this the current pool of its location and type (``cudaMemSetMemPool``).

        Process-wide: every later ``cudaMallocAsync`` and ``MemPool.current()`` for that
        location and type, in any library of this process, uses this pool. Returns the pool
        that was current, so it can be restored. An owned pool that is current when it is
        closed hands the location back to its default pool.
        """
        return MemPool._wrap(make_current(deref(self._get())))

    @contextlib.contextmanager
    def as_current(self):
        """``with pool.as_current(): ...`` routes to this pool and restores the previous one."""
        previous = self.make_current()
        try:
            yield self
        finally:
            previous.make_current()

    def close(self):
        """Destroy an owned pool now (a view just stops being usable here). Idempotent."""
        self._get().close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __eq__(self, other):
        if not isinstance(other, MemPool):
            return NotImplemented
        return deref(self._get()) == deref((<MemPool>other)._get())

    def __hash__(self):
        return hash(("MemPool", self.handle)) if not self.closed else id(self)

    def __repr__(self):
        if self.closed:
            return "MemPool(<closed>)"
        return (f"MemPool(handle={self.handle:#x}, allocation_type={self.allocation_type!r}, "
                f"location={self.location!r}, owned={self.owned})")


def _raw_pool_pairs(MemPool pool, nbytes, Stream stream, pairs):
    """Benchmark use: ``pairs`` rounds of ``cudaMallocFromPoolAsync`` + ``cudaFreeAsync`` of
    ``nbytes`` bytes on ``pool`` and ``stream``, timed in C++; returns the nanoseconds spent.

    This is the floor the resources are measured against, timed in the same process and
    rounds as they are.
    """
    cdef size_t n = _validate.size("nbytes", nbytes, optional=False)
    cdef int64_t count = operator.index(pairs)
    if n == 0 or count <= 0:
        raise ValueError(f"nbytes and pairs must be positive, got {nbytes} and {pairs}")
    cdef uintptr_t h = pool_handle(deref(pool.c_pool))  # refuses a closed pool
    return raw_pool_pairs(<cudaMemPool_t>h, <cudaStream_t><uintptr_t>stream._cuda_stream, n, count)


def device_count():
    """The number of visible CUDA devices (raises NoDeviceError when CUDA is unusable)."""
    return c_device_count()


cdef object _source_and_adopted(pool):
    """(source code, MemPool or None), adopting an int handle (validated first)."""
    source, adopted = _validate.pool(pool)
    if adopted is not None and not isinstance(adopted, MemPool):
        adopted = MemPool.from_handle(adopted)
    return source, adopted


cdef class _PoolResource(DeviceMemoryResource):
    """What the three resources share: the pool and its control surface."""

    cdef readonly MemPool pool

    def allocate(self, nbytes, Stream stream=DEFAULT_STREAM):
        """Allocate ``nbytes`` bytes in stream order on ``stream``; returns the address.

        Raises MemoryError when the pool cannot grow, :class:`asyncmr.PoolClosedError` after
        the pool was closed, :class:`asyncmr.UnsupportedError` when CUDA refuses the
        allocation inside a stream capture (host pools). (Allocations made by RMM itself, such
        as ``rmm.DeviceBuffer``, raise RuntimeError with the same message for the last two.)
        """
        # ints (fast path) and other integer types such as NumPy's; never floats.
        cdef size_t n = nbytes if type(nbytes) is int else operator.index(nbytes)
        stream = as_stream(stream)
        cdef uintptr_t s = <uintptr_t>stream._cuda_stream
        cdef uintptr_t ptr
        # The GIL stays held: a pool allocation takes about a microsecond, less than handing
        # the GIL to another thread and back, and releasing it around each call made several
        # Python threads allocating at once slower together than one alone (benchmark
        # section 3, run of 2026-11-30).
        ptr = resource_allocate(self.c_ref, s, n)
        return ptr

    def deallocate(self, uintptr_t ptr, size_t nbytes, Stream stream=DEFAULT_STREAM):
        """Free ``ptr`` (``nbytes`` bytes) in stream order on ``stream``."""
        stream = as_stream(stream)
        cdef uintptr_t s = <uintptr_t>stream._cuda_stream
        resource_deallocate(self.c_ref, s, ptr, nbytes)

    @property
    def pool_handle(self):
        """The ``cudaMemPool_t`` this resource allocates from, as an int."""
        return self.pool.handle

    @property
    def owns_pool(self):
        """True if the pool is destroyed with the resource (``pool="new"``)."""
        return self.pool.owned

    @property
    def allocation_type(self):
        """"managed", "pinned" or "device": what this resource hands out."""
        return self._allocation_type

    @property
    def location(self):
        """The pool's :class:`Location`."""
        return self.pool.location

    @property
    def attributes(self):
        """The pool's :class:`PoolAttributes` (process-wide for shared pools)."""
        return self.pool.attributes

    def trim(self, min_bytes_to_keep=0):
        """Release the pool's unused reserved memory down to ``min_bytes_to_keep`` bytes."""
        self.pool.trim(min_bytes_to_keep)

    def reset_peak(self):
        """Reset the pool's used and reserved watermarks."""
        self.pool.reset_peak()

    def track_peak(self):
        """``with mr.track_peak() as peak:``; then ``peak.used`` / ``peak.reserved`` (bytes).

        A shared pool's peak counts every user of that pool in the process.
        """
        return self.pool.track_peak()

    def __repr__(self):
        return (f"{type(self).__name__}(allocation_type={self.allocation_type!r}, "
                f"location={self.location!r}, owns_pool={self.owns_pool}, "
                f"pool_handle={self.pool_handle:#x})")


cdef class AsyncManagedMR(_PoolResource):
    """Stream-ordered managed memory from a CUDA 13 managed memory pool; an RMM resource.

    Parameters
    ----------
    device : int, optional
        The device the resource is for (default: the current device).
    pool : "default" | "current" | "new" | int | MemPool
        The device's default managed pool (shared), the current one (shared), a new pool
        owned by the resource, or an existing pool (adopted, never destroyed by asyncmr).
    location : Location, optional
        Where the pool's memory lives: ``Location.device(device)`` (default),
        ``Location.host()`` or ``Location.none()``.
    release_threshold : int, optional
        Bytes the pool keeps reserved across synchronizations. Unset: a shared pool whose
        threshold is 0 is raised to the maximum (process-wide effect), a non-zero one is kept;
        owned pools get the maximum. Set (0 included): applied exactly.
    accessible_from : "all" | int | list of int
        Devices granted read-write access when the pool is located on the host.

    Host code may touch a block only after the stream it was allocated on has reached the
    allocation (synchronize, or wait on an event recorded after it).
    """

    cdef unique_ptr[async_managed_memory_resource] c_obj
    _allocation_type = "managed"

    def __cinit__(self, device=None, *, pool="default", location=None,
                  release_threshold=None, accessible_from="all"):
        dev = _validate.device(device)
        loc = None if location is None else check_location(location)
        threshold = _validate.size("release_threshold", release_threshold)
        all_devices, ids = _validate.devices(accessible_from)
        source, adopted = _source_and_adopted(pool)
        cdef vector[int] c_ids = ids
        cdef mem_pool* c_adopt = NULL
        if adopted is not None:
            c_adopt = (<MemPool>adopted)._get()
        self.c_obj.reset(new_managed(
            c_adopt, dev is not None, 0 if dev is None else dev, source,
            loc is not None, 0 if loc is None else _kind_code(loc),
            0 if loc is None else _id_code(loc),
            threshold is not None, 0 if threshold is None else threshold, all_devices, c_ids))
        self.c_ref = make_managed_ref(deref(self.c_obj))
        self.pool = MemPool._wrap(copy_pool(deref(self.c_obj).pool()))

    @property
    def device(self):
        """The device the resource is for."""
        return deref(self.c_obj).device()


cdef class AsyncPinnedMR(_PoolResource):
    """Stream-ordered pinned host memory from a host memory pool; an RMM resource.

    Parameters
    ----------
    pool : "default" | "current" | "new" | int | MemPool
        As for :class:`AsyncManagedMR`; the default is the CUDA 13 default host pinned pool.
    numa_node : int, optional
        Take memory from this host NUMA node (default: any host memory).
    accessible_from : "all" | int | list of int
        Devices granted read-write access to the pool (host pools start with none; a kernel
        touching memory it cannot access kills the CUDA context). On a shared pool this is a
        process-wide effect.
    release_threshold : int, optional
        As for :class:`AsyncManagedMR`.
    """

    cdef unique_ptr[async_pinned_memory_resource] c_obj
    _allocation_type = "pinned"

    def __cinit__(self, *, pool="default", numa_node=None, accessible_from="all",
                  release_threshold=None):
        numa = _validate.device(numa_node, "numa_node")
        threshold = _validate.size("release_threshold", release_threshold)
        all_devices, ids = _validate.devices(accessible_from)
        source, adopted = _source_and_adopted(pool)
        cdef vector[int] c_ids = ids
        cdef mem_pool* c_adopt = NULL
        if adopted is not None:
            c_adopt = (<MemPool>adopted)._get()
        self.c_obj.reset(new_pinned(
            c_adopt, source, numa is not None, 0 if numa is None else numa,
            threshold is not None, 0 if threshold is None else threshold, all_devices, c_ids))
        self.c_ref = make_pinned_ref(deref(self.c_obj))
        self.pool = MemPool._wrap(copy_pool(deref(self.c_obj).pool()))

    @property
    def device(self):
        """None: pinned memory belongs to the host."""
        return None


cdef class AsyncDeviceMR(_PoolResource):
    """Stream-ordered device memory from a device memory pool; an RMM resource.

    Parameters
    ----------
    device : int, optional
        The device (default: the current device).
    pool : "default" | "current" | "new" | int | MemPool
        As for :class:`AsyncManagedMR`; the default pool is the one ``cudaMallocAsync`` uses.
    release_threshold : int, optional
        As for :class:`AsyncManagedMR`.
    """

    cdef unique_ptr[async_device_memory_resource] c_obj
    _allocation_type = "device"

    def __cinit__(self, device=None, *, pool="default", release_threshold=None):
        dev = _validate.device(device)
        threshold = _validate.size("release_threshold", release_threshold)
        source, adopted = _source_and_adopted(pool)
        cdef mem_pool* c_adopt = NULL
        if adopted is not None:
            c_adopt = (<MemPool>adopted)._get()
        self.c_obj.reset(new_device(
            c_adopt, dev is not None, 0 if dev is None else dev, source,
            threshold is not None, 0 if threshold is None else threshold))
        self.c_ref = make_device_ref(deref(self.c_obj))
        self.pool = MemPool._wrap(copy_pool(deref(self.c_obj).pool()))

    @property
    def device(self):
        """The device the memory lives on."""
        return deref(self.c_obj).device()
