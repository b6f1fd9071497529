# SPDX-License-Identifier: Apache-2.0
"""Signatures of asyncmr._core.resources, for editors and type checkers. Checked against the built
module by ``python -m mypy.stubtest`` (ci/check_stubs.py, run by tests/test_project.py)."""

import enum
from typing import Any, Literal, TypeAlias

from typing_extensions import disjoint_base

from rmm.pylibrmm.memory_resource import DeviceMemoryResource
from rmm.pylibrmm.stream import Stream

from asyncmr._attributes import PeakTracker, PoolAttributes
from asyncmr._core.conversions import (
    _AllocationTypeName,
    _Devices,
    _GilPolicy,
    _Int,
    _PoolLike,
    _PoolObject,
)
from asyncmr._core.mem_pool import MemPool
from asyncmr._location import Location
from asyncmr._recorder import HistoryRecorder

# The C++ enum of include/asyncmr/history.hpp.
class HistoryAction(enum.IntEnum):
    alloc = ...
    free = ...
    cache_hit = ...
    cache_put = ...
    grow = ...
    trim = ...
    oom = ...

GIL_POLICIES: tuple[str, ...]

def failed_deallocations() -> int: ...
def _check_managed_options(
    *,
    pool: Any = "default",
    release_threshold: Any = None,
    reserve: Any = 0,
    cache: Any = None,
    prefetch: Any = None,
    discard: Any = False,
) -> None: ...

@disjoint_base
class _PoolResource(DeviceMemoryResource):
    @property
    def pool(self) -> MemPool: ...
    @property
    def pool_handle(self) -> int: ...
    @property
    def owns_pool(self) -> bool: ...
    @property
    def allocation_type(self) -> _AllocationTypeName: ...
    @property
    def location(self) -> Location | None: ...
    @property
    def attributes(self) -> PoolAttributes: ...
    @property
    def cache_info(self) -> dict[str, int] | None: ...
    @property
    def release_gil(self) -> _GilPolicy: ...
    @release_gil.setter
    def release_gil(self, value: _GilPolicy) -> None: ...
    def allocate(self, nbytes: _Int, stream: Stream = ...) -> int: ...
    def deallocate(self, ptr: _Int, nbytes: _Int, stream: Stream = ...) -> None: ...
    def trim_to(self, min_bytes_to_keep: _Int = 0) -> None: ...
    def release_cache(self) -> None: ...
    def record_history(
        self, max_events: _Int = 65536, stacks: Literal["none", "python"] = "none"
    ) -> HistoryRecorder: ...
    def reset_peaks(self) -> None: ...
    def track_peak(self, name: str | None = None) -> PeakTracker: ...

_PoolChoice: TypeAlias = _PoolLike | _Int | MemPool | _PoolObject

@disjoint_base
class AsyncManagedMR(_PoolResource):
    def __init__(
        self,
        device: _Int | None = None,
        *,
        pool: _PoolChoice = "default",
        location: Location | None = None,
        release_threshold: _Int | None = None,
        accessible_from: _Devices = "all",
        reserve: _Int = 0,
        cache: _Int | None = None,
        prefetch: Literal["device", "host"] | _Int | Location | None = None,
        discard: bool = False,
    ) -> None: ...
    @property
    def device(self) -> int: ...
    @property
    def prefetch(self) -> Location | None: ...
    @property
    def discard(self) -> bool: ...

@disjoint_base
class AsyncPinnedMR(_PoolResource):
    def __init__(
        self,
        *,
        pool: _PoolChoice = "default",
        numa_node: _Int | None = None,
        accessible_from: _Devices = "all",
        release_threshold: _Int | None = None,
        reserve: _Int = 0,
        cache: _Int | None = None,
    ) -> None: ...
    @property
    def device(self) -> None: ...

@disjoint_base
class AsyncDeviceMR(_PoolResource):
    def __init__(
        self,
        device: _Int | None = None,
        *,
        pool: _PoolChoice = "default",
        release_threshold: _Int | None = None,
        reserve: _Int = 0,
        cache: _Int | None = None,
    ) -> None: ...
    @property
    def device(self) -> int: ...
