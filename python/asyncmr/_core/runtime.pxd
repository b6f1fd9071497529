# SPDX-License-Identifier: Apache-2.0
# The one translator from C++ exceptions to Python's (runtime.pyx): every declaration of a call
# that can throw names it, `except +translate_exception`. Cimporting it imports this module
# first, which sets up the exception types and the GIL hooks.

cdef void translate_exception() noexcept
