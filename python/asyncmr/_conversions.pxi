# SPDX-License-Identifier: Apache-2.0
# Included by _core.pyx. Python values to the C++ types, checked (each error names the argument).

# ---- conversions -------------------------------------------------------------------------------

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


cdef size_t _size_t_slow(value, name) except? <size_t>-1:
    value = _validate.as_integer(value, name)  # NumPy's integers too; never a bool or a float
    if not 0 <= value < 2**64:
        raise ValueError(f"{name} must be in [0, 2**64), got {value}")
    return <size_t>value


cdef inline size_t _to_size_t(value, name) except? <size_t>-1:
    """A byte count or an address from Python: an int (the fast path) or another integral type
    such as NumPy's, in [0, 2**64); a bool, a float or a negative value is refused by name."""
    if type(value) is int:
        try:
            return <size_t>value
        except OverflowError:
            pass  # negative or too large: the slow path says which
    return _size_t_slow(value, name)


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


cdef location_t _prefetch_target(value, optional[int] device, name="prefetch") except *:
    """AsyncManagedMR's ``prefetch`` and the placement calls' ``to``: "device" (the resource's
    device: ``device``, else the current one), a device ordinal, "host", or a
    :class:`Location` (checked by ``_validate.target``, which names the argument)."""
    cdef location_t loc
    # The resource's option may be unset (None, taken by the caller): its message says so.
    where = _validate.target(name, value, unset=name == "prefetch")
    if isinstance(where, Location):
        return to_location(where)
    if where == "device":
        loc.kind = LocationKind.device
        loc.id = device.value() if device.has_value() else c_current_device()
    elif where == "host":
        loc.kind = LocationKind.host
        loc.id = 0
    else:
        loc.kind = LocationKind.device
        loc.id = where
    return loc


cdef PoolSource to_source(value) except *:
    """"default", "current", "new" or a :class:`PoolSource` member."""
    if isinstance(value, PoolSource):
        return value
    # A number is no choice: PoolSource's values are its own.
    return POOL_SOURCES[_validate.choice(
        f"pool must be one of {tuple(POOL_SOURCES)} or a PoolSource", value, POOL_SOURCES)]
