# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3, embedsignature=True
"""The vocabulary of pools (include/asyncmr/location.hpp) and Python values converted to the C++
types, each error naming the argument (see conversions.pxd). The Python spellings of the C++
enums are made here, from C++."""

from asyncmr._core.capability cimport current_device

from asyncmr import _validate
from asyncmr._location import Location

#: The Python spellings, mapped onto the C++ enums (whose values come from C++).
POOL_SOURCES = {pool_source_name(s).decode(): s for s in PoolSource}
_TYPES = {t.name: t for t in AllocationType}
_KINDS = {k.name: k for k in LocationKind}
ALLOCATION_TYPES = tuple(_TYPES)
LOCATION_KINDS = tuple(_KINDS)


cdef location_t to_location(value) except *:
    """A validated :class:`Location` as the C++ value."""
    if not isinstance(value, Location):
        raise TypeError(
            "location must be an asyncmr.Location (e.g. Location.device(0), Location.host()), "
            f"got {_validate.type_name(value)}")
    _validate.location_kind(value)
    kind = _KINDS.get(value.kind)
    if kind is None:
        raise ValueError(f"unknown location kind {value.kind!r}; expected one of {LOCATION_KINDS}")
    cdef location_t loc
    loc.kind = kind
    loc.id = 0
    if kind in (LocationKind.device, LocationKind.host_numa):
        loc.id = _validate.ordinal(f"{value.kind} id", value.id)
    elif value.id is not None:  # never dropped: Location("host", 3) is not NUMA node 3
        raise ValueError(f"a {value.kind} location takes no id, got {value.id!r}; build it with "
                         f"Location.{value.kind}()"
                         + (" (Location.host_numa(n) names a NUMA node)" if kind ==
                            LocationKind.host else ""))
    return loc


cdef object from_location(const location_t& loc):
    kind = LocationKind(<int>loc.kind)
    return Location(kind.name, loc.id if kind in (LocationKind.device, LocationKind.host_numa)
                    else None)


cdef AllocationType to_type(value) except *:
    """"device", "pinned", "managed" or an :class:`AllocationType` member."""
    if isinstance(value, AllocationType):
        return value
    if not isinstance(value, str):
        raise TypeError("allocation_type must be 'device', 'pinned', 'managed' or an "
                        f"AllocationType, got {_validate.type_name(value)}")
    t = _TYPES.get(value)
    if t is None:
        raise ValueError(f"unknown allocation_type {value!r}; expected one of {ALLOCATION_TYPES}")
    return t


cdef PoolSource to_source(value) except *:
    """"default", "current", "new" or a :class:`PoolSource` member."""
    if isinstance(value, PoolSource):
        return value
    # A number is no choice: PoolSource's values are its own.
    return POOL_SOURCES[_validate.choice(
        f"pool must be one of {tuple(POOL_SOURCES)} or a PoolSource", value, POOL_SOURCES)]


cdef size_t size_t_slow(value, name) except? <size_t>-1:
    value = _validate.as_integer(value, name)  # NumPy's integers too; never a bool or a float
    if not 0 <= value < 2**64:
        raise ValueError(f"{name} must be in [0, 2**64), got {value}")
    return <size_t>value


cdef optional[uint64_t] to_bytes(name, value) except *:
    cdef optional[uint64_t] out
    v = _validate.size(name, value)
    if v is not None:
        out = optional[uint64_t](<uint64_t>v)
    return out


cdef optional[vector[int]] to_devices(value) except *:
    cdef optional[vector[int]] out
    cdef vector[int] c_ids
    all_devices, ids = _validate.devices(value)
    if not all_devices:
        c_ids = ids
        out = optional[vector[int]](c_ids)
    return out


cdef optional[int] to_ordinal(value, what) except *:
    cdef optional[int] out
    v = _validate.device(value, what)
    if v is not None:
        out = optional[int](<int>v)
    return out


cdef location_t target_location(where, optional[int] device) except *:
    """A target ``_validate.target`` took ("device", "host", a device ordinal or a
    :class:`Location`) as the C++ location. "device" is ``device``, else the current device,
    which asks the driver: callers check every other argument first."""
    cdef location_t loc
    if isinstance(where, Location):
        return to_location(where)
    if where == "device":
        loc.kind = LocationKind.device
        loc.id = device.value() if device.has_value() else current_device()
    elif where == "host":
        loc.kind = LocationKind.host
        loc.id = 0
    else:
        loc.kind = LocationKind.device
        loc.id = where
    return loc
