# SPDX-License-Identifier: Apache-2.0
# The C++ side, declared once, with its own types: C++ enums become Python enums here (their
# values come from the C++ compiler, so nothing is written twice), optionals stay optionals.
# Every call that can throw goes through the one translator, asyncmr_py::translate_exception.

from libc.stdint cimport int64_t, uint32_t, uint64_t, uintptr_t
from libcpp cimport bool as cbool
from libcpp.memory cimport shared_ptr, unique_ptr
from libcpp.optional cimport optional
from libcpp.string cimport string
from libcpp.vector cimport vector


cdef extern from "cuda_runtime_api.h" nogil:
    ctypedef int cudaError_t
    ctypedef void* cudaStream_t


cdef extern from "_bridge.hpp" namespace "asyncmr_py" nogil:
    cdef void translate_exception()


cdef extern from "asyncmr/asyncmr.hpp" namespace "asyncmr" nogil:
    cpdef enum class LocationKind "asyncmr::location_kind" (int):
        none
        device
        host
        host_numa
        host_numa_current

    cpdef enum class AllocationType "asyncmr::allocation_type" (int):
        device
        pinned
        managed

    cpdef enum class PoolSource "asyncmr::pool_source" (int):
        default_pool
        current
        new_pool

    cpdef enum class AccessMode "asyncmr::access_mode" (int):
        none
        read
        read_write

    cpdef enum class AttributeKind "asyncmr::attribute_kind" (int):
        boolean
        integer
        bytes

    cpdef enum class AttributeAccess "asyncmr::attribute_access" (int):
        read_only
        read_write
        reset_only

    cpdef enum class PoolPath "asyncmr::pool_path" (int):
        runtime
        driver_entry_point
        stand_in

    cpdef enum class ExportHandle "asyncmr::export_handle" (int):
        posix_fd
        fabric

    cdef cppclass exported_pointer:
        unsigned char bytes[64]

    cdef cppclass location_t "asyncmr::location":
        LocationKind kind
        int id

    cdef cppclass device_facts_t "asyncmr::device_facts":
        cbool memory_pools
        cbool concurrent_managed_access
        cbool host_memory_pools
        cbool host_numa_memory_pools

    cdef cppclass platform:
        int driver
        int build
        device_facts_t device

    cdef cppclass support:
        optional[PoolPath] path
        string reason

    support decide_pool_support(const platform&, const location_t&, AllocationType,
                                PoolSource) except +translate_exception
    support decide_routing_support(const platform&, AllocationType) except +translate_exception
    platform current_platform(int) except +translate_exception
    int require_cuda() except +translate_exception
    int c_current_device "asyncmr::current_device"() except +translate_exception
    cbool c_can_discard "asyncmr::can_discard"()

    cdef cppclass memory_range:
        void* ptr
        size_t bytes

    cdef cppclass cuda_versions:
        int driver
        int runtime
    cuda_versions versions()

    cdef cppclass attribute_info:
        int cuda_value
        AttributeKind kind
        AttributeAccess access
        int min_driver

    cdef cppclass pool_properties:
        AllocationType type
        location_t location
        size_t max_size
        int export_handle_types
        optional[uint64_t] release_threshold

    cdef cppclass pool_usage:
        uint64_t reserved
        uint64_t used

    cdef cppclass mem_pool:
        mem_pool()
        mem_pool(const mem_pool&)
        @staticmethod
        mem_pool default_pool(location_t, AllocationType) except +translate_exception
        @staticmethod
        mem_pool current(location_t, AllocationType) except +translate_exception
        @staticmethod
        mem_pool create(const pool_properties&) except +translate_exception
        cbool owned()
        cbool closed()
        optional[location_t] location() except +translate_exception
        optional[AllocationType] type() except +translate_exception
        void reset_peaks() except +translate_exception
        void trim_to(size_t) except +translate_exception
        void set_access(const vector[int]&, AccessMode) except +translate_exception
        AccessMode access(int) except +translate_exception
        mem_pool make_current() except +translate_exception
        void close() except +translate_exception
        cbool operator==(const mem_pool&)
        int export_fd() except +translate_exception
        @staticmethod
        mem_pool import_fd(int, location_t, AllocationType) except +translate_exception
        cbool imported()
        optional[pool_usage] usage()

    cdef cppclass resource_options:
        optional[int] device
        PoolSource source
        optional[location_t] location
        optional[int] numa_node
        optional[uint64_t] release_threshold
        optional[vector[int]] accessible_from
        size_t reserve
        size_t cache
        optional[location_t] prefetch
        cbool discard

    cdef cppclass imported_allocation:
        size_t size()
        cbool released()

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

    enum class FreeStatus "asyncmr::free_status" (int):
        freed
        not_this_resource
        wrong_size
        already_free
        driver_refused

    cdef cppclass free_result "asyncmr::free_result":
        FreeStatus status
        cudaError_t error
        size_t recorded_bytes
        cbool cached

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

    # The number of the event this thread recorded last (history_no_event: none since forgotten).
    const uint64_t history_no_event "asyncmr::no_history_event"
    void history_forget_last_event "asyncmr::forget_last_history_event"()
    uint64_t history_last_event "asyncmr::last_history_event"()

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

    cdef cppclass async_managed_memory_resource(pool_resource):
        int device()

    cdef cppclass async_pinned_memory_resource(pool_resource):
        pass

    cdef cppclass async_device_memory_resource(pool_resource):
        int device()

    uint64_t c_failed_deallocations "asyncmr::failed_deallocations"()
    uint64_t c_failed_prefetches "asyncmr::failed_prefetches"()
    void validate_combination "asyncmr::validate_combination"(
        const location_t&, AllocationType, cbool) except +translate_exception
    void check_fields "asyncmr::check_resource_options"(
        AllocationType, const resource_options&, cbool) except +translate_exception
    exported_pointer c_export_pointer "asyncmr::export_pointer"(void*) except +translate_exception


cdef extern from "asyncmr/asyncmr.hpp" namespace "asyncmr::testing" nogil:
    void set_testing_driver_version "asyncmr::testing::set_driver_version"(int)
    size_t testing_parked_pools "asyncmr::testing::parked_pools"() except +translate_exception


cdef extern from "_bridge.hpp" namespace "asyncmr_py" nogil:
    void set_exception_types(object, object, object, object)
    shared_ptr[R] make_resource[R, O](const mem_pool*, const O&) except +translate_exception
    void prefetch_ranges(const vector[memory_range]&, location_t, uintptr_t) except +translate_exception
    void discard_ranges(const vector[memory_range]&, uintptr_t) except +translate_exception
    void discard_and_prefetch_ranges(const vector[memory_range]&, location_t, uintptr_t) \
        except +translate_exception
    void advise_ranges(const vector[memory_range]&, int, location_t) except +translate_exception
    uintptr_t allocate(pool_resource&, uintptr_t, size_t) except +translate_exception
    free_result deallocate(pool_resource&, uintptr_t, uintptr_t, size_t)
    string free_failure(const free_result&, uintptr_t, size_t) except +translate_exception
    void install_blocking_hooks()
    unique_ptr[imported_allocation] import_pointer(const mem_pool&, const exported_pointer&) \
        except +translate_exception
    void release_import(imported_allocation&, uintptr_t) except +translate_exception
    void release_import_on_own_stream(imported_allocation&) except +translate_exception
    uintptr_t import_address(const imported_allocation&)
    uintptr_t handle_of(const mem_pool&) except +translate_exception
    mem_pool adopt_handle(uintptr_t, cbool, optional[location_t], optional[AllocationType]) \
        except +translate_exception
    uint64_t get_attribute(const mem_pool&, size_t) except +translate_exception
    void set_attribute(const mem_pool&, size_t, uint64_t) except +translate_exception
    LocationKind kind_from_cuda(int) except +translate_exception
    size_t attribute_count()
    const attribute_info& attribute_row(size_t) except +translate_exception
    const char* attribute_name(size_t) except +translate_exception
    const char* error_name(cudaError_t)
    const char* error_text(cudaError_t)


# ---- the extension types, declared here so other modules (asyncmr._cudf) can cimport them ----

from rmm.librmm.memory_resource cimport device_async_resource_ref
from rmm.pylibrmm.memory_resource._memory_resource cimport DeviceMemoryResource


cdef class MemPool:
    cdef unique_ptr[mem_pool] c_pool
    cdef object _hash_key
    cdef object _owner      # the object owning the pool this views (a cuda.core resource): kept alive
    cdef object __weakref__

    @staticmethod
    cdef MemPool wrap(const mem_pool& pool)
    cdef mem_pool* get(self) except NULL


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
