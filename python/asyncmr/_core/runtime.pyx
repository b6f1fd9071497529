# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3, embedsignature=True
"""Set up once per process when imported (asyncmr._core imports it first): every asyncmr wait on
the device lets the GIL go (see runtime.hpp)."""


cdef extern from "_core/runtime.hpp" namespace "asyncmr_py":
    void install_blocking_hooks() noexcept


install_blocking_hooks()
