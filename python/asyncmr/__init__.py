# SPDX-License-Identifier: Apache-2.0
"""asyncmr: stream-ordered managed, pinned and device memory resources for RMM, on the CUDA
driver's memory pools, with the pool control surface (attributes, peaks, trim, access,
routing) that is safe to use while another stream is being captured into a CUDA graph.
"""

# The extension links librmm.so; importing rmm loads it (and rapids-logger) first, the way
# RMM's own extensions rely on.
import rmm  # noqa: F401

from asyncmr._exceptions import (
    AsyncMRError,
    CUDAError,
    NoDeviceError,
    PoolClosedError,
    UnsupportedError,
)
from asyncmr._location import Location
from asyncmr._core import (
    ADVICE,
    AccessMode,
    AllocationType,
    AsyncDeviceMR,
    AsyncManagedMR,
    AsyncPinnedMR,
    ExportHandle,
    ImportedAllocation,
    LocationKind,
    MemPool,
    PoolPath,
    PoolSource,
    advise,
    can_discard,
    device_count,
    discard,
    discard_and_prefetch,
    driver_version,
    export_pointer,
    failed_deallocations,
    failed_prefetches,
    pool_support,
    prefetch,
    runtime_version,
)
# C++'s enums are asyncmr's: messages and reprs name them as users import them.
for _enum in (AccessMode, AllocationType, ExportHandle, LocationKind, PoolPath, PoolSource):
    _enum.__module__ = __name__
del _enum

# The attribute table is built when _attributes is imported (from _core's table), so no import
# order can leave it empty.
from asyncmr._attributes import TABLE as attribute_table
from asyncmr._attributes import AttributeInfo, PeakTracker, PoolAttributes

# Pinned NumPy arrays. The CuPy, Dask and cuda.core doors are submodules that import their
# library: `import asyncmr.cupy`, `import asyncmr.dask`, `import asyncmr.cuda_core`.
from asyncmr.pinned import (
    PinnedBlock,
    pinned_empty,
    pinned_empty_like,
    pinned_full,
    pinned_full_like,
    pinned_zeros,
    pinned_zeros_like,
)

__version__ = "0.3.0"

__all__ = [
    "AccessMode",
    "AllocationType",
    "AsyncDeviceMR",
    "AsyncManagedMR",
    "AsyncMRError",
    "AsyncPinnedMR",
    "AttributeInfo",
    "CUDAError",
    "ExportHandle",
    "ImportedAllocation",
    "Location",
    "LocationKind",
    "MemPool",
    "NoDeviceError",
    "PeakTracker",
    "PinnedBlock",
    "PoolAttributes",
    "PoolClosedError",
    "PoolPath",
    "PoolSource",
    "UnsupportedError",
    "attribute_table",
    "device_count",
    "driver_version",
    "export_pointer",
    "failed_deallocations",
    "failed_prefetches",
    "ADVICE",
    "advise",
    "can_discard",
    "discard",
    "discard_and_prefetch",
    "prefetch",
    "pinned_empty",
    "pinned_empty_like",
    "pinned_full",
    "pinned_full_like",
    "pinned_zeros",
    "pinned_zeros_like",
    "pool_support",
    "runtime_version",
]
