# SPDX-License-Identifier: Apache-2.0
"""Argument checks made before any CUDA call, so bad input never reaches the driver."""

from __future__ import annotations

UINT64_MAX = 2**64 - 1
#: The Python spellings of ``pool=`` that name a pool by its role.
POOL_NAMES = ("default", "current", "new")


def ascii_digits(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits: str.isdigit alone also takes superscripts
    (which int() refuses), and it and str.isdecimal take other scripts' digits (which int()
    reads)."""
    return text.isascii() and text.isdigit()


def ordinal(what: str, value) -> int:
    """A device ordinal or NUMA node: an int in [0, 2**31)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if not 0 <= value < 2**31:
        raise ValueError(f"{what} must be in [0, 2**31), got {value}")
    return value


def size(name: str, value, *, optional: bool = True) -> int | None:
    """A byte count in [0, 2**64)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int number of bytes, got {type(value).__name__}")
    if not 0 <= value <= UINT64_MAX:
        raise ValueError(f"{name} must be in [0, 2**64), got {value}")
    return value


def device(value, what: str = "device") -> int | None:
    """A device ordinal (or NUMA node: ``what`` names it), or None for the default."""
    return None if value is None else ordinal(what, value)


def devices(value) -> tuple[bool, list[int]]:
    """``accessible_from``: "all", a device ordinal, or an iterable of ordinals.

    Returns (all_devices, ordinals).
    """
    if isinstance(value, str):
        if value != "all":
            raise ValueError(f"accessible_from must be 'all', a device id or a list of ids, got {value!r}")
        return True, []
    if isinstance(value, int) and not isinstance(value, bool):
        return False, [ordinal("accessible_from device", value)]
    try:
        items = list(value)
    except TypeError:
        raise TypeError(
            "accessible_from must be 'all', a device id or a list of ids, "
            f"got {type(value).__name__}"
        ) from None
    return False, [ordinal("accessible_from device", d) for d in items]


def pool(value):
    """``pool`` given by name or handle: "default", "current", "new" or an int handle (the
    resources take a MemPool and a PoolSource member before asking here).

    Returns (name, None) for a pool named by its role, else (None, handle).
    """
    if isinstance(value, str):
        if value not in POOL_NAMES:
            raise ValueError(
                f"pool must be 'default', 'current', 'new', an int handle or a MemPool, got {value!r}"
            )
        return value, None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            "pool must be 'default', 'current', 'new', an int handle or a MemPool, "
            f"got {type(value).__name__}"
        )
    return None, handle(value)


def handle(value) -> int:
    """A ``cudaMemPool_t`` as an int: non-zero, 64-bit."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"pool handle must be an int address, got {type(value).__name__}")
    if not 0 < value <= UINT64_MAX:
        raise ValueError(f"pool handle must be a non-zero 64-bit address, got {value}")
    return value
