# SPDX-License-Identifier: Apache-2.0
"""asyncmr's compiled modules, one per part, and the names the package takes from them.

Each module is a ``.pyx`` with its ``.pxd``, which declares the C++ it binds (the public headers
of its part, ``include/asyncmr/*.hpp``) and what other modules cimport from it: ``runtime``
(the GIL hooks, imported first; its ``.pxd`` names the exception translator, translate.hpp, which
every module compiles), ``conversions`` (the location
vocabulary, Python values to C++ types), ``capability``, ``ipc`` (what crosses processes),
``mem_pool`` (MemPool, the attribute table), ``resources`` (the three RMM resources) and
``placement``. All of them link the one libasyncmr.so, so its process-wide state exists once
whichever is imported.
"""

# First: installs the GIL hooks before any module calls into libasyncmr.so.
from asyncmr._core import runtime as _runtime  # noqa: F401  # isort: skip
from asyncmr._core.capability import (
    PoolPath,
    _decide_pool_support,
    _set_testing_driver_version,
    device_count,
    device_facts,
    driver_version,
    pool_support,
    runtime_version,
)
from asyncmr._core.conversions import (
    ALLOCATION_TYPES,
    LOCATION_KINDS,
    POOL_SOURCES,
    AllocationType,
    LocationKind,
    PoolSource,
)
from asyncmr._core.ipc import ExportHandle, ImportedAllocation, export_pointer
from asyncmr._core.mem_pool import (
    ACCESS_MODES,
    AccessMode,
    AttributeAccess,
    AttributeKind,
    MemPool,
    _location_kind_from_cuda,
    _parked_pools,
    _spare_pools,
    attribute_table,
)
from asyncmr._core.placement import (
    ADVICE,
    advise,
    can_discard,
    discard,
    discard_and_prefetch,
    failed_prefetches,
    prefetch,
)
from asyncmr._core.resources import (
    GIL_POLICIES,
    AsyncDeviceMR,
    AsyncManagedMR,
    AsyncPinnedMR,
    HistoryAction,
    _check_managed_options,
    _PoolResource,
    failed_deallocations,
)

__all__ = [
    "ACCESS_MODES",
    "ADVICE",
    "ALLOCATION_TYPES",
    "GIL_POLICIES",
    "LOCATION_KINDS",
    "POOL_SOURCES",
    "AccessMode",
    "AllocationType",
    "AsyncDeviceMR",
    "AsyncManagedMR",
    "AsyncPinnedMR",
    "AttributeAccess",
    "AttributeKind",
    "ExportHandle",
    "HistoryAction",
    "ImportedAllocation",
    "LocationKind",
    "MemPool",
    "PoolPath",
    "PoolSource",
    "advise",
    "attribute_table",
    "can_discard",
    "device_count",
    "device_facts",
    "discard",
    "discard_and_prefetch",
    "driver_version",
    "export_pointer",
    "failed_deallocations",
    "failed_prefetches",
    "pool_support",
    "prefetch",
    "runtime_version",
]
