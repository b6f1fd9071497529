# SPDX-License-Identifier: Apache-2.0
"""Argument checks made before any CUDA call, so bad input never reaches the driver."""

from __future__ import annotations

import enum
import operator
import reprlib
from collections.abc import Mapping

UINT64_MAX = 2**64 - 1
#: The Python spellings of ``pool=`` that name a pool by its role.
POOL_NAMES = ("default", "current", "new")


def ascii_digits(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits: str.isdigit alone also takes superscripts
    (which int() refuses), and it and str.isdecimal take other scripts' digits (which int()
    reads)."""
    return text.isascii() and text.isdigit()


def type_name(value) -> str:
    """The name an error gives ``value``'s type."""
    kind = type(value)  # NumPy's bool is named "bool" too: its module tells
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def integer(value) -> int | None:
    """``value`` as a Python int, or None when it is not an integer: an int or another integral
    type (NumPy's integers), never a bool (of Python or NumPy) or a float."""
    if isinstance(value, int):
        return None if isinstance(value, bool) else int(value)
    try:
        return operator.index(value)  # NumPy's integers; a float or a NumPy bool refuses
    except TypeError:
        return None


def as_integer(value, what: str, kind: str = "an int") -> int:
    """``value`` as an int (see ``integer``), else TypeError naming ``what``."""
    out = integer(value)
    if out is None:
        raise TypeError(f"{what} must be {kind}, got {type_name(value)}")
    return out


def choice(expected: str, value, choices) -> str:
    """``value`` when it is one of the str ``choices``: TypeError ``"{expected}, got <type>"`` for
    a value of another type (a number is no name), ValueError ``"{expected}, got <value>"`` for
    another str."""
    if not isinstance(value, str):
        raise TypeError(f"{expected}, got {type_name(value)}")
    if value not in choices:
        raise ValueError(f"{expected}, got {value!r}")
    return value


def not_a_number(expected: str, value) -> None:
    """TypeError ``"{expected}, got <member> (<type>)"`` for an enum member: a name, never the
    number it is (an IntEnum member is an int: ``LocationKind.host`` would be device 2)."""
    if isinstance(value, enum.Enum):
        raise TypeError(f"{expected}, got {reprlib.repr(value)} ({type_name(value)}): an enum "
                        "member is a name, not a number")


def ordinal(what: str, value) -> int:
    """A :class:`Location`'s device ordinal or NUMA node: an int in [0, 2**31), never an enum
    member. (Location is Python's own value: it is checked as it is built.)"""
    value = c_int(what, value)
    if value < 0:
        raise ValueError(f"{what} must be in [0, 2**31), got {value}")
    return value


def c_int(what: str, value) -> int:
    """A device ordinal or NUMA node on its way to C++: an int that fits a C int, never an enum
    member. Only the width is Python's to judge; C++ refuses a negative one, naming ``what``
    (``detail::check_device_ordinal``, ``check_host_numa_node``)."""
    not_a_number(f"{what} must be an int", value)
    value = as_integer(value, what)
    if not -(2**31) <= value < 2**31:
        raise ValueError(f"{what} must be in [0, 2**31), got {value}")
    return value


def size(name: str, value, *, optional: bool = True) -> int | None:
    """A byte count in [0, 2**64)."""
    if value is None and optional:
        return None
    value = as_integer(value, name, "an int number of bytes")
    if not 0 <= value <= UINT64_MAX:
        raise ValueError(f"{name} must be in [0, 2**64), got {value}")
    return value


def device(value, what: str = "device") -> int | None:
    """A device ordinal (or NUMA node: ``what`` names it) as a C int, or None for the default."""
    return None if value is None else c_int(what, value)


def devices(value, what: str = "accessible_from",
            item: str = "accessible_from device") -> tuple[bool, list[int]]:
    """``accessible_from`` (or ``what``, each of its ordinals named ``item``): "all", a device
    ordinal, or an iterable of ordinals (not bytes, whose items are ints, nor a mapping, whose
    keys are; no enum member is an ordinal).

    Returns (all_devices, ordinals as C ints). A negative device or one named twice is C++'s
    to refuse (``check_resource_options``, ``mem_pool::set_access``).
    """
    expected = f"{what} must be 'all', a device id or a list of ids"
    if isinstance(value, str):
        if value != "all":
            raise ValueError(f"{expected}, got {value!r}")
        return True, []
    not_a_number(expected, value)
    one = integer(value)
    if one is not None:
        return False, [c_int(item, one)]
    return False, [c_int(item, d) for d in items(value, expected)]


def items(value, expected: str) -> list:
    """The items of an argument that lists things, as a list; TypeError ``"{expected}, got
    <type>"`` for one that is not iterable, or that is bytes (whose items are ints) or a mapping
    (whose items are its keys, its values dropped)."""
    if isinstance(value, (bytes, bytearray, memoryview, Mapping)):
        raise TypeError(f"{expected}, got {type_name(value)}")
    try:
        return list(value)
    except TypeError:
        raise TypeError(f"{expected}, got {type_name(value)}") from None


def pool(value):
    """``pool`` given by name, handle or pool object: "default", "current", "new", an int handle,
    or another library's pool object (see _foreign_pools; the resources take a MemPool and a
    PoolSource member before asking here).

    Returns (name, None) for a pool named by its role, else (None, what to adopt: the int handle,
    or the pool object, which MemPool.from_handle reads again for its location and owner).
    """
    from asyncmr._foreign_pools import POOL_OBJECTS, recognize

    expected = f"pool must be 'default', 'current', 'new', an int handle, a MemPool, {POOL_OBJECTS}"
    if isinstance(value, str):
        if value not in POOL_NAMES:
            raise ValueError(f"{expected}, got {value!r}")
        return value, None
    if isinstance(value, enum.Enum):
        raise TypeError(f"{expected}, got {type_name(value)}")
    if recognize(value) is not None:  # TypeError for cuda.bindings streams and events
        return None, value
    if integer(value) is None:
        raise TypeError(f"{expected}, got {type_name(value)}")
    return None, handle(value)


def handle(value) -> int:
    """A ``cudaMemPool_t`` as a 64-bit int (a null one is C++'s to refuse: ``from_handle``),
    from an int (NumPy's integers too) or another library's pool object (see _foreign_pools).
    An enum member is a name, not a handle, even an int one (``PoolSource.new_pool`` is 2); a
    cuda.bindings stream or event is no pool, though it converts to int."""
    from asyncmr._foreign_pools import POOL_OBJECTS, recognize

    if isinstance(value, enum.Enum):
        raise TypeError(f"pool handle must be an int address, got {type_name(value)}")
    foreign = recognize(value)
    number = foreign.handle if foreign is not None else integer(value)
    if number is None:
        raise TypeError(f"pool handle must be an int address, a MemPool, {POOL_OBJECTS}, "
                        f"got {type_name(value)}")
    if not 0 <= number <= UINT64_MAX:
        raise ValueError(f"pool handle must be a non-zero 64-bit address, got {number}")
    return number


def location_kind(value, name: str = "") -> None:
    """TypeError when the :class:`Location` ``value`` has a kind that is not a str (a
    LocationKind member is not its name, and equals no Location built from one), the message
    led by ``name`` when given."""
    if not isinstance(value.kind, str):
        from asyncmr._core import LOCATION_KINDS  # it imports this module

        raise TypeError(f"{name + ': ' if name else ''}a location's kind must be a str (one of "
                        f"{LOCATION_KINDS}; build it with the Location class methods), got "
                        f"{type_name(value.kind)}")


def target(name: str, value, *, unset: bool = False):
    """A place to move managed memory to (AsyncManagedMR's ``prefetch``, the placement calls'
    ``to``): "device", "host", a device ordinal or a :class:`Location` of a device or the host.
    Returns "device", "host", the ordinal as a C int, or the Location. ``unset``: the message
    says None is accepted too (the caller takes it). TypeError for a value of another type
    (a bool, a float or an enum member is no ordinal), ValueError for a str that names no
    target; both name ``name`` and the value. A Location of another kind, or a negative
    ordinal, is C++'s to refuse (``detail::check_target_kind``)."""
    from asyncmr._location import Location  # it imports this module

    expected = (f'{name} must be {"None, " if unset else ""}"device", a device ordinal, "host" '
                "or an asyncmr.Location")
    if isinstance(value, Location):
        location_kind(value, name)
        return value
    if isinstance(value, str):  # compared only as a str: a NumPy array's == is elementwise
        if value in ("device", "host"):
            return value
        raise ValueError(f"{expected}, got {value!r}")
    not_a_number(expected, value)
    one = integer(value)
    if one is None:
        raise TypeError(f"{expected}, got {reprlib.repr(value)} ({type_name(value)})")
    return c_int(name, one)
