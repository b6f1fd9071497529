# SPDX-License-Identifier: Apache-2.0
# A pool, owned or viewed (mem_pool.pyx): include/asyncmr/mem_pool.hpp (its IPC part is
# ipc.pxd's) and the attribute table of include/asyncmr/pool_attributes.hpp. AccessMode,
# AttributeKind and AttributeAccess are Python enums of this module. MemPool is declared here for
# the modules that hold one (the resources).

from libc.stdint cimport uint64_t, uintptr_t
from libcpp cimport bool as cbool
from libcpp.memory cimport unique_ptr
from libcpp.optional cimport optional
from libcpp.vector cimport vector

from asyncmr._core.conversions cimport AllocationType as allocation_type_t
from asyncmr._core.conversions cimport LocationKind as location_kind_t
from asyncmr._core.conversions cimport location_t
from asyncmr._core.ipc cimport exported_pointer, imported_allocation
from asyncmr._core.runtime cimport translate_exception


cdef extern from "asyncmr/mem_pool.hpp" namespace "asyncmr" nogil:
    cpdef enum class AccessMode "asyncmr::access_mode" (int):
        none
        read
        read_write

    cdef cppclass pool_usage:
        uint64_t reserved
        uint64_t used

    cdef cppclass pool_properties:
        allocation_type_t type
        location_t location
        size_t max_size
        int export_handle_types
        optional[uint64_t] release_threshold

    cdef cppclass mem_pool:
        mem_pool()
        mem_pool(const mem_pool&)
        @staticmethod
        mem_pool default_pool(location_t, allocation_type_t) except +translate_exception
        @staticmethod
        mem_pool current(location_t, allocation_type_t) except +translate_exception
        @staticmethod
        mem_pool create(const pool_properties&) except +translate_exception
        cbool owned()
        cbool closed()
        optional[location_t] location() except +translate_exception
        optional[allocation_type_t] type() except +translate_exception
        void reset_peaks() except +translate_exception
        void trim_to(size_t) except +translate_exception
        void set_access(const vector[int]&, AccessMode) except +translate_exception
        AccessMode access(int) except +translate_exception
        mem_pool make_current() except +translate_exception
        void close() except +translate_exception
        cbool operator==(const mem_pool&)
        int export_fd() except +translate_exception
        @staticmethod
        mem_pool import_fd(int, location_t, allocation_type_t) except +translate_exception
        cbool imported()
        optional[pool_usage] usage()


cdef extern from "asyncmr/mem_pool.hpp" namespace "asyncmr::testing" nogil:
    size_t testing_parked_pools "asyncmr::testing::parked_pools"() except +translate_exception
    size_t testing_spare_pools "asyncmr::testing::spare_pools"() except +translate_exception


cdef extern from "asyncmr/pool_attributes.hpp" namespace "asyncmr" nogil:
    cpdef enum class AttributeKind "asyncmr::attribute_kind" (int):
        boolean
        integer
        bytes

    cpdef enum class AttributeAccess "asyncmr::attribute_access" (int):
        read_only
        read_write
        reset_only

    cdef cppclass attribute_info:
        int cuda_value
        AttributeKind kind
        AttributeAccess access
        int min_driver


cdef extern from "_core/bridge.hpp" namespace "asyncmr_py" nogil:
    uintptr_t handle_of(const mem_pool&) except +translate_exception
    mem_pool adopt_handle(uintptr_t, cbool, optional[location_t], optional[allocation_type_t]) \
        except +translate_exception
    uint64_t get_attribute(const mem_pool&, size_t) except +translate_exception
    void set_attribute(const mem_pool&, size_t, uint64_t) except +translate_exception
    size_t attribute_count()
    const attribute_info& attribute_row(size_t) except +translate_exception
    const char* attribute_name(size_t) except +translate_exception
    location_kind_t kind_from_cuda(int) except +translate_exception
    unique_ptr[imported_allocation] import_pointer(const mem_pool&, const exported_pointer&) \
        except +translate_exception
    void release_import(imported_allocation&, uintptr_t) except +translate_exception


cdef class MemPool:
    cdef unique_ptr[mem_pool] c_pool
    cdef object _hash_key
    cdef object _owner      # the object owning the pool this views (a cuda.core resource): kept alive
    cdef object __weakref__

    @staticmethod
    cdef MemPool wrap(const mem_pool& pool)
    cdef mem_pool* get(self) except NULL
