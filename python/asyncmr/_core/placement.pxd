# SPDX-License-Identifier: Apache-2.0
# Moving managed memory in stream order (placement.pyx): include/asyncmr/placement.hpp, whose calls
# take a span and a stream (bridge.hpp passes them as Cython can), and the ranges an object names.

from libc.stdint cimport uint64_t, uintptr_t
from libcpp cimport bool as cbool
from libcpp.vector cimport vector

from asyncmr._core.conversions cimport location_t
from asyncmr._core.runtime cimport translate_exception


cdef extern from "asyncmr/placement.hpp" namespace "asyncmr" nogil:
    cdef cppclass memory_range:
        void* ptr
        size_t bytes

    cbool c_can_discard "asyncmr::can_discard"()
    uint64_t c_failed_prefetches "asyncmr::failed_prefetches"()


cdef extern from "_core/bridge.hpp" namespace "asyncmr_py" nogil:
    void prefetch_ranges(const vector[memory_range]&, location_t, uintptr_t) \
        except +translate_exception
    void discard_ranges(const vector[memory_range]&, uintptr_t) except +translate_exception
    void discard_and_prefetch_ranges(const vector[memory_range]&, location_t, uintptr_t) \
        except +translate_exception
    void advise_ranges(const vector[memory_range]&, int, location_t) except +translate_exception


cdef vector[memory_range] as_ranges(obj) except *
