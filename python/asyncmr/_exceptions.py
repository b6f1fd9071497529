# SPDX-License-Identifier: Apache-2.0
"""Exceptions raised by asyncmr (besides ValueError, TypeError and MemoryError)."""


class AsyncMRError(RuntimeError):
    """Base of asyncmr's own errors."""


class NoDeviceError(AsyncMRError):
    """No usable CUDA: no driver, no visible device, or a driver older than this build needs."""


class UnsupportedError(AsyncMRError):
    """The driver, runtime or device does not support what was asked."""


class PoolClosedError(AsyncMRError):
    """A pool was used after it was closed."""


class CUDAError(AsyncMRError):
    """A CUDA call failed; the message names the call and the CUDA error."""
