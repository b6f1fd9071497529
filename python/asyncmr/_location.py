# SPDX-License-Identifier: Apache-2.0
"""Memory locations: where a pool's memory lives."""

from __future__ import annotations

import enum
from typing import NamedTuple, SupportsIndex

from asyncmr._validate import ordinal as _ordinal


class Location(NamedTuple):
    """A memory location: ``kind`` ("device", "host", "host_numa", "host_numa_current" or
    "none": the names of :class:`asyncmr.LocationKind`) and ``id`` (the device ordinal or NUMA
    node; ``None`` where it means nothing).

    Build one with the class methods: ``Location.device(0)``, ``Location.host()``,
    ``Location.host_numa(1)``, ``Location.host_numa_current()``, ``Location.none()``.
    """

    kind: str
    id: int | None = None

    @classmethod
    def device(cls, ordinal: SupportsIndex) -> Location:
        """Memory of device ``ordinal``."""
        return cls("device", _ordinal("device ordinal", ordinal))

    @classmethod
    def host(cls) -> Location:
        """Host memory, any NUMA node."""
        return cls("host", None)

    @classmethod
    def host_numa(cls, node: SupportsIndex) -> Location:
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
        # The class method's call where one makes this Location, else the fields: either
        # evaluates to an equal Location (Location("host", 3) is not Location.host()).
        if self.kind in ("device", "host_numa"):
            if type(self.id) is int and 0 <= self.id < 2**31:
                return f"Location.{self.kind}({self.id})"
        elif self.kind in ("host", "host_numa_current", "none") and self.id is None:
            return f"Location.{self.kind}()"
        ident = self.id
        # An enum member (refused where the Location is used) by its name, which evaluates.
        shown = (f"{type(ident).__name__}.{ident.name}" if isinstance(ident, enum.Enum)
                 else repr(ident))
        return f"Location(kind={self.kind!r}, id={shown})"
