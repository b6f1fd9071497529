# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3, embedsignature=True
"""What this build, driver and device support (include/asyncmr/capability.hpp), and the
versions."""

from asyncmr._core.conversions cimport (
    LocationKind as location_kind_t,
    to_location,
    to_source,
    to_type,
    validate_combination,
)

from asyncmr import _validate


def driver_version():
    """The CUDA driver version (13000 = 13.0); 0 when no driver is installed."""
    return versions().driver


def runtime_version():
    """The CUDA runtime version asyncmr was built with (13000 = 13.0; 12090 = 12.9)."""
    return versions().runtime


def device_count():
    """The number of visible CUDA devices (raises NoDeviceError when CUDA is unusable)."""
    return require_cuda()


def _set_testing_driver_version(int version):
    """Tests only: act as if the driver were ``version`` (0 restores the real one)."""
    set_testing_driver_version(version)


def _decide_pool_support(*, driver, build, location, allocation_type, pool="default",
                         memory_pools=True, concurrent_managed_access=True,
                         host_memory_pools=True, host_numa_memory_pools=True):
    """Tests and ``asyncmr info``: the support decision for a platform given by value (no CUDA
    call). Returns ``(path name or None, reason)``."""
    cdef location_t c_loc = to_location(location)
    cdef allocation_type_t t = to_type(allocation_type)
    cdef pool_source_t source = to_source(pool)
    validate_combination(c_loc, t, source == pool_source_t.new_pool)
    cdef platform p
    p.driver = driver
    p.build = build
    p.device.memory_pools = memory_pools
    p.device.concurrent_managed_access = concurrent_managed_access
    p.device.host_memory_pools = host_memory_pools
    p.device.host_numa_memory_pools = host_numa_memory_pools
    return _support_result(decide_pool_support(p, c_loc, t, source))


cdef object _support_result(const support& s):
    cdef PoolPath path
    if not s.path.has_value():
        return None, s.reason.decode()
    path = s.path.value()
    return PoolPath(path).name, ""


def device_facts(device):
    """What ``device`` (an ordinal) offers that decides which pools it can have, as asyncmr
    reads it (the facts the support decision uses): ``memory_pools``,
    ``concurrent_managed_access``, ``host_memory_pools``, ``host_numa_memory_pools``
    (attributes a runtime cannot name are read by number; unknown counts as supported, and the
    driver answers at pool creation)."""
    cdef platform p = current_platform(<int>_validate.ordinal("device", device))
    return {"memory_pools": p.device.memory_pools,
            "concurrent_managed_access": p.device.concurrent_managed_access,
            "host_memory_pools": p.device.host_memory_pools,
            "host_numa_memory_pools": p.device.host_numa_memory_pools}


def pool_support(location, allocation_type, pool="default"):
    """How this build reaches a ``pool`` ("default", "current", "new" or a :class:`PoolSource`)
    of ``allocation_type`` ("device", "pinned", "managed" or an :class:`AllocationType`) at
    ``location`` on this driver and device: ``(path, reason)`` where path is "runtime",
    "driver_entry_point", "stand_in" or None (unsupported, and reason says why). Impossible
    combinations raise ValueError."""
    cdef location_t c_loc = to_location(location)
    cdef allocation_type_t t = to_type(allocation_type)
    cdef pool_source_t source = to_source(pool)
    validate_combination(c_loc, t, source == pool_source_t.new_pool)
    cdef int device = c_loc.id if c_loc.kind == location_kind_t.device else current_device()
    return _support_result(decide_pool_support(current_platform(device), c_loc, t, source))
