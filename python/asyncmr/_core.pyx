# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3, embedsignature=True
"""MemPool and the three pool-backed RMM memory resources."""

import contextlib
import operator

from cython.operator cimport dereference as deref
from libc.stdint cimport INT64_MAX, int64_t, uint32_t, uint64_t, uintptr_t
from libcpp.memory cimport shared_ptr, unique_ptr
from libcpp.optional cimport optional, nullopt
from libcpp.vector cimport vector

from rmm.pylibrmm.stream cimport Stream
from rmm.pylibrmm.utils cimport as_stream

from rmm.pylibrmm.stream import DEFAULT_STREAM

from asyncmr import _validate
from asyncmr._exceptions import CUDAError, NoDeviceError, PoolClosedError, UnsupportedError
from asyncmr._location import Location

set_exception_types(NoDeviceError, UnsupportedError, PoolClosedError, CUDAError)
# Every asyncmr wait on the device releases the GIL from now on (see _bridge.hpp).
install_blocking_hooks()

# RMM's make_device_async_resource_ref is a template; naming it again lets it take our types.
cdef extern from *:
    optional[device_async_resource_ref] make_ref "make_device_async_resource_ref"[R](R&) \
        except +translate_exception

# The headroom estimate of the GIL policy (see _PoolResource.allocate): the pool's reserved
# bytes not in use, read in one relaxed-capture section; 0 when the driver cannot say.
cdef extern from *:
    """
    #include <asyncmr/detail/capture_mode.hpp>
    static inline long long asyncmr_pool_headroom(asyncmr::mem_pool const& pool) noexcept
    {
        cudaMemPool_t const h = pool.handle_or_null();
        if (h == nullptr) { return 0; }
        unsigned long long reserved = 0, used = 0;
        asyncmr::detail::relaxed_capture_guard guard;
        auto const a = cudaMemPoolGetAttribute(h, cudaMemPoolAttrReservedMemCurrent, &reserved);
        auto const b = cudaMemPoolGetAttribute(h, cudaMemPoolAttrUsedMemCurrent, &used);
        asyncmr::detail::clear_own_error(a);
        asyncmr::detail::clear_own_error(b);
        if (a != cudaSuccess || b != cudaSuccess || used > reserved) { return 0; }
        return static_cast<long long>(reserved - used);
    }
    """
    long long pool_headroom "asyncmr_pool_headroom"(const mem_pool&) noexcept nogil

# The Python spellings, mapped onto the C++ enums (whose values come from C++).
cdef extern from "asyncmr/asyncmr.hpp" namespace "asyncmr" nogil:
    const char* source_name "asyncmr::to_string"(PoolSource)
    const char* type_name "asyncmr::to_string"(AllocationType)

POOL_SOURCES = {source_name(s).decode(): s for s in PoolSource}
_TYPES = {t.name: t for t in AllocationType}
_KINDS = {k.name: k for k in LocationKind}
ALLOCATION_TYPES = tuple(_TYPES)
LOCATION_KINDS = tuple(_KINDS)
ACCESS_MODES = {"none": AccessMode.none, "r": AccessMode.read, "rw": AccessMode.read_write}
_ACCESS_NAMES = {v: k for k, v in ACCESS_MODES.items()}
GIL_POLICIES = ("auto", "always", "never")


# ---- conversions -------------------------------------------------------------------------------

cdef location_t to_location(value) except *:
    """A validated :class:`Location` as the C++ value."""
    if not isinstance(value, Location):
        raise TypeError(
            "location must be an asyncmr.Location (e.g. Location.device(0), Location.host()), "
            f"got {type(value).__name__}")
    kind = _KINDS.get(value.kind) if isinstance(value.kind, str) else None
    if kind is None:
        raise ValueError(f"unknown location kind {value.kind!r}; expected one of {LOCATION_KINDS}")
    cdef location_t loc
    loc.kind = kind
    loc.id = 0
    if kind in (LocationKind.device, LocationKind.host_numa):
        loc.id = _validate.ordinal(f"{value.kind} id", value.id)
    return loc


cdef object from_location(const location_t& loc):
    kind = LocationKind(<int>loc.kind)
    return Location(kind.name, loc.id if kind in (LocationKind.device, LocationKind.host_numa)
                    else None)


cdef AllocationType to_type(value) except *:
    """"device", "pinned", "managed" or an :class:`AllocationType` member."""
    if isinstance(value, AllocationType):
        return value
    if not isinstance(value, str):
        raise TypeError("allocation_type must be 'device', 'pinned', 'managed' or an "
                        f"AllocationType, got {type(value).__name__}")
    t = _TYPES.get(value)
    if t is None:
        raise ValueError(f"unknown allocation_type {value!r}; expected one of {ALLOCATION_TYPES}")
    return t


cdef optional[uint64_t] to_bytes(name, value) except *:
    cdef optional[uint64_t] out
    v = _validate.size(name, value)
    if v is not None:
        out = optional[uint64_t](<uint64_t>v)
    return out


cdef optional[vector[int]] to_devices(value) except *:
    cdef optional[vector[int]] out
    cdef vector[int] c_ids
    all_devices, ids = _validate.devices(value)
    if not all_devices:
        c_ids = ids
        out = optional[vector[int]](c_ids)
    return out


cdef optional[int] to_ordinal(value, what) except *:
    cdef optional[int] out
    v = _validate.device(value, what)
    if v is not None:
        out = optional[int](<int>v)
    return out


cdef PoolSource to_source(value) except *:
    """"default", "current", "new" or a :class:`PoolSource` member."""
    if isinstance(value, PoolSource):
        return value
    if isinstance(value, str) and value in POOL_SOURCES:
        return POOL_SOURCES[value]
    raise ValueError(f"pool must be one of {tuple(POOL_SOURCES)} or a PoolSource, got {value!r}")


# ---- module functions --------------------------------------------------------------------------

def attribute_table():
    """The rows of the C++ attribute table: (name, cuda value, kind, access, min driver), with
    kind and access as :class:`AttributeKind` / :class:`AttributeAccess` members."""
    rows = []
    cdef const attribute_info* row
    for i in range(attribute_count()):
        row = &attribute_row(i)
        rows.append((attribute_name(i).decode(), row.cuda_value, AttributeKind(<int>row.kind),
                     AttributeAccess(<int>row.access), row.min_driver))
    return rows


def _location_kind_from_cuda(int value):
    """The :class:`LocationKind` a driver ``cudaMemLocationType`` value names."""
    return LocationKind(<int>kind_from_cuda(value))


def driver_version():
    """The CUDA driver version (13000 = 13.0); 0 when no driver is installed."""
    return versions().driver


def runtime_version():
    """The CUDA runtime version asyncmr was built with (13000 = 13.0; 12090 = 12.9)."""
    return versions().runtime


def device_count():
    """The number of visible CUDA devices (raises NoDeviceError when CUDA is unusable)."""
    return require_cuda()


def failed_deallocations():
    """How many stream-ordered frees through asyncmr's resources the driver refused since the
    process started. Frees made by RMM and C++ code are also logged through RMM's logger;
    ``deallocate()`` called from Python raises :class:`CUDAError` instead."""
    return c_failed_deallocations()


def _set_testing_driver_version(int version):
    """Tests only: act as if the driver were ``version`` (0 restores the real one)."""
    set_testing_driver_version(version)


def _decide_pool_support(*, driver, build, loc, allocation_type, pool="default",
                         memory_pools=True, concurrent_managed_access=True,
                         host_memory_pools=True, host_numa_memory_pools=True):
    """Tests and ``asyncmr info``: the support decision for a platform given by value (no CUDA
    call). Returns ``(path name or None, reason)``."""
    cdef location_t c_loc = to_location(loc)
    cdef AllocationType t = to_type(allocation_type)
    cdef PoolSource source = to_source(pool)
    validate_combination(c_loc, t, source == PoolSource.new_pool)
    cdef platform p
    p.driver = driver
    p.build = build
    p.device.memory_pools = memory_pools
    p.device.concurrent_managed_access = concurrent_managed_access
    p.device.host_memory_pools = host_memory_pools
    p.device.host_numa_memory_pools = host_numa_memory_pools
    return _support_result(decide_pool_support(p, c_loc, t, source))


cdef object _support_result(const support& s):
    cdef PoolPath path
    if not s.path.has_value():
        return None, s.reason.decode()
    path = s.path.value()
    return PoolPath(path).name, ""


def device_facts(int device):
    """What ``device`` offers that decides which pools it can have, as asyncmr reads it (the
    facts the support decision uses): ``memory_pools``, ``concurrent_managed_access``,
    ``host_memory_pools``, ``host_numa_memory_pools`` (attributes a runtime cannot name are
    read by number; unknown counts as supported, and the driver answers at pool creation)."""
    cdef platform p = current_platform(device)
    return {"memory_pools": p.device.memory_pools,
            "concurrent_managed_access": p.device.concurrent_managed_access,
            "host_memory_pools": p.device.host_memory_pools,
            "host_numa_memory_pools": p.device.host_numa_memory_pools}


def pool_support(loc, allocation_type, pool="default"):
    """How this build reaches a ``pool`` ("default", "current", "new" or a :class:`PoolSource`)
    of ``allocation_type`` ("device", "pinned", "managed" or an :class:`AllocationType`) at
    ``loc`` on this driver and device: ``(path, reason)`` where path is "runtime",
    "driver_entry_point", "stand_in" or None (unsupported, and reason says why). Impossible
    combinations raise ValueError."""
    cdef location_t c_loc = to_location(loc)
    cdef AllocationType t = to_type(allocation_type)
    cdef PoolSource source = to_source(pool)
    validate_combination(c_loc, t, source == PoolSource.new_pool)
    cdef int device = c_loc.id if c_loc.kind == LocationKind.device else _current_device()
    return _support_result(decide_pool_support(current_platform(device), c_loc, t, source))


cdef extern from "asyncmr/asyncmr.hpp" namespace "asyncmr" nogil:
    int _current_device "asyncmr::current_device"() except +translate_exception


# ---- MemPool -----------------------------------------------------------------------------------

cdef class MemPool:
    """A CUDA memory pool, owned or viewed.

    Build one with :meth:`default`, :meth:`current`, :meth:`create` or :meth:`from_handle`.
    Owned pools (``create``, ``from_handle(owned=True)``) are destroyed at :meth:`close`, at
    the end of a ``with`` block, or when the last reference (including resources allocating
    from it) goes away; live allocations stay valid until freed. Default and current pools
    are shared by the whole process.
    """

    def __init__(self, *args, **kwargs):
        raise TypeError(
            "use MemPool.default(), MemPool.current(), MemPool.create() or MemPool.from_handle()"
        )

    @staticmethod
    cdef MemPool wrap(const mem_pool& pool):
        cdef MemPool self = MemPool.__new__(MemPool)
        self.c_pool.reset(new mem_pool(pool))
        # The hash is fixed at birth, so close() cannot move a pool within a set or dict:
        # equal pools (same driver pool) hash alike, a closed pool keeps its place.
        self._hash_key = ("MemPool", handle_of(pool)) if not pool.closed() else ("closed", id(self))
        return self

    cdef mem_pool* get(self) except NULL:
        return self.c_pool.get()

    @staticmethod
    def default(location, allocation_type):
        """The default pool of ``allocation_type`` at ``location``.

        ``allocation_type`` is "device", "pinned" or "managed". Shared by the whole process.
        CUDA 13's default pool; in a CUDA 12 build on a 12.x driver, host memory's default is
        asyncmr's own process-wide pool (see the README).
        """
        return MemPool.wrap(mem_pool.default_pool(to_location(location), to_type(allocation_type)))

    @staticmethod
    def current(location, allocation_type):
        """The current pool of ``allocation_type`` at ``location`` (``cudaMemGetMemPool``)."""
        return MemPool.wrap(mem_pool.current(to_location(location), to_type(allocation_type)))

    @staticmethod
    def create(location, allocation_type, *, max_size=0, release_threshold=None,
               export_handle_types=None):
        """A new pool owned by the returned object (``cudaMemPoolCreate``).

        ``max_size`` bounds the pool's reserved bytes (0: the driver's default);
        ``release_threshold`` in bytes defaults to the maximum (keep what was reserved);
        ``export_handle_types`` makes the pool shareable with other processes: "posix_fd"
        (see :meth:`export_fd`), "fabric", a list of those, or an int of
        ``cudaMemAllocationHandleType`` bits.
        """
        cdef pool_properties props
        props.location = to_location(location)
        props.type = to_type(allocation_type)
        props.max_size = _validate.size("max_size", max_size, optional=False)
        props.release_threshold = to_bytes("release_threshold", release_threshold)
        props.export_handle_types = _export_handle_bits(export_handle_types)
        return MemPool.wrap(mem_pool.create(props))

    @staticmethod
    def from_handle(handle, *, owned=False, location=None, allocation_type=None):
        """Adopt an existing ``cudaMemPool_t`` (an int address, or a MemPool).

        ``owned=True`` hands its destruction to asyncmr. ``location`` and ``allocation_type``
        let drivers older than 13.2, which cannot report them, route the pool. A closed
        MemPool raises :class:`PoolClosedError`; an int is judged by what the driver says of it
        now (see the README's Known limits).
        """
        if isinstance(handle, MemPool):
            handle = handle.handle  # raises PoolClosedError for a closed pool
        h = _validate.handle(handle)
        cdef optional[location_t] loc
        cdef optional[AllocationType] t
        if location is not None:
            loc = optional[location_t](to_location(location))
        if allocation_type is not None:
            t = optional[AllocationType](to_type(allocation_type))
        return MemPool.wrap(adopt_handle(<uintptr_t>h, bool(owned), loc, t))

    @property
    def handle(self):
        """The ``cudaMemPool_t`` as an int."""
        return handle_of(deref(self.get()))

    @property
    def owned(self):
        """True if asyncmr destroys this pool."""
        return self.get().owned()

    @property
    def closed(self):
        """True once :meth:`close` ran."""
        return self.get().closed()

    @property
    def location(self):
        """Where the memory lives (a :class:`Location`), or None if the driver cannot say."""
        cdef optional[location_t] loc = self.get().location()
        return from_location(loc.value()) if loc.has_value() else None

    @property
    def allocation_type(self):
        """"device", "pinned" or "managed"; None if the driver cannot say."""
        cdef optional[AllocationType] t = self.get().type()
        cdef AllocationType value
        if not t.has_value():
            return None
        value = t.value()
        return AllocationType(value).name

    @property
    def attributes(self):
        """The pool's :class:`PoolAttributes` (a new view each time; it keeps the pool alive,
        the pool does not keep it)."""
        from asyncmr._attributes import PoolAttributes

        return PoolAttributes(self)

    def _get_attribute(self, index):
        return get_attribute(deref(self.get()), _attribute_index(index))

    def _set_attribute(self, index, uint64_t value):
        set_attribute(deref(self.get()), _attribute_index(index), value)

    def trim_to(self, min_bytes_to_keep=0):
        """Release unused reserved memory, keeping at least ``min_bytes_to_keep`` bytes.

        Frees still pending on a stream are not unused yet: synchronize first. On a shared
        pool this releases memory for every user in the process.
        """
        cdef size_t keep = _validate.size("min_bytes_to_keep", min_bytes_to_keep, optional=False)
        cdef mem_pool* pool = self.get()
        with nogil:
            pool.trim_to(keep)

    def reset_peaks(self):
        """Reset both watermarks (``used_mem_high``, ``reserved_mem_high``)."""
        self.get().reset_peaks()

    def track_peak(self):
        """``with pool.track_peak() as peak:`` measures one phase's peaks (bytes)."""
        from asyncmr._attributes import PeakTracker

        return PeakTracker(self)

    def set_access(self, devices, mode="rw"):
        """Grant ``mode`` ("rw", "r" or "none") access to ``devices`` ("all", an id or ids).

        On a shared pool this changes access for every user in the process.
        """
        all_devices, ids = _validate.devices(devices)
        c_mode = _access_mode(mode)
        if all_devices:
            ids = list(range(require_cuda()))
        cdef vector[int] c_ids = ids
        cdef AccessMode mode_value = c_mode
        cdef mem_pool* pool = self.get()
        with nogil:  # the driver may wait for the device to change the mappings
            pool.set_access(c_ids, mode_value)

    def access(self, device):
        """The access ("rw", "r" or "none") ``device`` has to this pool's memory."""
        if device is None:
            raise TypeError("device must be an int, got None")
        cdef int d = _validate.device(device)
        return _ACCESS_NAMES[AccessMode(<int>self.get().access(d))]

    def make_current(self):
        """Make this the current pool of its location and type (``cudaMemSetMemPool``).

        Process-wide: every later ``cudaMallocAsync`` and ``MemPool.current()`` for that
        location and type, in any library of this process, uses this pool. Returns the pool
        that was current, so it can be restored. An owned pool that is current when it is
        closed hands the location back to its default pool.
        """
        return MemPool.wrap(self.get().make_current())

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
        cdef mem_pool* pool = self.get()
        with nogil:  # destroying a pool may wait for the device
            pool.close()

    # ---- IPC ----------------------------------------------------------------------------

    def export_fd(self):
        """A POSIX file descriptor for this pool, owned by the caller: send it to another
        process (``socket.send_fds``, ``subprocess``'s ``pass_fds``) and close it with
        ``os.close``. The pool must have been created with ``export_handle_types="posix_fd"``."""
        return self.get().export_fd()

    @staticmethod
    def import_fd(fd, location, allocation_type):
        """The pool another process exported as ``fd`` (see :meth:`export_fd`), owned by the
        returned object: ``close()`` ends this process's import, never the exporter's pool.
        ``location`` and ``allocation_type`` are the exporter's. An imported pool cannot be
        allocated from; bring allocations in with :meth:`import_pointer`."""
        if isinstance(fd, bool) or not isinstance(fd, int):
            raise TypeError(f"fd must be an int file descriptor, got {type(fd).__name__}")
        if not 0 <= fd < 2**31:
            raise ValueError(f"fd must be a file descriptor (>= 0), got {fd}")
        return MemPool.wrap(mem_pool.import_fd(fd, to_location(location), to_type(allocation_type)))

    @property
    def imported(self):
        """True for a pool from :meth:`import_fd`."""
        return self.get().imported()

    def import_pointer(self, data, nbytes):
        """Map an allocation the exporting process shared with :func:`export_pointer`
        (``data``, 64 bytes) into this process.

        ``nbytes`` is the size the exporter says it has; it may not exceed what the driver
        mapped at the address (``ValueError`` otherwise, with nothing kept). Returns an :class:`ImportedAllocation`, which keeps this pool alive and
        is released with ``release()``, at the end of a ``with`` block, or when it dies. Use it
        only after the exporter's allocation completed on its stream; the exporter must not free
        its allocation before every importer has released theirs.
        """
        cdef exported_pointer raw
        view = memoryview(data).cast("B")
        if view.nbytes != 64:
            raise ValueError(f"data must be the 64 bytes export_pointer returned, got {view.nbytes}")
        n = _validate.size("nbytes", nbytes, optional=False)
        for i in range(64):
            raw.bytes[i] = view[i]
        cdef unique_ptr[imported_allocation] imported = import_pointer(deref(self.get()), raw)
        cdef size_t mapped = deref(imported).size()
        if mapped != 0 and n > mapped:
            release_import(deref(imported), 0)
            raise ValueError(f"nbytes={n} is more than the {mapped} bytes the driver mapped for "
                             "this allocation; nothing was kept")
        return ImportedAllocation._make(self, imported, n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __eq__(self, other):
        if not isinstance(other, MemPool):
            return NotImplemented
        return deref(self.get()) == deref((<MemPool>other).get())

    def __hash__(self):
        return hash(self._hash_key)

    def __repr__(self):
        if self.closed:
            return "MemPool(<closed>)"
        return (f"MemPool(handle={self.handle:#x}, allocation_type={self.allocation_type!r}, "
                f"location={self.location!r}, owned={self.owned})")


def export_pointer(ptr):
    """The 64 bytes another process needs to import allocation ``ptr`` (an int address from a
    pool created with export handle types) with :meth:`MemPool.import_pointer`. Export the
    pool (:meth:`MemPool.export_fd`) first: the driver refuses the allocations of a pool it has
    not exported. Do not free ``ptr`` before every importer has released its import."""
    if isinstance(ptr, bool) or not isinstance(ptr, int) or not 0 < ptr < 2**64:
        raise TypeError(f"ptr must be a non-zero int address, got {ptr!r}")
    cdef exported_pointer data = c_export_pointer(<void*><uintptr_t>ptr)
    return bytes([data.bytes[i] for i in range(64)])


_EXPORT_HANDLES = {h.name: h for h in ExportHandle}


def _export_handle_bits(value):
    """export_handle_types: None, a name ("posix_fd", "fabric"), names, or an int of bits."""
    if value is None:
        return 0
    if isinstance(value, str):
        value = [value]
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < 2**31:
            raise ValueError(f"export_handle_types must be in [0, 2**31), got {value}")
        return value
    if isinstance(value, bool):
        raise TypeError("export_handle_types must be a name, names or an int, got bool")
    try:
        names = list(value)
    except TypeError:
        raise TypeError("export_handle_types must be 'posix_fd', 'fabric', a list of them, or "
                        f"an int, got {type(value).__name__}") from None
    bits = 0
    for name in names:
        handle = _EXPORT_HANDLES.get(name) if isinstance(name, str) else None
        if handle is None:
            raise ValueError(f"unknown export handle type {name!r}; expected one of "
                             f"{tuple(_EXPORT_HANDLES)}")
        bits |= int(handle)
    return bits


cdef class ImportedAllocation:
    """An allocation of another process, mapped into this one by
    :meth:`MemPool.import_pointer`. ``ptr`` is its address here, ``nbytes`` its size.

    ``release(stream=None)`` frees the mapping (``cudaFreeAsync`` on ``stream``, then waits for
    it, so the exporter may free its allocation once every importer returned); a ``with`` block
    or the object's death releases it too. The imported pool lives at least as long.
    """

    cdef readonly MemPool pool
    cdef readonly uintptr_t ptr
    cdef readonly size_t nbytes
    cdef unique_ptr[imported_allocation] c_import

    def __init__(self, *args, **kwargs):
        raise TypeError("use MemPool.import_pointer()")

    @staticmethod
    cdef ImportedAllocation _make(MemPool pool, unique_ptr[imported_allocation]& imported,
                                  size_t nbytes):
        cdef ImportedAllocation self = ImportedAllocation.__new__(ImportedAllocation)
        self.pool = pool
        self.ptr = import_address(deref(imported))
        self.nbytes = nbytes
        self.c_import.swap(imported)
        return self

    @property
    def released(self):
        return not self.c_import or deref(self.c_import).released()

    def release(self, Stream stream=DEFAULT_STREAM):
        """Free the mapping in stream order on ``stream`` and wait for it. Idempotent.

        A stream that is capturing is refused (:class:`UnsupportedError`) and nothing changes;
        if the driver refuses the free, :class:`CUDAError` is raised and the import stays live.
        """
        if self.released:
            return
        stream = as_stream(stream)
        cdef uintptr_t s = <uintptr_t>stream._cuda_stream
        with nogil:
            release_import(deref(self.c_import), s)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def __dealloc__(self):
        # The C++ object releases a live import on the legacy stream (never throwing), waiting
        # without the GIL: a Python host function queued on that stream can still run.
        with nogil:
            self.c_import.reset()

    def __repr__(self):
        state = "released" if self.released else "live"
        return f"ImportedAllocation(ptr={self.ptr:#x}, nbytes={self.nbytes}, {state})"


def _attribute_index(index):
    """A row of the attribute table, checked (an index outside it is a ValueError)."""
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"attribute index must be an int, got {type(index).__name__}")
    if not 0 <= index < attribute_count():
        raise ValueError(f"attribute index {index} is outside the table "
                         f"({attribute_count()} attributes)")
    return index


def _access_mode(value):
    if not isinstance(value, str):
        raise TypeError(f"access mode must be a str, got {type(value).__name__}")
    mode = ACCESS_MODES.get(value)
    if mode is None:
        raise ValueError(f"access mode must be one of {tuple(ACCESS_MODES)}, got {value!r}")
    return mode


# ---- resources ---------------------------------------------------------------------------------

# Allocations take the GIL's fast path while the pool surely has room; the estimate is read
# again at least this often, so other users of a shared pool cannot make it stale for long.
cdef enum:
    _REFRESH_EVERY = 64
    _GIL_AUTO = 0
    _GIL_ALWAYS = 1
    _GIL_NEVER = 2


cdef class _PoolResource(DeviceMemoryResource):
    """What the three resources share: the pool, its control surface and the allocation path.

    Subclasses build their C++ resource from their options and call :meth:`_bind`.
    """


    cdef _prepare(self, pool, release_threshold, cache, resource_options* options):
        """The options every resource takes, into ``options``: which pool (adopting an int or a
        MemPool), the release threshold and the front cache's cap (bytes; None or 0: no
        cache). The C++ constructor checks them all again, with the rest, before any pool
        changes."""
        options.release_threshold = to_bytes("release_threshold", release_threshold)
        cap = _validate.size("cache", cache)
        options.cache = 0 if cap is None else cap
        if isinstance(pool, PoolSource):
            name, adopted = source_name(pool).decode(), None
        elif isinstance(pool, MemPool):
            name, adopted = None, pool
        else:
            name, adopted = _validate.pool(pool)
        options.source = POOL_SOURCES[name] if adopted is None else PoolSource.default_pool
        self._adopt = NULL
        if adopted is not None:
            if not isinstance(adopted, MemPool):
                adopted = MemPool.from_handle(adopted)
            self._adopted = adopted
            self._adopt = (<MemPool>adopted).get()

    cdef _bind(self, pool_resource_base* base, optional[device_async_resource_ref] ref):
        self.c_base = base
        self.c_ref = ref
        self.pool = MemPool.wrap(base.pool())
        self._adopt = NULL
        self._adopted = None
        self._gil = _GIL_AUTO
        self._headroom = -1  # unknown: the first allocation takes the slow path and reads it

    cdef void _refresh_headroom(self) noexcept:
        self._headroom = pool_headroom(self.c_base.pool())
        self._since_refresh = 0

    @property
    def release_gil(self):
        """When :meth:`allocate` and :meth:`deallocate` release the GIL: "auto" (default),
        "always" or "never".

        "auto" keeps the GIL while the pool surely has room (about a microsecond, less than
        handing the GIL to another thread and back) and releases it when the pool may have
        to grow, which can take from milliseconds to seconds for pinned memory; "never" holds
        it always, "always" releases it around every call. Allocations RMM makes itself
        (``rmm.DeviceBuffer``) release the GIL whatever this says.
        """
        return GIL_POLICIES[self._gil]

    @release_gil.setter
    def release_gil(self, value):
        if value not in GIL_POLICIES:
            raise ValueError(f"release_gil must be one of {GIL_POLICIES}, got {value!r}")
        self._gil = GIL_POLICIES.index(value)

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
        if self._gil == _GIL_AUTO and self._since_refresh >= _REFRESH_EVERY:
            self._refresh_headroom()
        if self._gil == _GIL_NEVER or (
                self._gil == _GIL_AUTO and n <= <uint64_t>INT64_MAX
                and <int64_t>n <= self._headroom):
            ptr = allocate(deref(self.c_base), s, n)
            self._headroom -= <int64_t>n
            self._since_refresh += 1
            return ptr
        with nogil:
            ptr = allocate(deref(self.c_base), s, n)
        if self._gil == _GIL_AUTO:
            self._refresh_headroom()
        return ptr

    def deallocate(self, uintptr_t ptr, size_t nbytes, Stream stream=DEFAULT_STREAM):
        """Free ``ptr`` (``nbytes`` bytes) in stream order on ``stream``.

        Nothing is freed, and an exception says why, when the block is not this resource's to
        free: ValueError for a block of another pool (with a front cache, the driver is asked),
        a size other than the cache handed the block out with, or a second free of a cached
        block; :class:`asyncmr.CUDAError` when the driver refuses the free (a double free, or a
        pointer no pool handed out).
        """
        stream = as_stream(stream)
        cdef uintptr_t s = <uintptr_t>stream._cuda_stream
        cdef free_result result
        if self._gil == _GIL_ALWAYS:
            with nogil:
                result = deallocate(deref(self.c_base), s, ptr, nbytes)
        else:
            result = deallocate(deref(self.c_base), s, ptr, nbytes)
        if result.status != FreeStatus.freed:
            message = free_failure(result, ptr, nbytes).decode()
            if result.status == FreeStatus.driver_refused:
                raise CUDAError(message)
            raise ValueError(message)
        if nbytes <= <size_t>INT64_MAX:
            self._headroom += <int64_t>nbytes

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

    def trim_to(self, min_bytes_to_keep=0):
        """Empty the front cache (if any), then release the pool's unused reserved memory down
        to ``min_bytes_to_keep`` bytes. With a cache this synchronizes every device first."""
        cdef size_t keep = _validate.size("min_bytes_to_keep", min_bytes_to_keep, optional=False)
        with nogil:
            self.c_base.trim_to(keep)

    def release_cache(self):
        """Give every block in the front cache back to the pool. No-op without a cache.

        The blocks are taken out of reach first, then every device this process uses is
        synchronized (without the GIL; devices it never used are left alone), then they are
        freed: a block freed into the cache meanwhile stays cached. :class:`CUDAError` if a
        synchronization failed; the blocks then stay allocated, never freed while in use."""
        with nogil:
            self.c_base.release_cache()

    @property
    def cache_info(self):
        """The front cache's state, or None without one.

        ``cap`` (bytes); ``bytes`` and ``blocks`` cached now; ``parked_bytes`` and
        ``parked_blocks`` taken out and waiting for a device synchronization before they go back
        to the pool; ``hits``, ``misses``; frees turned away: ``refused_cap`` (freed to the
        pool), ``refused_uncacheable``, ``refused_not_recorded`` (blocks the cache did not hand
        out), ``refused_wrong_size``, ``refused_double_free``; ``untracked`` (blocks handed out
        that the ownership record had no room for: never cached); ``recorded_blocks``;
        ``reclaims`` and ``reclaimed_blocks`` (blocks of idle or destroyed streams taken back);
        ``charged_high`` (peak of cached bytes plus reserved credit, an upper bound of the
        cached peak, never above ``cap``); ``streams``.

        Cached blocks are allocated from the pool: the pool's ``used_mem_current`` and peaks
        count them.
        """
        cdef optional[front_cache_stats] st = self.c_base.cache_stats()
        if not st.has_value():
            return None
        cdef front_cache_stats v = st.value()
        return {"cap": self.c_base.cache_capacity(), "bytes": v.cached_bytes,
                "blocks": v.cached_blocks, "parked_bytes": v.parked_bytes,
                "parked_blocks": v.parked_blocks, "hits": v.hits, "misses": v.misses,
                "refused_cap": v.refused_cap, "refused_uncacheable": v.refused_uncacheable,
                "refused_not_recorded": v.refused_not_recorded,
                "refused_wrong_size": v.refused_wrong_size,
                "refused_double_free": v.refused_double_free, "untracked": v.untracked,
                "recorded_blocks": v.recorded_blocks, "reclaims": v.reclaims,
                "reclaimed_blocks": v.reclaimed_blocks, "charged_high": v.charged_high,
                "streams": v.streams}

    def reset_peaks(self):
        """Reset the pool's used and reserved watermarks."""
        self.pool.reset_peaks()

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
    cache : int, optional
        Byte cap of a per-stream front cache of freed blocks (default: none). A block freed on
        a stream is handed back to the next allocation of its size class on that stream,
        without the driver; see :attr:`cache_info` and the README's "Front cache".

    Host code may touch a block only after the stream it was allocated on has reached the
    allocation (synchronize, or wait on an event recorded after it).
    """

    _allocation_type = "managed"

    def __cinit__(self, device=None, *, pool="default", location=None,
                  release_threshold=None, accessible_from="all", cache=None):
        cdef resource_options o
        self._prepare(pool, release_threshold, cache, &o)
        o.device = to_ordinal(device, "device")
        if location is not None:
            o.location = optional[location_t](to_location(location))
        o.accessible_from = to_devices(accessible_from)
        self.c_obj = make_resource[async_managed_memory_resource, resource_options](
            self._adopt, o)
        self._bind(self.c_obj.get(), make_ref(deref(self.c_obj)))

    @property
    def device(self):
        """The device the resource is for."""
        return deref(self.c_obj).device()


cdef class AsyncPinnedMR(_PoolResource):
    """Stream-ordered pinned host memory from a host memory pool; an RMM resource.

    Parameters
    ----------
    pool : "default" | "current" | "new" | int | MemPool
        As for :class:`AsyncManagedMR`; the default is the default host pinned pool.
    numa_node : int, optional
        Take memory from this host NUMA node (default: any host memory).
    accessible_from : "all" | int | list of int
        Devices granted read-write access to the pool (host pools start with none; a kernel
        touching memory it cannot access kills the CUDA context). On a shared pool this is a
        process-wide effect.
    release_threshold : int, optional
        As for :class:`AsyncManagedMR`.
    cache : int, optional
        Byte cap of a per-stream front cache of freed blocks (default: none). A block freed on
        a stream is handed back to the next allocation of its size class on that stream,
        without the driver; see :attr:`cache_info` and the README's "Front cache".
    """

    _allocation_type = "pinned"

    def __cinit__(self, *, pool="default", numa_node=None, accessible_from="all",
                  release_threshold=None, cache=None):
        cdef resource_options o
        self._prepare(pool, release_threshold, cache, &o)
        o.numa_node = to_ordinal(numa_node, "numa_node")
        o.accessible_from = to_devices(accessible_from)
        self.c_obj = make_resource[async_pinned_memory_resource, resource_options](
            self._adopt, o)
        self._bind(self.c_obj.get(), make_ref(deref(self.c_obj)))

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
    cache : int, optional
        Byte cap of a per-stream front cache of freed blocks (default: none). A block freed on
        a stream is handed back to the next allocation of its size class on that stream,
        without the driver; see :attr:`cache_info` and the README's "Front cache".
    """

    _allocation_type = "device"

    def __cinit__(self, device=None, *, pool="default", release_threshold=None, cache=None):
        cdef resource_options o
        self._prepare(pool, release_threshold, cache, &o)
        o.device = to_ordinal(device, "device")
        self.c_obj = make_resource[async_device_memory_resource, resource_options](
            self._adopt, o)
        self._bind(self.c_obj.get(), make_ref(deref(self.c_obj)))

    @property
    def device(self):
        """The device the memory lives on."""
        return deref(self.c_obj).device()
