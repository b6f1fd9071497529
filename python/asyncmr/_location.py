# SPDX-License-Identifier: Apache-2.0
"""Memory locations: where a pool's memory lives."""

from __future__ import annotations

from typing import NamedTuple

#: Location kinds, in the order of the C++ enum ``asyncmr::location_kind``.
KINDS = ("none", "device", "host", "host_numa", "host_numa_current")
#: Allocation types, in the order of the C++ enum ``asyncmr::allocation_type``.
ALLOCATION_TYPES = ("device", "pinned", "managed")


def _ordinal(what: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if not 0 <= value < 2**31:
        raise ValueError(f"{what} must be in [0, 2**31), got {value}")
    return value


class Location(NamedTuple):
    """A memory location: ``kind`` ("device", "host", "host_numa", "host_numa_current" or
    "none") and ``id`` (the device ordinal or NUMA node; ``None`` where it means nothing).

    Build one with the class methods: ``Location.device(0)``, ``Location.host()``,
    ``Location.host_numa(1)``, ``Location.host_numa_current()``, ``Location.none()``.
    """

    kind: str
    id: int | None = None

    @classmethod
    def device(cls, ordinal: int) -> Location:
        """Memory of device ``ordinal``."""
        return cls("device", _ordinal("device ordinal", ordinal))

    @classmethod
    def host(cls) -> Location:
        """Host memory, any NUMA node."""
        return cls("host", None)

    @classmethod
    def host_numa(cls, node: int) -> Location:
        """Host memory on NUMA node ``node``."""
        return cls("host_numa", _ordinal("NUMA node", node))

    @classmethod
    def host_numa_current(cls) -> Location:
        """Host memory on the NUMA node closest to the calling thread."""
        return cls("host_numa_current", None)

    @classmethod
    def none(cls) -> Location:
        """No preferred location (managed pools only)."""
        return cls("none", None)

    @property
    def is_host(self) -> bool:
        return self.kind in ("host", "host_numa", "host_numa_current")

    def __repr__(self) -> str:
        if self.kind in ("device", "host_numa"):
            return f"Location.{self.kind}({self.id})"
        return f"Location.{self.kind}()"


def check_location(value) -> Location:
    """Return ``value`` as a validated Location, or raise TypeError / ValueError."""
    if not isinstance(value, Location):
        raise TypeError(
            "location must be an asyncmr.Location (e.g. Location.device(0), Location.host()), "
            f"got {type(value).__name__}"
        )
    if value.kind not in KINDS:
        raise ValueError(f"unknown location kind {value.kind!r}; expected one of {KINDS}")
    if value.kind in ("device", "host_numa"):
        _ordinal(f"{value.kind} id", value.id)
    return value


def check_allocation_type(value) -> int:
    """Return the code of allocation type ``value`` ("device", "pinned" or "managed")."""
    if not isinstance(value, str):
        raise TypeError(f"allocation_type must be a str, got {type(value).__name__}")
    try:
        return ALLOCATION_TYPES.index(value)
    except ValueError:
        raise ValueError(
            f"unknown allocation_type {value!r}; expected one of {ALLOCATION_TYPES}"
        ) from None
