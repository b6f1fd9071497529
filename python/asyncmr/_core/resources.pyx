# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3, embedsignature=True
"""The three pool-backed RMM resources (include/asyncmr/async_*_memory_resource.hpp) and what
they share (include/asyncmr/pool_resource.hpp), with their options
(include/asyncmr/resource_options.hpp)."""

from cython.operator cimport dereference as deref
from libc.stdint cimport INT64_MAX

from rmm.pylibrmm.stream cimport Stream
from rmm.pylibrmm.utils cimport as_stream

from asyncmr._core.conversions cimport (
    from_location,
    target_location,
    to_bytes,
    to_devices,
    to_location,
    to_ordinal,
    to_size_t,
    to_source,
)
from asyncmr._core.mem_pool cimport pool_usage

from rmm.pylibrmm.stream import DEFAULT_STREAM

from asyncmr import _validate
from asyncmr._core.conversions import PoolSource
from asyncmr._exceptions import CUDAError

GIL_POLICIES = ("auto", "always", "never")
_HISTORY_ACTIONS = {int(a): a.name for a in HistoryAction}


def failed_deallocations():
    """How many stream-ordered frees through asyncmr's resources the driver refused since the
    process started. Frees made by RMM and C++ code are also logged through RMM's logger;
    ``deallocate()`` called from Python raises :class:`CUDAError` instead."""
    return c_failed_deallocations()


# RMM's make_device_async_resource_ref is a template; naming it again lets it take our types.
cdef extern from *:
    optional[device_async_resource_ref] make_ref "make_device_async_resource_ref"[R](R&) \
        except +translate_exception

# Allocations take the GIL's fast path while the pool surely has room; the estimate is read
# again at least this often, so other users of a shared pool cannot make it stale for long.
cdef enum:
    _REFRESH_EVERY = 64
    _GIL_AUTO = 0
    _GIL_ALWAYS = 1
    _GIL_NEVER = 2


cdef object _common_options(pool, release_threshold, cache, reserve,
                           resource_options* options):
    """The options every resource takes, into ``options``: which pool, the release threshold,
    the bytes reserved up front and the front cache's cap (bytes; None or 0: none). Returns
    the pool to adopt (an int handle, a pool object or a MemPool), or None."""
    options.release_threshold = to_bytes("release_threshold", release_threshold)
    options.reserve = _validate.size("reserve", reserve, optional=False)
    cap = _validate.size("cache", cache)
    options.cache = 0 if cap is None else cap
    options.source = pool_source_t.default_pool  # what an adopted pool is reached as
    adopted = None
    if isinstance(pool, PoolSource):
        options.source = pool
    elif isinstance(pool, MemPool):
        adopted = pool
    else:
        name, adopted = _validate.pool(pool)
        if adopted is None:
            options.source = to_source(name)
    return adopted


cdef tuple _managed_options(device, pool, location, release_threshold, accessible_from, reserve,
                            cache, prefetch, discard, resource_options* options):
    """``AsyncManagedMR``'s options into ``options``, each checked as far as it can be before any
    CUDA call (``check_resource_options``, the prefetch target's kind and ordinal too).
    Returns the pool to adopt (an int handle or a MemPool, or None) and the prefetch target as
    ``_validate.target`` took it (None: no prefetch), for the caller to resolve: "device" with
    no ``device`` asks the driver for the current device, so only that target is left out of
    the check. The resource and ``_check_managed_options`` both come here, so what one refuses
    the other does."""
    if not isinstance(discard, bool):
        raise TypeError(f"discard must be a bool, got {_validate.type_name(discard)}")
    adopted = _common_options(pool, release_threshold, cache, reserve, options)
    options.device = to_ordinal(device, "device")
    if location is not None:
        options.location = optional[location_t](to_location(location))
    options.accessible_from = to_devices(accessible_from)
    options.discard = discard
    where = None if prefetch is None else _validate.target("prefetch", prefetch, unset=True)
    if where is not None and not (isinstance(where, str) and where == "device"
                                  and not options.device.has_value()):
        options.prefetch = optional[location_t](target_location(where, options.device))
    check_resource_options(allocation_type_t.managed, deref(options), prefetch is not None)
    return adopted, where


def _check_managed_options(*, pool="default", release_threshold=None, reserve=0, cache=None,
                           prefetch=None, discard=False):
    """Raises what ``AsyncManagedMR(pool=..., ...)`` with these options refuses before any CUDA
    call, and makes nothing (cudf_pandas.install asks before it looks for cuDF)."""
    cdef resource_options o
    _managed_options(None, pool, None, release_threshold, "all", reserve, cache, prefetch,
                     discard, &o)


cdef class _PoolResource(DeviceMemoryResource):
    """What the three resources share: the pool, its control surface and the allocation path.

    Subclasses build their C++ resource from their options and call :meth:`_bind`.
    """

    def __cinit__(self, *args, **kwargs):
        # Only the three resources build a C++ resource (in their own __cinit__, after this one);
        # any other instance would have none, and its first use would dereference null.
        if not isinstance(self, (AsyncManagedMR, AsyncPinnedMR, AsyncDeviceMR)):
            raise TypeError(f"asyncmr: {type(self).__name__} is not a resource of its own; make "
                            "an AsyncManagedMR, AsyncPinnedMR or AsyncDeviceMR (or subclass one)")

    cdef _prepare(self, adopted):
        """Keeps the pool to adopt (``_common_options``' answer: an int handle, a MemPool or
        None) until every option is checked; ``_adopt_pool`` then adopts it. The C++
        constructor checks the options again, with the rest, before any pool changes."""
        self._adopt = NULL
        self._adopted = adopted  # an int is adopted by _adopt_pool, once every option is checked

    cdef _adopt_pool(self):
        """The pool to adopt, if any, as ``_adopt``: an int handle or a pool object is asked of
        the driver here, after the subclass checked the rest of its arguments
        (``check_resource_options``)."""
        if self._adopted is None:
            return
        if not isinstance(self._adopted, MemPool):
            self._adopted = MemPool.from_handle(self._adopted)
        self._adopt = (<MemPool>self._adopted).get()

    cdef _bind(self, pool_resource* base, optional[device_async_resource_ref] ref):
        self.c_base = base
        self.c_ref = ref
        self.pool = MemPool.wrap(base.pool())
        if isinstance(self._adopted, MemPool):  # a cuda.core resource owning the pool lives on
            self.pool._owner = (<MemPool>self._adopted)._owner
        self._adopt = NULL
        self._adopted = None
        self._gil = _GIL_AUTO
        self._headroom = -1  # unknown: the first allocation takes the slow path and reads it

    cdef void _refresh_headroom(self) noexcept:
        # The pool's reserved bytes not in use (0 when the driver cannot say): the GIL policy's
        # estimate of whether an allocation can be served without growing the pool.
        cdef optional[pool_usage] u = self.c_base.pool().usage()
        if not u.has_value() or u.value().used > u.value().reserved:
            self._headroom = 0
        else:
            self._headroom = <long long>(u.value().reserved - u.value().used)
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
        # A number, None or bytes is no policy's name: TypeError; another str: ValueError.
        value = _validate.choice(f"release_gil must be one of {GIL_POLICIES}", value, GIL_POLICIES)
        self._gil = GIL_POLICIES.index(value)

    def allocate(self, nbytes, Stream stream=DEFAULT_STREAM):
        """Allocate ``nbytes`` bytes in stream order on ``stream``; returns the address.

        Raises MemoryError when the pool cannot grow, :class:`asyncmr.PoolClosedError` after
        the pool was closed, :class:`asyncmr.UnsupportedError` when CUDA refuses the
        allocation inside a stream capture (host pools). (Allocations made by RMM itself, such
        as ``rmm.DeviceBuffer``, raise RuntimeError with the same message for the last two.)
        """
        cdef size_t n = to_size_t(nbytes, "nbytes")
        stream = as_stream(stream)
        cdef uintptr_t s = <uintptr_t>stream._cuda_stream
        cdef uint64_t event
        # Read once: another thread may end the recording while this allocation runs without
        # the GIL, and the block must still come back to the caller.
        recorder = self._recorder
        if recorder is None:
            return self._allocate_core(n, s)
        forget_last_history_event()  # so that an allocation the ring did not record names none
        try:
            ptr = self._allocate_core(n, s)
        except MemoryError as e:
            raise MemoryError(f"{e}; {recorder.describe_outstanding()}") from None
        # The allocation's event, recorded on this thread (another thread's event, or one of RMM's
        # own allocations, never takes its place). It went into the recorder's ring if the
        # recorder is still this resource's: it is set after the C++ recording starts and cleared
        # before it stops, and never set again.
        event = last_history_event()
        try:
            recorder.note_allocation(
                ptr, event if event != no_history_event and self._recorder is recorder else None)
        except BaseException:
            # The caller never gets the address (a MemoryError noting the stack, an interrupt):
            # the block goes back rather than stay allocated for good. The recorder's exception
            # is the one raised, whatever the free says.
            try:
                self.deallocate(ptr, n, stream)
            except Exception:  # noqa: BLE001
                pass
            raise
        return ptr

    cdef uintptr_t _allocate_core(self, size_t n, uintptr_t s) except? 0:
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

    def deallocate(self, ptr, nbytes, Stream stream=DEFAULT_STREAM):
        """Free ``ptr`` (``nbytes`` bytes) in stream order on ``stream``.

        Nothing is freed, and an exception says why, when the block is not this resource's to
        free: ValueError for a block of another pool (with a front cache, the driver is asked),
        a size other than the cache handed the block out with, or a second free of a cached
        block; :class:`asyncmr.CUDAError` when the driver refuses the free (a double free, a
        pointer no pool handed out, or a free on the legacy default stream while a blocking
        stream captures: then the capture stays valid and the block is still the caller's).
        """
        cdef uintptr_t p = to_size_t(ptr, "ptr")
        cdef size_t n = to_size_t(nbytes, "nbytes")
        stream = as_stream(stream)
        cdef uintptr_t s = <uintptr_t>stream._cuda_stream
        cdef free_result result
        if self._gil == _GIL_ALWAYS:
            with nogil:
                result = deallocate(deref(self.c_base), s, p, n)
        else:
            result = deallocate(deref(self.c_base), s, p, n)
        if result.status != FreeStatus.freed:
            message = free_failure(result, p, n).decode()
            if result.status == FreeStatus.driver_refused:
                raise CUDAError(message)
            raise ValueError(message)
        if p != 0 and n <= <size_t>INT64_MAX:  # freeing null frees nothing, so adds no room
            self._headroom += <int64_t>n

    @property
    def pool_handle(self):
        """The ``cudaMemPool_t`` this resource allocates from, as an int."""
        return self.pool.handle

    @property
    def owns_pool(self):
        """True if the pool ends with the resource (``pool="new"``; see :attr:`MemPool.owned`)."""
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
        to ``min_bytes_to_keep`` bytes. With a cache this first waits for the work the cached
        blocks' streams queued before their frees (without the GIL)."""
        cdef size_t keep = _validate.size("min_bytes_to_keep", min_bytes_to_keep, optional=False)
        with nogil:
            self.c_base.trim_to(keep)

    def release_cache(self):
        """Give every block in the front cache back to the pool. No-op without a cache.

        The blocks are taken out of reach first, then freed on the cache's own release stream
        behind the event each block's stream recorded at its free, and this call waits for that
        stream (without the GIL): the memory is the pool's on return. Nothing device-wide, so a
        capture on another thread or stream stays valid. A block freed into the cache meanwhile
        stays cached. :class:`CUDAError` if the wait failed."""
        with nogil:
            self.c_base.release_cache()

    @property
    def cache_info(self):
        """The front cache's state, or None without one.

        ``cap`` (bytes); ``bytes`` and ``blocks`` cached now; ``parked_bytes`` and
        ``parked_blocks`` taken out, their frees not yet made (a release in progress); ``hits``, ``misses``; frees turned away: ``refused_cap`` (freed to the
        pool), ``refused_uncacheable``, ``refused_not_recorded`` (blocks the cache did not hand
        out), ``refused_wrong_size``, ``refused_double_free``, ``refused_unmarked`` (frees whose stream's
        event could not be recorded: freed to the pool), ``refused_no_memory`` (frees the cache
        had no host memory to file: freed to the pool, and no pressure on the cap);
        ``untracked`` (blocks handed out that the ownership record had no room for: never
        cached); ``recorded_blocks``;
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
                "refused_double_free": v.refused_double_free,
                "refused_unmarked": v.refused_unmarked,
                "refused_no_memory": v.refused_no_memory, "untracked": v.untracked,
                "recorded_blocks": v.recorded_blocks, "reclaims": v.reclaims,
                "reclaimed_blocks": v.reclaimed_blocks, "charged_high": v.charged_high,
                "streams": v.streams}

    def record_history(self, max_events=65536, stacks="none"):
        """``with mr.record_history() as h:`` records what this resource does: every allocation
        and free, front-cache hit and put, pool growth and trim, and failed allocation, with
        time, address, size, stream and the pool's reserved and used bytes after it.

        ``max_events`` bounds the ring the events go into (the oldest are dropped when it is
        full, and counted); ``stacks="python"`` adds the Python stack of each allocation (off
        by default: it costs a stack walk per allocation). One recording at a time per
        resource (its copies share it). ``h.history()`` gives the
        :class:`asyncmr.history.History` (also while recording), ``h.save(path)`` writes it as
        asyncmr's JSON file, ``h.snapshot()`` and ``h.export_torch_snapshot(path)`` give the
        snapshot PyTorch's memory viewer opens, ``h.outstanding()`` what is live. While it records, a MemoryError from :meth:`allocate` also names the largest
        outstanding allocations. See docs/HISTORY.md.
        """
        from asyncmr._recorder import HistoryRecorder

        return HistoryRecorder(self, max_events, stacks)

    def _start_history(self, size_t max_events, recorder):
        if self._recorder is not None:
            raise RuntimeError("asyncmr: a history is being recorded on this resource already "
                               "(one at a time; leave that `with` block first)")
        self.c_base.start_history(max_events)
        self._recorder = recorder

    def _read_history(self, bint stop=False):
        """(events as dicts, dropped, each event's number in its ring); stops the recording
        when ``stop``."""
        cdef uint64_t dropped = 0
        cdef vector[history_event] events
        if stop:
            self._recorder = None
            events = self.c_base.stop_history(dropped)
        else:
            events = self.c_base.read_history(dropped)
        out = []
        numbers = []
        cdef history_event e
        for e in events:
            out.append({"time_ns": e.time_ns, "action": _HISTORY_ACTIONS[<uint32_t>e.action],
                        "address": e.address, "bytes": e.bytes, "stream": e.stream,
                        "reserved": e.reserved, "used": e.used, "cached": e.cached,
                        "frames": []})
            numbers.append(e.number)
        return out, dropped, numbers

    def reset_peaks(self):
        """Reset the pool's used and reserved watermarks; open peak trackers keep what they saw."""
        self.pool.reset_peaks()

    def track_peak(self, name=None):
        """``with mr.track_peak() as peak:``; then ``peak.used`` / ``peak.reserved`` (bytes).

        ``name`` names the phase; a named tracker made while this resource records its history
        (``record_history``) is a phase of that recording too, with its peaks: shaded in ``plot``.
        Trackers may be nested or open at once on several threads (see :class:`PeakTracker`).
        A shared pool's peak counts every user of that pool in the process.
        """
        from asyncmr._attributes import PeakTracker

        return PeakTracker(self.pool, name, self._recorder)

    def __repr__(self):
        # Answers after the pool was closed too (a log line or a debugger must not raise).
        handle = "<closed>" if self.pool.closed else f"{self.pool_handle:#x}"
        return (f"{type(self).__name__}(allocation_type={self.allocation_type!r}, "
                f"location={self.location!r}, owns_pool={self.owns_pool}, "
                f"pool_handle={handle})")


cdef class AsyncManagedMR(_PoolResource):
    """Stream-ordered managed memory from a CUDA 13 managed memory pool; an RMM resource.

    Parameters
    ----------
    device : int, optional
        The device the resource is for (default: the current device).
    pool : "default" | "current" | "new" | int | MemPool | pool object
        The device's default managed pool (shared), the current one (shared), a new pool
        owned by the resource, or an existing pool (adopted, never destroyed by asyncmr): a
        handle, a MemPool, or a pool object :meth:`MemPool.from_handle` takes (a cuda.core
        pool resource, a cuda.bindings pool handle).
    location : Location, optional
        Where the pool's memory lives: ``Location.device(device)`` (default),
        ``Location.host()`` or ``Location.none()``.
    release_threshold : int, optional
        Bytes the pool keeps reserved across synchronizations. Unset: a shared pool whose
        threshold is 0 is raised to the maximum (process-wide effect), a non-zero one is kept;
        owned pools get the maximum. Set (0 included): applied exactly.
    accessible_from : "all" | int | list of int
        Devices granted read-write access when the pool is located on the host; an empty list
        grants none (as for :class:`AsyncPinnedMR`).
    reserve : int
        Bytes the pool is grown by before the constructor returns, as RMM's
        ``initial_pool_size``: one allocation of that size, freed at once and synchronized on a
        stream of the resource's own, so the pool holds the memory (reserved, not used) and
        later allocations are carved from it instead of growing the pool. The release threshold
        must be at least ``reserve`` (else ValueError, before any pool changes). Managed and
        device pools back it on the device at once. Default 0: none.
    cache : int, optional
        Byte cap of a per-stream front cache of freed blocks (default: none). A block freed on
        a stream is handed back to the next allocation of its size class on that stream,
        without the driver; see :attr:`cache_info` and the user guide's "Front cache" page.
    prefetch : None | "device" | int | "host" | Location
        Where every allocation (cache hits too) is prefetched, on its own stream and in its
        order, right after it is made: the resource's device ("device"), a device ordinal, or
        the host. None (default): no prefetch. Not on a capturing stream (the driver would
        invalidate the capture); a prefetch the driver refuses leaves the allocation as it is
        and counts in :func:`asyncmr.failed_prefetches`.
    discard : bool
        With ``prefetch``: drop each allocation's previous contents as it is prefetched (one
        ``cudaMemDiscardAndPrefetchBatchAsync``), so its pages are placed without copying what
        they held; a new allocation's contents are undefined anyway. Reused pool memory last
        touched by the host then reaches the device several times faster (docs/DRIVER_FACTS.md).
        Only whole pages inside the allocation are dropped, never a neighbour's. CUDA 13 build
        only (:func:`asyncmr.can_discard`); default False.

    Host code may touch a block only after the stream it was allocated on has reached the
    allocation (synchronize, or wait on an event recorded after it). With ``discard=True`` host
    writes made before that are lost.
    """

    _allocation_type = "managed"

    def __cinit__(self, device=None, *, pool="default", location=None,
                  release_threshold=None, accessible_from="all", reserve=0, cache=None,
                  prefetch=None, discard=False):
        cdef resource_options o
        adopted, where = _managed_options(device, pool, location, release_threshold,
                                          accessible_from, reserve, cache, prefetch, discard, &o)
        self._prepare(adopted)
        if where is not None and not o.prefetch.has_value():  # "device", for the current device
            o.prefetch = optional[location_t](target_location(where, o.device))
        self._adopt_pool()
        self.c_obj = make_resource[async_managed_memory_resource, resource_options](
            self._adopt, o)
        self._bind(self.c_obj.get(), make_ref(deref(self.c_obj)))

    @property
    def device(self):
        """The device the resource is for."""
        return deref(self.c_obj).device()

    @property
    def prefetch(self):
        """Where allocations are prefetched to (a :class:`Location`), or None."""
        cdef optional[location_t] to = deref(self.c_obj).prefetch_target()
        return from_location(to.value()) if to.has_value() else None

    @property
    def discard(self):
        """Whether a prefetch at allocation drops the old contents (``discard=True``)."""
        return deref(self.c_obj).prefetch_discards()


cdef class AsyncPinnedMR(_PoolResource):
    """Stream-ordered pinned host memory from a host memory pool; an RMM resource.

    Parameters
    ----------
    pool : "default" | "current" | "new" | int | MemPool | pool object
        As for :class:`AsyncManagedMR`; the default is the default host pinned pool.
    numa_node : int, optional
        Take memory from this host NUMA node (default: any host memory).
    accessible_from : "all" | int | list of int
        Devices granted read-write access to the pool (host pools start with none; a kernel
        touching memory it cannot access kills the CUDA context). On a shared pool this is a
        process-wide effect. An empty list grants none: memory for the host alone (the driver
        is not asked, so access a shared pool already grants stays).
    release_threshold : int, optional
        As for :class:`AsyncManagedMR`.
    reserve : int
        As for :class:`AsyncManagedMR`.
    cache : int, optional
        As for :class:`AsyncManagedMR`.
    """

    _allocation_type = "pinned"

    def __cinit__(self, *, pool="default", numa_node=None, accessible_from="all",
                  release_threshold=None, reserve=0, cache=None):
        cdef resource_options o
        self._prepare(_common_options(pool, release_threshold, cache, reserve, &o))
        o.numa_node = to_ordinal(numa_node, "numa_node")
        o.accessible_from = to_devices(accessible_from)
        check_resource_options(allocation_type_t.pinned, o, False)
        self._adopt_pool()
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
    pool : "default" | "current" | "new" | int | MemPool | pool object
        As for :class:`AsyncManagedMR`; the default pool is the one ``cudaMallocAsync`` uses.
    release_threshold : int, optional
        As for :class:`AsyncManagedMR`.
    reserve : int
        As for :class:`AsyncManagedMR`.
    cache : int, optional
        As for :class:`AsyncManagedMR`.
    """

    _allocation_type = "device"

    def __cinit__(self, device=None, *, pool="default", release_threshold=None, reserve=0,
                  cache=None):
        cdef resource_options o
        self._prepare(_common_options(pool, release_threshold, cache, reserve, &o))
        o.device = to_ordinal(device, "device")
        check_resource_options(allocation_type_t.device, o, False)
        self._adopt_pool()
        self.c_obj = make_resource[async_device_memory_resource, resource_options](
            self._adopt, o)
        self._bind(self.c_obj.get(), make_ref(deref(self.c_obj)))

    @property
    def device(self):
        """The device the memory lives on."""
        return deref(self.c_obj).device()
