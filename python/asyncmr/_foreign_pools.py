# SPDX-License-Identifier: Apache-2.0
"""Other libraries' pool objects, as asyncmr adopts them: cuda.bindings' pool handles and
cuda.core's pool-backed resources. They are told apart by type, never by converting to int:
cuda.bindings' streams, events and other handles convert to int too, and a handle that is no live
pool may crash the driver. Nothing here calls the driver."""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

from asyncmr._location import Location
from asyncmr._validate import type_name

#: The pool objects MemPool.from_handle and the resources' ``pool=`` take, for messages.
POOL_OBJECTS = ("a cuda.bindings CUmemoryPool or cudaMemPool_t, or a cuda.core "
                "DeviceMemoryResource, PinnedMemoryResource or ManagedMemoryResource")


class ForeignPool(NamedTuple):
    """A pool another library's object names: its handle; where it lives and what it holds,
    where the object says (else None: asyncmr asks the driver, which answers from 13.2 on); and
    the object that owns the pool (None for a bare handle), which asyncmr's view keeps alive and
    never destroys."""

    handle: int
    location: Location | None = None
    allocation_type: str | None = None
    owner: Any = None


def name_of(value: object) -> str:
    """The name of ``value``'s type as its library exports it (``cuda.core.DeviceMemoryResource``,
    not the module that defines it), else as :func:`asyncmr._validate.type_name` gives it."""
    kind = type(value)
    core = sys.modules.get("cuda.core")
    if core is not None and getattr(core, kind.__name__, None) is kind:
        return f"cuda.core.{kind.__name__}"
    return type_name(value)


def recognize(value: object) -> ForeignPool | None:
    """``value`` as a pool, or None when it is no object of cuda.bindings or cuda.core (the caller
    says what else it may be). TypeError for one of their objects that is no pool (a stream, an
    event, a resource without a pool); PoolClosedError for a closed cuda.core resource."""
    module = getattr(type(value), "__module__", None) or ""
    if module.startswith("cuda.bindings"):
        from cuda.bindings import driver, runtime  # loaded already: value is one of theirs

        if isinstance(value, (driver.CUmemoryPool, runtime.cudaMemPool_t)):
            return ForeignPool(int(value))
        raise TypeError(f"a {type_name(value)} is not a memory pool (of cuda.bindings' handles, "
                        "only CUmemoryPool and cudaMemPool_t are): its int value is no pool handle")
    core = sys.modules.get("cuda.core")  # never imported here: a cuda.core object means it is
    if core is not None and isinstance(value, core.MemoryResource):
        from asyncmr.cuda_core import _pool_of

        return _pool_of(value)
    return None
