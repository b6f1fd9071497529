# SPDX-License-Identifier: Apache-2.0
"""Signatures of asyncmr._core.capability, for editors and type checkers. Checked against the built
module by ``python -m mypy.stubtest`` (ci/check_stubs.py, run by tests/test_project.py)."""

import enum

from asyncmr._core.conversions import _AllocationTypeLike, _Int, _PathName, _PoolLike
from asyncmr._location import Location

# The C++ enum of include/asyncmr/capability.hpp.
class PoolPath(enum.IntEnum):
    runtime = ...
    driver_entry_point = ...
    stand_in = ...

def driver_version() -> int: ...
def runtime_version() -> int: ...
def device_count() -> int: ...
def device_facts(device: _Int) -> dict[str, bool]: ...
def pool_support(
    location: Location, allocation_type: _AllocationTypeLike, pool: _PoolLike = "default"
) -> tuple[_PathName | None, str]: ...
def _decide_pool_support(
    *,
    driver: int,
    build: int,
    location: Location,
    allocation_type: _AllocationTypeLike,
    pool: _PoolLike = "default",
    memory_pools: bool = True,
    concurrent_managed_access: bool = True,
    host_memory_pools: bool = True,
    host_numa_memory_pools: bool = True,
) -> tuple[_PathName | None, str]: ...
def _set_testing_driver_version(version: int) -> None: ...
