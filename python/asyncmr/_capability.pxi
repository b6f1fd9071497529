# SPDX-License-Identifier: Apache-2.0
# Included by _core.pyx. What this build, driver and device support (include/asyncmr/capability.hpp),
# and the versions.

# ---- module functions --------------------------------------------------------------------------

def attribute_table():
    """The rows of the C++ attribute table: (name, cuda value, kind, access, min driver), with
    kind and access as :class:`AttributeKind` / :class:`AttributeAccess` members."""
    rows = []
    cdef const attribute_info* row
    for i in range(attribute_count()):
        row = &attribute_row(i)
        rows.append((attribute_name(i).decode(), row.cuda_value, AttributeKind(<int>row.kind),
                     AttributeAccess(<int>row.access), row.min_driver))
    return rows


def _location_kind_from_cuda(int value):
    """The :class:`LocationKind` a driver ``cudaMemLocationType`` value names."""
    return LocationKind(<int>kind_from_cuda(value))


def driver_version():
    """The CUDA driver version (13000 = 13.0); 0 when no driver is installed."""
    return versions().driver


def runtime_version():
    """The CUDA runtime version asyncmr was built with (13000 = 13.0; 12090 = 12.9)."""
    return versions().runtime


def device_count():
    """The number of visible CUDA devices (raises NoDeviceError when CUDA is unusable)."""
    return require_cuda()


def failed_deallocations():
    """How many stream-ordered frees through asyncmr's resources the driver refused since the
    process started. Frees made by RMM and C++ code are also logged through RMM's logger;
    ``deallocate()`` called from Python raises :class:`CUDAError` instead."""
    return c_failed_deallocations()


def failed_prefetches():
    """How many prefetches of new allocations (``AsyncManagedMR(prefetch=...)``) the driver
    refused since the process started; each left its allocation where it was."""
    return c_failed_prefetches()


def _set_testing_driver_version(int version):
    """Tests only: act as if the driver were ``version`` (0 restores the real one)."""
    set_testing_driver_version(version)


def _parked_pools():
    """Tests only: how many closed pools asyncmr still holds undestroyed (a block live, a free
    still queued, an allocation in flight), after destroying those that have become empty."""
    return testing_parked_pools()


def _decide_pool_support(*, driver, build, location, allocation_type, pool="default",
                         memory_pools=True, concurrent_managed_access=True,
                         host_memory_pools=True, host_numa_memory_pools=True):
    """Tests and ``asyncmr info``: the support decision for a platform given by value (no CUDA
    call). Returns ``(path name or None, reason)``."""
    cdef location_t c_loc = to_location(location)
    cdef AllocationType t = to_type(allocation_type)
    cdef PoolSource source = to_source(pool)
    validate_combination(c_loc, t, source == PoolSource.new_pool)
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
    cdef AllocationType t = to_type(allocation_type)
    cdef PoolSource source = to_source(pool)
    validate_combination(c_loc, t, source == PoolSource.new_pool)
    cdef int device = c_loc.id if c_loc.kind == LocationKind.device else _current_device()
    return _support_result(decide_pool_support(current_platform(device), c_loc, t, source))


cdef extern from "asyncmr/asyncmr.hpp" namespace "asyncmr" nogil:
    int _current_device "asyncmr::current_device"() except +translate_exception
