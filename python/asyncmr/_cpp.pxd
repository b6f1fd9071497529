# SPDX-License-Identifier: Apache-2.0
# The C++ side, declared once. Every call that can throw goes through the one translator,
# asyncmr_py::translate_exception, so Python sees asyncmr's exception classes.

from libc.stdint cimport uint64_t, uintptr_t
from libcpp cimport bool
from libcpp.string cimport string
from libcpp.vector cimport vector


cdef extern from "_bridge.hpp" namespace "asyncmr_py" nogil:
    cdef void translate_exception()


cdef extern from "asyncmr/asyncmr.hpp" namespace "asyncmr" nogil:
    cdef cppclass mem_pool:
        bool owned()
        bool closed()
        void trim_to(size_t) except +translate_exception
        void reset_peaks() except +translate_exception
        void close() except +translate_exception
        bool operator==(const mem_pool&)

    cdef cppclass async_managed_memory_resource:
        const mem_pool& pool()
        int device()

    cdef cppclass async_pinned_memory_resource:
        const mem_pool& pool()

    cdef cppclass async_device_memory_resource:
        const mem_pool& pool()
        int device()


cdef extern from "_bridge.hpp" namespace "asyncmr_py" nogil:
    void set_exception_types(object, object, object, object)

    mem_pool* new_pool(int source, int kind, int id, int type) except +translate_exception
    mem_pool* new_created_pool(int kind, int id, int type, size_t max_size, int handle_types,
                               bool has_threshold, uint64_t threshold) \
        except +translate_exception
    mem_pool* new_adopted_pool(uintptr_t handle, bool owned, bool has_location, int kind,
                               int id, int type) except +translate_exception
    mem_pool* copy_pool(const mem_pool&) except +translate_exception
    uintptr_t pool_handle(const mem_pool&) except +translate_exception
    int pool_location_kind(const mem_pool&) except +translate_exception
    int pool_location_id(const mem_pool&) except +translate_exception
    int pool_type(const mem_pool&) except +translate_exception
    bool pool_created(const mem_pool&)
    uint64_t get_attribute(const mem_pool&, int) except +translate_exception
    void set_attribute(mem_pool&, int, uint64_t) except +translate_exception
    void set_access(mem_pool&, const vector[int]&, int) except +translate_exception
    int get_access(const mem_pool&, int) except +translate_exception
    mem_pool* make_current(const mem_pool&) except +translate_exception

    size_t attribute_count()
    const char* attribute_name(size_t)
    int attribute_kind_of(size_t)
    int attribute_access_of(size_t)
    int attribute_min_driver(size_t)
    int attribute_cuda_value(size_t)

    async_managed_memory_resource* new_managed(
        const mem_pool* adopt, bool has_device, int device, int source, bool has_location,
        int kind, int id, bool has_threshold, uint64_t threshold, bool all_devices,
        const vector[int]& devices) except +translate_exception
    async_pinned_memory_resource* new_pinned(
        const mem_pool* adopt, int source, bool has_numa, int numa_node, bool has_threshold,
        uint64_t threshold, bool all_devices, const vector[int]& devices) \
        except +translate_exception
    async_device_memory_resource* new_device(
        const mem_pool* adopt, bool has_device, int device, int source, bool has_threshold,
        uint64_t threshold) except +translate_exception

    int device_count "asyncmr::require_cuda"() except +translate_exception
    int driver_version()
    int runtime_version()
