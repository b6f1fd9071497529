# SPDX-License-Identifier: Apache-2.0
# The three pool-backed RMM resources and what they share (resources.pyx):
# include/asyncmr/pool_resource.hpp, front_cache_stats.hpp, history.hpp (HistoryAction is a
# Python enum of this module), resource_options.hpp and async_{managed,pinned,device}_memory_
# resource.hpp. The extension types are declared here for the modules that take one
# (asyncmr._cudf).

from libc.stdint cimport int64_t, uint32_t, uint64_t, uintptr_t
from libcpp cimport bool as cbool
from libcpp.memory cimport shared_ptr
from libcpp.optional cimport optional
from libcpp.string cimport string
from libcpp.vector cimport vector

from rmm.librmm.memory_resource cimport device_async_resource_ref
from rmm.pylibrmm.memory_resource._memory_resource cimport DeviceMemoryResource

from asyncmr._core.conversions cimport AllocationType as allocation_type_t
from asyncmr._core.conversions cimport PoolSource as pool_source_t
from asyncmr._core.conversions cimport location_t
from asyncmr._core.mem_pool cimport MemPool, mem_pool
from asyncmr._core.runtime cimport translate_exception


cdef extern from "asyncmr/front_cache_stats.hpp" namespace "asyncmr" nogil:
    cdef cppclass front_cache_stats:
        uint64_t hits
        uint64_t misses
        uint64_t refused_cap
        uint64_t refused_uncacheable
        uint64_t refused_not_recorded
        uint64_t refused_wrong_size
        uint64_t refused_double_free
        uint64_t refused_unmarked
        uint64_t refused_no_memory
        uint64_t untracked
        uint64_t reclaims
        uint64_t reclaimed_blocks
        size_t cached_bytes
        size_t cached_blocks
        size_t parked_bytes
        size_t parked_blocks
        size_t recorded_blocks
        size_t charged_bytes
        size_t charged_high
        size_t streams


cdef extern from "asyncmr/history.hpp" namespace "asyncmr" nogil:
    cpdef enum class HistoryAction "asyncmr::history_action" (uint32_t):
        alloc
        free
        cache_hit
        cache_put
        grow
        trim
        oom

    cdef cppclass history_event "asyncmr::history_event":
        uint64_t time_ns
        uint64_t address
        uint64_t bytes
        uint64_t stream
        uint64_t reserved
        uint64_t used
        uint64_t cached
        HistoryAction action
        uint64_t number

    # The number of the event this thread recorded last (no_history_event: none since forgotten).
    const uint64_t no_history_event
    void forget_last_history_event()
    uint64_t last_history_event()


cdef extern from "asyncmr/pool_resource.hpp" namespace "asyncmr" nogil:
    uint64_t c_failed_deallocations "asyncmr::failed_deallocations"()

    enum class FreeStatus "asyncmr::free_status" (int):
        freed
        not_this_resource
        wrong_size
        already_free
        driver_refused

    cdef cppclass free_result "asyncmr::free_result":
        FreeStatus status

    cdef cppclass pool_resource "asyncmr::pool_resource":
        const mem_pool& pool()
        size_t cache_capacity()
        optional[front_cache_stats] cache_stats() except +translate_exception
        void release_cache() except +translate_exception
        void trim_to(size_t) except +translate_exception
        void start_history(size_t) except +translate_exception
        vector[history_event] stop_history(uint64_t&) except +translate_exception
        vector[history_event] read_history(uint64_t&) except +translate_exception
        cbool recording_history()
        optional[location_t] prefetch_target()
        cbool prefetch_discards()


cdef extern from "asyncmr/resource_options.hpp" namespace "asyncmr" nogil:
    cdef cppclass resource_options:
        optional[int] device
        pool_source_t source
        optional[location_t] location
        optional[int] numa_node
        optional[uint64_t] release_threshold
        optional[vector[int]] accessible_from
        size_t reserve
        size_t cache
        optional[location_t] prefetch
        cbool discard

    void check_resource_options(allocation_type_t, const resource_options&, cbool) \
        except +translate_exception


cdef extern from "asyncmr/async_managed_memory_resource.hpp" namespace "asyncmr" nogil:
    cdef cppclass async_managed_memory_resource(pool_resource):
        int device()


cdef extern from "asyncmr/async_pinned_memory_resource.hpp" namespace "asyncmr" nogil:
    cdef cppclass async_pinned_memory_resource(pool_resource):
        pass


cdef extern from "asyncmr/async_device_memory_resource.hpp" namespace "asyncmr" nogil:
    cdef cppclass async_device_memory_resource(pool_resource):
        int device()


cdef extern from "_core/bridge.hpp" namespace "asyncmr_py" nogil:
    shared_ptr[R] make_resource[R, O](const mem_pool*, const O&) except +translate_exception
    uintptr_t allocate(pool_resource&, uintptr_t, size_t) except +translate_exception
    free_result deallocate(pool_resource&, uintptr_t, uintptr_t, size_t)
    string free_failure(const free_result&, uintptr_t, size_t) except +translate_exception


cdef class _PoolResource(DeviceMemoryResource):
    cdef object __weakref__
    cdef readonly MemPool pool
    cdef pool_resource* c_base
    cdef int _gil
    cdef int64_t _headroom
    cdef uint32_t _since_refresh
    cdef mem_pool* _adopt   # the adopted pool while a subclass builds, else NULL
    cdef object _adopted    # keeps it alive meanwhile
    cdef object _recorder   # the running record_history, or None

    cdef _prepare(self, adopted)
    cdef _adopt_pool(self)
    cdef _bind(self, pool_resource* base, optional[device_async_resource_ref] ref)
    cdef void _refresh_headroom(self) noexcept
    cdef uintptr_t _allocate_core(self, size_t n, uintptr_t s) except? 0


cdef class AsyncManagedMR(_PoolResource):
    cdef shared_ptr[async_managed_memory_resource] c_obj


cdef class AsyncPinnedMR(_PoolResource):
    cdef shared_ptr[async_pinned_memory_resource] c_obj


cdef class AsyncDeviceMR(_PoolResource):
    cdef shared_ptr[async_device_memory_resource] c_obj
