# SPDX-License-Identifier: Apache-2.0
# include/asyncmr/capability.hpp: what this build, driver and device support, and the versions
# (capability.pyx). PoolPath is a Python enum of this module.

from libcpp cimport bool as cbool
from libcpp.optional cimport optional
from libcpp.string cimport string

from asyncmr._core.conversions cimport AllocationType as allocation_type_t
from asyncmr._core.conversions cimport PoolSource as pool_source_t
from asyncmr._core.conversions cimport location_t
from asyncmr._core.runtime cimport translate_exception


cdef extern from "asyncmr/capability.hpp" namespace "asyncmr" nogil:
    cdef cppclass cuda_versions:
        int driver
        int runtime
    cuda_versions versions()

    int require_cuda() except +translate_exception
    int current_device() except +translate_exception

    cdef cppclass device_facts_t "asyncmr::device_facts":
        cbool memory_pools
        cbool concurrent_managed_access
        cbool host_memory_pools
        cbool host_numa_memory_pools

    cdef cppclass platform:
        int driver
        int build
        device_facts_t device

    cpdef enum class PoolPath "asyncmr::pool_path" (int):
        runtime
        driver_entry_point
        stand_in

    cdef cppclass support:
        optional[PoolPath] path
        string reason

    support decide_pool_support(const platform&, const location_t&, allocation_type_t,
                                pool_source_t) except +translate_exception
    platform current_platform(int) except +translate_exception


cdef extern from "asyncmr/capability.hpp" namespace "asyncmr::testing" nogil:
    void set_testing_driver_version "asyncmr::testing::set_driver_version"(int)
