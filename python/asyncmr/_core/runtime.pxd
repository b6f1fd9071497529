# SPDX-License-Identifier: Apache-2.0
# The translator from C++ exceptions to Python's (translate.hpp): every declaration of a call
# that can throw names it, `except +translate_exception`. It is a header function, so each module
# that cimports it compiles its own copy, as the C++ rethrow inside it needs (translate.hpp says
# why). The GIL hooks are installed by this module's import, which asyncmr._core makes first.

cdef extern from "_core/translate.hpp" namespace "asyncmr_py" nogil:
    void translate_exception() noexcept
