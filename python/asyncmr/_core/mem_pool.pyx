# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3, embedsignature=True
"""MemPool: a pool, owned or viewed (include/asyncmr/mem_pool.hpp), and the attribute table its
attributes are made from."""

import contextlib

from cython.operator cimport dereference as deref
from libc.stdint cimport uint64_t, uintptr_t
from libcpp.memory cimport unique_ptr
from libcpp.optional cimport optional
from libcpp.vector cimport vector

from asyncmr._core.capability cimport require_cuda
from asyncmr._core.conversions cimport from_location, to_bytes, to_location, to_size_t, to_type
from asyncmr._core.ipc cimport ImportedAllocation, export_handle_bits

from asyncmr import _foreign_pools, _validate
from asyncmr._core.conversions import AllocationType, LocationKind

#: The access modes' Python spellings.
ACCESS_MODES = {"none": AccessMode.none, "r": AccessMode.read, "rw": AccessMode.read_write}
_ACCESS_NAMES = {v: k for k, v in ACCESS_MODES.items()}


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


def _parked_pools():
    """Tests only: how many closed pools asyncmr still holds undestroyed (a block live, a free
    still queued, an allocation in flight), after destroying those that have become empty."""
    return testing_parked_pools()


def _spare_pools():
    """Tests only: how many closed managed pools asyncmr keeps, idle, to serve later pools of
    the same kind (it never destroys a managed pool)."""
    return testing_spare_pools()


cdef object _hint(name, given, known, what):
    """What ``from_handle`` tells asyncmr of a pool object's ``name`` (location or
    allocation_type): ``given`` where the caller gave it (checked first), else what the object
    says; ValueError where the two disagree."""
    cdef location_t c_loc
    if given is None:
        return known
    if name == "location":
        c_loc = to_location(given)
        same = known is None or from_location(c_loc) == known
    else:
        same = known is None or AllocationType(to_type(given)).name == known
    if not same:
        raise ValueError(f"{name}={given!r}, but the pool of this {what} is "
                         f"{'at ' if name == 'location' else ''}{known!r}")
    return given


cdef class MemPool:
    """A CUDA memory pool, owned or viewed.

    Build one with :meth:`default`, :meth:`current`, :meth:`create` or :meth:`from_handle`.
    Owned pools (``create``, ``from_handle(owned=True)``) are destroyed at :meth:`close`, at
    the end of a ``with`` block, or when the last reference (including resources allocating
    from it) goes away; live allocations stay valid until freed. A managed pool is kept
    instead, idle, and serves a later :meth:`create` of the same kind. Default and current
    pools are shared by the whole process.
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
        cdef mem_pool* pool = self.c_pool.get()
        if pool == NULL:
            raise TypeError("MemPool.__new__ made an empty MemPool: use MemPool.default(), "
                            "MemPool.current(), MemPool.create() or MemPool.from_handle()")
        return pool

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

        ``max_size`` bounds the pool's reserved bytes (0: the driver's default; managed pools
        take only 0, ValueError otherwise);
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
        props.export_handle_types = export_handle_bits(export_handle_types)
        return MemPool.wrap(mem_pool.create(props))

    @staticmethod
    def from_handle(handle, *, owned=False, location=None, allocation_type=None):
        """Adopt an existing pool: a ``cudaMemPool_t`` as an int, a MemPool, a cuda.bindings
        ``CUmemoryPool`` or ``cudaMemPool_t``, or the pool of a cuda.core
        ``DeviceMemoryResource``, ``PinnedMemoryResource`` or ``ManagedMemoryResource`` (or of an
        :class:`asyncmr.cuda_core.Resource`).

        ``owned=True`` hands its destruction to asyncmr; a resource's pool stays its owner's
        (ValueError). ``location`` and ``allocation_type`` let drivers older than 13.2, which
        cannot report them, route the pool; a cuda.core resource gives its own (ValueError when
        they disagree). The view keeps a cuda.core resource alive, so its pool lives as long as
        the view; closing that resource while the view is in use leaves the view with the handle
        of a pool that may be gone. Refused by type, before any driver call: cuda.bindings
        streams, events and other handles (TypeError), a closed MemPool or cuda.core resource
        (:class:`PoolClosedError`). An int is judged by what the driver says of it now (see the
        user guide's "Foreign pool handles").
        """
        if not isinstance(owned, bool):  # bool("no") is True: the wrong pool would be destroyed
            raise TypeError(f"owned must be a bool, got {_validate.type_name(owned)}")
        owner = None
        if isinstance(handle, MemPool):
            owner = (<MemPool>handle)._owner
            handle = handle.handle  # raises PoolClosedError for a closed pool
        else:
            foreign = _foreign_pools.recognize(handle)
            if foreign is not None:
                what = _foreign_pools.name_of(handle)
                if owned and foreign.owner is not None:
                    raise ValueError(f"the pool of a {what} is its resource's to destroy: adopt it "
                                     "with owned=False (a view)")
                location = _hint("location", location, foreign.location, what)
                allocation_type = _hint("allocation_type", allocation_type,
                                        foreign.allocation_type, what)
                handle, owner = foreign.handle, foreign.owner
        h = _validate.handle(handle)
        cdef optional[location_t] loc
        cdef optional[allocation_type_t] t
        if location is not None:
            loc = optional[location_t](to_location(location))
        if allocation_type is not None:
            t = optional[allocation_type_t](to_type(allocation_type))
        cdef MemPool pool = MemPool.wrap(adopt_handle(<uintptr_t>h, owned, loc, t))
        pool._owner = owner
        return pool

    @property
    def handle(self):
        """The ``cudaMemPool_t`` as an int."""
        return handle_of(deref(self.get()))

    @property
    def owned(self):
        """True if asyncmr ends this pool: destroys it, or keeps a managed one for a later
        :meth:`create` (see :class:`MemPool`)."""
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
        cdef optional[allocation_type_t] t = self.get().type()
        cdef allocation_type_t value
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

    # `index`: a row of the attribute table (one outside it is C++'s to refuse).
    def _get_attribute(self, index):
        return get_attribute(deref(self.get()), to_size_t(index, "attribute index"))

    def _set_attribute(self, index, uint64_t value):
        set_attribute(deref(self.get()), to_size_t(index, "attribute index"), value)

    def trim_to(self, min_bytes_to_keep=0):
        """Release unused reserved memory, keeping at least ``min_bytes_to_keep`` bytes.

        Frees still pending on a stream are not unused yet: synchronize first. On a shared
        pool this releases memory for every user in the process.
        """
        cdef size_t keep = _validate.size("min_bytes_to_keep", min_bytes_to_keep, optional=False)
        # A copy of its own while the GIL is out (see close): this object may be closed meanwhile.
        cdef unique_ptr[mem_pool] pool
        pool.reset(new mem_pool(deref(self.get())))
        with nogil:
            pool.get().trim_to(keep)

    def reset_peaks(self):
        """Reset both watermarks (``used_mem_high``, ``reserved_mem_high``). The peak trackers
        open on this pool keep the peaks they saw up to the reset (see :class:`PeakTracker`)."""
        from asyncmr._attributes import _reset_peaks

        _reset_peaks(self)

    def track_peak(self, name=None):
        """``with pool.track_peak() as peak:`` measures one phase's peaks (bytes); ``name``
        names it (a resource's ``track_peak`` also marks it in that resource's recording).
        Trackers may be nested or open at once on several threads (see :class:`PeakTracker`)."""
        from asyncmr._attributes import PeakTracker

        return PeakTracker(self, name)

    def set_access(self, devices, mode="rw"):
        """Grant ``mode`` ("rw", "r" or "none") access to ``devices`` ("all", an id or ids).

        On a shared pool this changes access for every user in the process. The device a
        device pool lives on always keeps read-write access: less for it (also through "all")
        is a ValueError, and so is a device named twice, both before the driver is asked.
        Read-only access is UnsupportedError where the driver refuses it (every driver tried:
        docs/DRIVER_FACTS.md, "Access").
        """
        all_devices, ids = _validate.devices(devices, "devices", "device")
        c_mode = _access_mode(mode)
        if all_devices:
            ids = list(range(require_cuda()))
        cdef vector[int] c_ids = ids
        cdef AccessMode mode_value = c_mode
        cdef unique_ptr[mem_pool] pool  # a copy of its own while the GIL is out (see close)
        pool.reset(new mem_pool(deref(self.get())))
        with nogil:  # the driver may wait for the device to change the mappings
            pool.get().set_access(c_ids, mode_value)

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
        """Close an owned pool: every later use raises PoolClosedError (a view just stops being
        usable here). The driver pool is destroyed now, or, while blocks are live or their frees
        still queued on streams, as soon as it holds nothing; a managed pool is kept for a later
        :meth:`create` of its kind instead. Idempotent."""
        # A C++ mem_pool must not be closed while another thread uses the same object (closing
        # a view replaces its state). So a copy is closed, without the GIL (destroying a pool
        # may wait for the device), and takes this object's place with the GIL held; the methods
        # that let the GIL go work on copies of their own, and the one replaced is dropped
        # without the GIL (it may hold a pool's last reference).
        cdef unique_ptr[mem_pool] closing
        closing.reset(new mem_pool(deref(self.get())))
        with nogil:
            closing.get().close()
        self.c_pool.swap(closing)
        with nogil:
            closing.reset()

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
        fd = _validate.as_integer(fd, "fd", "an int file descriptor")
        if not -2**31 <= fd < 2**31:  # a C int; C++ refuses a negative one
            raise ValueError(f"fd must be in [-2**31, 2**31), got {fd}")
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
        try:
            view = memoryview(data)
        except TypeError:
            raise TypeError("data must be the 64 bytes export_pointer returned (a bytes-like "
                            f"object), got {_validate.type_name(data)}") from None
        if view.nbytes != 64:
            raise ValueError(f"data must be the 64 bytes export_pointer returned, got {view.nbytes}")
        n = _validate.size("nbytes", nbytes, optional=False)
        content = view.tobytes()  # in order, from a strided view too
        for i in range(64):
            raw.bytes[i] = content[i]
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
        if self.c_pool.get() == NULL:
            return "MemPool(<empty>)"
        if self.closed:
            return "MemPool(<closed>)"
        return (f"MemPool(handle={self.handle:#x}, allocation_type={self.allocation_type!r}, "
                f"location={self.location!r}, owned={self.owned})")


def _access_mode(value):
    if not isinstance(value, str):
        raise TypeError(f"access mode must be a str, got {_validate.type_name(value)}")
    mode = ACCESS_MODES.get(value)
    if mode is None:
        raise ValueError(f"access mode must be one of {tuple(ACCESS_MODES)}, got {value!r}")
    return mode
