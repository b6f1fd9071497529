# SPDX-License-Identifier: Apache-2.0
"""Signatures of asyncmr._core.conversions, and the argument types the other stubs share, for editors and type checkers. Checked against the built
module by ``python -m mypy.stubtest`` (ci/check_stubs.py, run by tests/test_project.py)."""

import enum
from collections.abc import Iterable
from typing import Any, Literal, SupportsIndex, TypeAlias

# The C++ enums of include/asyncmr/location.hpp, with the values the C++ compiler gave them.
class LocationKind(enum.IntEnum):
    none = ...
    device = ...
    host = ...
    host_numa = ...
    host_numa_current = ...

class AllocationType(enum.IntEnum):
    device = ...
    pinned = ...
    managed = ...

class PoolSource(enum.IntEnum):
    default_pool = ...
    current = ...
    new_pool = ...

# The argument types every part takes.
_AllocationTypeName: TypeAlias = Literal["device", "pinned", "managed"]
_AllocationTypeLike: TypeAlias = _AllocationTypeName | AllocationType
_PoolName: TypeAlias = Literal["default", "current", "new"]
_PoolLike: TypeAlias = _PoolName | PoolSource
_AccessModeName: TypeAlias = Literal["rw", "r", "none"]
# Where an int is taken, so is any integer type (NumPy's): what operator.index takes, but bool.
_Int: TypeAlias = SupportsIndex
_Devices: TypeAlias = Literal["all"] | _Int | Iterable[_Int]
_GilPolicy: TypeAlias = Literal["auto", "always", "never"]
_PathName: TypeAlias = Literal["runtime", "driver_entry_point", "stand_in"]
_ExportHandleName: TypeAlias = Literal["posix_fd", "fabric"]
# Another library's pool object: a cuda.bindings CUmemoryPool or cudaMemPool_t, a cuda.core
# DeviceMemoryResource, PinnedMemoryResource or ManagedMemoryResource, an asyncmr.cuda_core.Resource
# (libraries asyncmr does not import, so not named here).
_PoolObject: TypeAlias = Any

POOL_SOURCES: dict[str, PoolSource]
ALLOCATION_TYPES: tuple[str, ...]
LOCATION_KINDS: tuple[str, ...]
