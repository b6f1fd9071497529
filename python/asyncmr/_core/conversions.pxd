# SPDX-License-Identifier: Apache-2.0
# The vocabulary every part uses (include/asyncmr/location.hpp: where a pool's memory lives, what
# it hands out, which pool of a location a resource takes; its enums are Python enums of this
# module), and Python values converted to the C++ types (conversions.pyx). A conversion refuses
# what cannot reach C++ (a wrong Python type, a bool or float where an int goes, a name that is
# no enum's spelling, an int the C++ type cannot hold), naming the argument; C++ judges the rest.

from libc.stdint cimport uint64_t
from libcpp cimport bool as cbool
from libcpp.optional cimport optional
from libcpp.vector cimport vector

from asyncmr._core.runtime cimport translate_exception


cdef extern from "asyncmr/location.hpp" namespace "asyncmr" nogil:
    cpdef enum class LocationKind "asyncmr::location_kind" (int):
        none
        device
        host
        host_numa
        host_numa_current

    cdef cppclass location_t "asyncmr::location":
        LocationKind kind
        int id

    cpdef enum class AllocationType "asyncmr::allocation_type" (int):
        device
        pinned
        managed

    cpdef enum class PoolSource "asyncmr::pool_source" (int):
        default_pool
        current
        new_pool

    const char* pool_source_name "asyncmr::to_string"(PoolSource)
    void validate_combination(const location_t&, AllocationType, cbool) \
        except +translate_exception


cdef location_t to_location(value) except *
cdef object from_location(const location_t& loc)
cdef AllocationType to_type(value) except *
cdef PoolSource to_source(value) except *
cdef optional[uint64_t] to_bytes(name, value) except *
cdef optional[vector[int]] to_devices(value) except *
cdef optional[int] to_ordinal(value, what) except *
cdef location_t target_location(where, optional[int] device) except *
cdef size_t size_t_slow(value, name) except? <size_t>-1


cdef inline size_t to_size_t(value, name) except? <size_t>-1:
    """A byte count or an address from Python: an int (the fast path) or another integral type
    such as NumPy's, in [0, 2**64); a bool, a float or a negative value is refused by name."""
    if type(value) is int:
        try:
            return <size_t>value
        except OverflowError:
            pass  # negative or too large: the slow path says which
    return size_t_slow(value, name)
