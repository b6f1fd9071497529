# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3, embedsignature=True
"""MemPool and the three pool-backed RMM memory resources."""

import contextlib

from cython.operator cimport dereference as deref
from libc.stdint cimport INT64_MAX, int64_t, uint32_t, uint64_t, uintptr_t
from libcpp.memory cimport shared_ptr, unique_ptr
from libcpp.optional cimport optional, nullopt
from libcpp.vector cimport vector

from rmm.pylibrmm.stream cimport Stream
from rmm.pylibrmm.utils cimport as_stream

from rmm.pylibrmm.stream import DEFAULT_STREAM

from asyncmr import _foreign_pools, _validate
from asyncmr._exceptions import CUDAError, NoDeviceError, PoolClosedError, UnsupportedError
from asyncmr._location import Location

set_exception_types(NoDeviceError, UnsupportedError, PoolClosedError, CUDAError)
# Every asyncmr wait on the device releases the GIL from now on (see _bridge.hpp).
install_blocking_hooks()

# The Python spellings, mapped onto the C++ enums (whose values come from C++).
cdef extern from "asyncmr/asyncmr.hpp" namespace "asyncmr" nogil:
    const char* source_name "asyncmr::to_string"(PoolSource)
    const char* type_name "asyncmr::to_string"(AllocationType)

POOL_SOURCES = {source_name(s).decode(): s for s in PoolSource}
_TYPES = {t.name: t for t in AllocationType}
_KINDS = {k.name: k for k in LocationKind}
ALLOCATION_TYPES = tuple(_TYPES)
LOCATION_KINDS = tuple(_KINDS)
ACCESS_MODES = {"none": AccessMode.none, "r": AccessMode.read, "rw": AccessMode.read_write}
_ACCESS_NAMES = {v: k for k, v in ACCESS_MODES.items()}
GIL_POLICIES = ("auto", "always", "never")
_HISTORY_ACTIONS = {int(a): a.name for a in HistoryAction}

# One extension module, its concerns in one file each (included here, in dependency order):
# the C++ library is linked into it statically, and its process-wide state (the registry of
# owned pools, the caches, the reclaimer, the blocking hooks) must exist once. See
# docs/ARCHITECTURE.md.
include "_conversions.pxi"
include "_capability.pxi"
include "_mem_pool.pxi"
include "_ipc.pxi"
include "_resources.pxi"
include "_placement.pxi"
