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
from asyncmr._attributes import AttributeInfo, PeakTracker, PoolAttributes
from asyncmr._core import (
    AsyncDeviceMR,
    AsyncManagedMR,
    AsyncPinnedMR,
    MemPool,
    device_count,
    driver_version,
    runtime_version,
)
from asyncmr._attributes import TABLE as attribute_table

# Pinned NumPy arrays (issue 10). The CuPy and Dask doors are submodules that import their
# library: `import asyncmr.cupy`, `import asyncmr.dask`.
from asyncmr.pinned import (
    PinnedBlock,
    pinned_empty,
    pinned_empty_like,
    pinned_full,
    pinned_full_like,
    pinned_zeros,
    pinned_zeros_like,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncDeviceMR",
    "AsyncManagedMR",
    "AsyncMRError",
    "AsyncPinnedMR",
    "AttributeInfo",
    "CUDAError",
    "Location",
    "MemPool",
    "NoDeviceError",
    "PeakTracker",
    "PinnedBlock",
    "PoolAttributes",
    "PoolClosedError",
    "UnsupportedError",
    "attribute_table",
    "device_count",
    "driver_version",
    "pinned_empty",
    "pinned_empty_like",
    "pinned_full",
    "pinned_full_like",
    "pinned_zeros",
    "pinned_zeros_like",
    "runtime_version",
]
