# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3, embedsignature=True
"""asyncmr's pinned pool as cuDF's pinned memory resource (libcudf's
``cudf::set_pinned_memory_resource``, which pylibcudf 26.10 does not expose). Use it through
:mod:`asyncmr.cudf`."""

from cython.operator cimport dereference as deref
from libcpp cimport bool as cbool

# The resource reference cuDF calls through runs libasyncmr.so, the library every asyncmr
# module links: its registries, and the GIL hooks asyncmr._core.runtime installed, are the ones
# the Python side uses.
from asyncmr._core.resources cimport AsyncPinnedMR, async_pinned_memory_resource
from asyncmr._core.runtime cimport translate_exception


cdef extern from "_cudf_bridge.hpp" namespace "asyncmr_py" nogil:
    cdef cppclass pinned_ref:
        pass
    pinned_ref install_pinned(async_pinned_memory_resource&) except +translate_exception
    pinned_ref reinstall_pinned(const pinned_ref&) except +translate_exception
    pinned_ref current_pinned() except +translate_exception
    cbool is_resource(const pinned_ref&, async_pinned_memory_resource&) except +translate_exception


cdef class CudfPinnedResource:
    """A pinned memory resource cuDF had before asyncmr replaced it (cuDF's default pool, or
    one someone else installed), as :func:`set_pinned_memory_resource` returns it. Hand it back
    to :func:`set_pinned_memory_resource` to restore it. It refers to the resource without
    owning it: whoever installed that one keeps it alive."""

    cdef pinned_ref c_ref

    def __init__(self, *args, **kwargs):
        raise TypeError("CudfPinnedResource objects come from set_pinned_memory_resource()")

    def __repr__(self):
        return "CudfPinnedResource(<cuDF's previous pinned resource>)"


cdef CudfPinnedResource _wrap(const pinned_ref& ref):
    cdef CudfPinnedResource out = CudfPinnedResource.__new__(CudfPinnedResource)
    out.c_ref = ref
    return out


# Every asyncmr resource ever installed stays alive until the process ends: cuDF hands out
# pinned buffers (host columns, I/O staging) that outlive a swap of the resource and free them
# through it later.
_installed = []
_current = None  # the asyncmr resource installed now, if the last install was ours


def install(mr):
    """Make ``mr`` (an :class:`asyncmr.AsyncPinnedMR`, or what an earlier call returned) cuDF's
    pinned memory resource; return the previous one in the same form."""
    global _current
    cdef pinned_ref previous
    if isinstance(mr, AsyncPinnedMR):
        _installed.append(mr)
        previous = install_pinned(deref((<AsyncPinnedMR>mr).c_obj))
        new_current = mr
    elif isinstance(mr, CudfPinnedResource):
        previous = reinstall_pinned((<CudfPinnedResource>mr).c_ref)
        new_current = None
    else:
        raise TypeError("mr must be an asyncmr.AsyncPinnedMR or a resource "
                        f"set_pinned_memory_resource returned, got {type(mr).__name__}")
    was = _current
    _current = new_current
    if was is not None and is_resource(previous, deref((<AsyncPinnedMR>was).c_obj)):
        return was
    return _wrap(previous)


def current():
    """cuDF's pinned memory resource now: the asyncmr resource if it is one installed through
    asyncmr, else a :class:`CudfPinnedResource`."""
    cdef pinned_ref now = current_pinned()
    if _current is not None and is_resource(now, deref((<AsyncPinnedMR>_current).c_obj)):
        return _current
    return _wrap(now)
