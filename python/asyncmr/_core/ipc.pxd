# SPDX-License-Identifier: Apache-2.0
# What crosses processes (ipc.pyx; src/ipc.cpp): the IPC part of include/asyncmr/mem_pool.hpp
# (export handle types, exported pointers, imported allocations; ExportHandle is a Python enum of
# this module). MemPool (mem_pool.pxd) exports and imports through this module; nothing here
# needs MemPool's type, so the modules import each other one way.

from libc.stdint cimport uintptr_t
from libcpp cimport bool as cbool
from libcpp.memory cimport unique_ptr

from asyncmr._core.runtime cimport translate_exception


cdef extern from "asyncmr/mem_pool.hpp" namespace "asyncmr" nogil:
    cpdef enum class ExportHandle "asyncmr::export_handle" (int):
        posix_fd
        fabric

    cdef cppclass exported_pointer:
        unsigned char bytes[64]

    exported_pointer c_export_pointer "asyncmr::export_pointer"(void*) \
        except +translate_exception

    cdef cppclass imported_allocation:
        size_t size()
        cbool released()


cdef extern from "_core/bridge.hpp" namespace "asyncmr_py" nogil:
    void release_import(imported_allocation&, uintptr_t) except +translate_exception
    void release_import_on_own_stream(imported_allocation&) except +translate_exception
    uintptr_t import_address(const imported_allocation&)


cdef int export_handle_bits(value) except -1


cdef class ImportedAllocation:
    cdef readonly object pool   # the MemPool imported from: kept alive
    cdef readonly uintptr_t ptr
    cdef readonly size_t nbytes
    cdef unique_ptr[imported_allocation] c_import

    @staticmethod
    cdef ImportedAllocation _make(object pool, unique_ptr[imported_allocation]& imported,
                                  size_t nbytes)
