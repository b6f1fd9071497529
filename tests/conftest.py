# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: GPU detection (tests skip with the reason asyncmr gives) and isolation of
the process-wide pool state (default pools' thresholds, current-pool routing, RMM's current
resource) that resource constructors are documented to change."""

import pytest

from asyncmr import Location, MemPool

from gpu_helpers import gpu_count


def require_gpus(n: int) -> None:
    count, why = gpu_count()
    if count == 0:
        pytest.skip(f"no CUDA device: {why}")
    if count < n:
        pytest.skip(f"needs {n} CUDA devices, this machine has {count}")


@pytest.fixture
def gpu():
    """Skips unless a CUDA device is present; restores shared pool state afterwards."""
    require_gpus(1)
    import rmm

    saved = _snapshot()
    previous_mr = rmm.mr.get_current_device_resource()
    yield
    rmm.mr.set_current_device_resource(previous_mr)
    _restore(saved)


@pytest.fixture
def two_gpus(gpu):
    require_gpus(2)


@pytest.fixture
def no_gpu():
    count, _ = gpu_count()
    if count:
        pytest.skip("a CUDA device is present; this test checks the no-GPU behaviour")


# The shared pools the tests (and the resources under test) may touch.
def _shared_pools():
    count, _ = gpu_count()
    keys = [(Location.host(), "pinned")]
    for d in range(count):
        keys += [(Location.device(d), "device"), (Location.device(d), "managed")]
    return keys


def _snapshot():
    saved = []
    for loc, kind in _shared_pools():
        pool = MemPool.default(loc, kind)
        saved.append((loc, kind, pool.attributes.release_threshold,
                      MemPool.current(loc, kind).handle))
    return saved


def _restore(saved):
    for loc, kind, threshold, current in saved:
        default = MemPool.default(loc, kind)
        if MemPool.current(loc, kind).handle != current:
            MemPool.from_handle(current, location=loc, allocation_type=kind).make_current()
        default.attributes.release_threshold = threshold
