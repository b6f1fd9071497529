# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3, embedsignature=True
"""What the interpreter needs around every call into libasyncmr.so, set up once per process when
this module is imported: C++ exceptions become Python's through the one translator, and every
asyncmr wait on the device lets the GIL go (see runtime.hpp). Every module that declares a C++
call cimports the translator from here, so this module is imported before any of them runs."""

from asyncmr._exceptions import CUDAError, NoDeviceError, PoolClosedError, UnsupportedError


cdef extern from "_core/runtime.hpp" namespace "asyncmr_py":
    void set_exception_types(object, object, object, object)
    void translate_current_exception() noexcept
    void install_blocking_hooks() noexcept


set_exception_types(NoDeviceError, UnsupportedError, PoolClosedError, CUDAError)
install_blocking_hooks()


cdef void translate_exception() noexcept:
    translate_current_exception()
