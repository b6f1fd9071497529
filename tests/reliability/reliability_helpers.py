# SPDX-License-Identifier: Apache-2.0
"""What the reliability tests share: the fill/check kernels, the state of the process-wide
pools (to prove a call changed nothing), the "CUDA context still works" probe, child-process
runs, and the figures printed in the terminal summary.

Importable without a GPU and without CuPy (CuPy is imported where it is used), and from the
child processes some tests start (no package-relative imports).
"""

from __future__ import annotations

import functools
import os
import sys
import threading

import numpy as np

import asyncmr
from asyncmr import MemPool
# What the whole test tree shares (tests/ is on sys.path through tests/conftest.py): the GPU
# probe, the skip switch, the child-process runner and the state of the shared pools, used here
# as h.gpu_count, h.require_module, h.run_python, h.shared_pools, ...
from gpu_helpers import (  # noqa: F401
    describe,
    gpu_count,
    UNDER_SANITIZER,
    not_applicable,
    require_hidden_devices,
    skip_or_fail,
    require_module,
    restore_process_state,
    restore_settable,
    run_python,
    save_process_state,
    settable,
    shared_pool_rows,
    shared_pools,
)

KiB = 1 << 10
MiB = 1 << 20
UINT64_MAX = 2**64 - 1

# ---- devices ------------------------------------------------------------------------------


def sync() -> None:
    """Waits for all work on the device. A no-op only without a GPU; with one, CuPy is needed
    (a GPU host without it fails the test instead of skipping the wait)."""
    if gpu_count()[0] == 0:
        return
    cupy = require_module("cupy", "reliability_helpers.sync waits for the device through it")
    cupy.cuda.runtime.deviceSynchronize()


# ---- kernels ------------------------------------------------------------------------------

# Word i of a block holds seed ^ low32(i * 2654435761): a pattern that differs per block (the
# seed) and per offset, so a block handed out twice, a free that came too early or a copy to the
# wrong place shows up as mismatching words.
KERNELS = r"""
extern "C" {
__global__ void asyncmr_fill(unsigned int* p, unsigned long long n, unsigned int seed)
{
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride) {
        p[i] = seed ^ (unsigned int)(i * 2654435761ull);
    }
}

__global__ void asyncmr_check(const unsigned int* p, unsigned long long n, unsigned int seed,
                              unsigned long long* bad)
{
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long wrong = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride) {
        if (p[i] != (seed ^ (unsigned int)(i * 2654435761ull))) { ++wrong; }
    }
    if (wrong != 0) { atomicAdd(bad, wrong); }
}

__global__ void asyncmr_bump(unsigned long long* counter)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) { atomicAdd(counter, 1ull); }
}
}
"""
_BLOCK = 256
_MAX_GRID = 1024


@functools.cache
def _functions():
    import cupy

    module = cupy.RawModule(code=KERNELS)
    return tuple(module.get_function(n) for n in ("asyncmr_fill", "asyncmr_check", "asyncmr_bump"))


def warm_up_kernels() -> None:
    """Compiles and loads the kernels now: module loading is not allowed inside a capture, and
    threads should not race to compile."""
    import cupy

    fill_k, check_k, bump_k = _functions()
    scratch = cupy.zeros(64, dtype=cupy.uint32)
    counter = cupy.zeros(1, dtype=cupy.uint64)
    stream = cupy.cuda.Stream.null
    fill(scratch.data.ptr, scratch.nbytes, 1, stream)
    check(scratch.data.ptr, scratch.nbytes, 1, counter, stream)
    bump(counter, stream)
    assert int(counter.get()[0]) == 1


def _grid(words: int) -> tuple[int]:
    return (min(max(1, (words + _BLOCK - 1) // _BLOCK), _MAX_GRID),)


def fill(ptr: int, nbytes: int, seed: int, stream) -> None:
    """Enqueues, on CuPy stream ``stream``, the pattern of ``seed`` over the ``nbytes // 4``
    words at ``ptr``."""
    words = nbytes // 4
    with stream:
        _functions()[0](_grid(words), (_BLOCK,),
                        (np.uint64(ptr), np.uint64(words), np.uint32(seed)))


def check(ptr: int, nbytes: int, seed: int, bad, stream) -> None:
    """Enqueues a comparison with the pattern of ``seed``; mismatching words are added to
    ``bad`` (a CuPy uint64 array)."""
    words = nbytes // 4
    with stream:
        _functions()[1](_grid(words), (_BLOCK,),
                        (np.uint64(ptr), np.uint64(words), np.uint32(seed), bad))


def bump(counter, stream) -> None:
    """Enqueues ``counter[0] += 1`` (proves a captured graph really ran)."""
    with stream:
        _functions()[2]((1,), (1,), (counter,))


def expected_words(words: int, seed: int) -> np.ndarray:
    """The pattern of ``seed``, computed on the host."""
    i = np.arange(words, dtype=np.uint64)
    low = (i * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)
    return low.astype(np.uint32) ^ np.uint32(seed)


def host_words(ptr: int, words: int) -> np.ndarray:
    """A copy of ``words`` 32-bit words at host-accessible ``ptr`` (pinned or managed)."""
    import ctypes

    return np.ctypeslib.as_array((ctypes.c_uint32 * words).from_address(ptr)).copy()


def device_view(ptr: int, words: int, owner=None):
    """A CuPy uint32 array over ``words`` words at ``ptr`` (on device 0)."""
    import cupy

    mem = cupy.cuda.UnownedMemory(ptr, words * 4, owner, device_id=0)
    return cupy.ndarray((words,), dtype=cupy.uint32, memptr=cupy.cuda.MemoryPointer(mem, 0))


# ---- resources ----------------------------------------------------------------------------

KINDS = ("device", "managed", "pinned")
POOL_CHOICES = ("default", "current", "new")
HOST_ACCESSIBLE = {"device": False, "managed": True, "pinned": True}
#: ci/gpu.sh runs the stress, capture and lifetime suites a second time with every resource
#: they make behind a front cache of this many bytes (0: none).
CACHE = int(os.environ.get("ASYNCMR_TEST_CACHE", "0") or 0)


def make_resource(kind: str, pool="default", **kwargs):
    cls = {"device": asyncmr.AsyncDeviceMR, "managed": asyncmr.AsyncManagedMR,
           "pinned": asyncmr.AsyncPinnedMR}[kind]
    if CACHE:
        kwargs.setdefault("cache", CACHE)
    return cls(pool=pool, **kwargs)


# ---- state of the process-wide pools ---------------------------------------------------

def is_counter(name: str) -> bool:
    """Usage counters and watermarks move with any allocation, legitimately."""
    return name.endswith("_current") or name.endswith("_high")


def pool_state(pool, loc, atype) -> dict:
    """Everything about a shared pool that a failed call must leave as it was."""
    state = {k: v for k, v in pool.attributes.as_dict().items() if not is_counter(k)}
    state["access of device 0"] = pool.access(0)
    state["is the current pool"] = MemPool.current(loc, atype) == pool
    return state


def shared_state(pools: dict) -> dict:
    return {name: pool_state(*entry) for name, entry in pools.items()}


class fresh_thresholds:
    """Sets the shared pools' release thresholds to 0, the state of a fresh process (where the
    resources' threshold policy fires), for a ``with`` block, then restores them."""

    def __init__(self, pools: dict):
        self._pools = pools
        self._saved = {}

    def __enter__(self):
        for name, (pool, _, _) in self._pools.items():
            self._saved[name] = pool.attributes.release_threshold
            pool.attributes.release_threshold = 0
        return self

    def __exit__(self, *exc):
        for name, value in self._saved.items():
            self._pools[name][0].attributes.release_threshold = value
        return False


def assert_context_works(mr) -> None:
    """The CUDA context of this process still works: an allocation from ``mr`` is written and
    verified by a kernel, and a CuPy expression computes the right value."""
    import cupy
    import rmm

    nbytes = 64 * KiB
    buf = rmm.DeviceBuffer(size=nbytes, mr=mr)
    bad = cupy.zeros(1, dtype=cupy.uint64)
    null = cupy.cuda.Stream.null
    fill(buf.ptr, nbytes, 0xC0FFEE, null)
    check(buf.ptr, nbytes, 0xC0FFEE, bad, null)
    x = cupy.arange(4096, dtype=cupy.int64)
    total = int((x * 3).sum())
    mismatches = int(bad.get()[0])
    del buf
    cupy.cuda.runtime.deviceSynchronize()
    assert mismatches == 0, f"{mismatches} words wrong in a fresh allocation"
    assert total == 3 * 4095 * 4096 // 2


# ---- lifetimes ---------------------------------------------------------------------------------


def holders(obj, depth: int = 6, limit: int = 60) -> str:
    """What still refers to ``obj`` (``depth`` levels of gc referrers), for an assertion
    message when something outlives what should have kept it alive."""
    import gc
    import types

    lines, seen = [], {id(obj)}
    frame = sys._getframe()

    def walk(o, level):
        if level > depth:
            return
        for r in gc.get_referrers(o):
            if len(lines) >= limit:
                return
            if id(r) in seen or r is frame or isinstance(r, types.FrameType) and r.f_back is frame:
                continue
            seen.add(id(r))
            lines.append("  " * level + f"{type(r).__name__}: {repr(r)[:160]}")
            walk(r, level + 1)

    walk(obj, 1)
    return "\n".join(lines) or "(no gc-tracked referrer)"


# ---- figures -------------------------------------------------------------------------------

_figures: dict[str, str] = {}
_counts: dict[str, int] = {}
_lock = threading.Lock()


def record(key: str, line: str) -> None:
    """A figures line for the terminal summary (one per key; the last one wins)."""
    with _lock:
        _figures[key] = line


def count(key: str, n: int = 1) -> int:
    with _lock:
        _counts[key] = _counts.get(key, 0) + n
        return _counts[key]


def figures() -> list[str]:
    for name, why in shared_pool_rows()[1].items() if gpu_count()[0] else ():
        record(f"shared pool {name}", f"shared pool {name} not watched: {why}")
    with _lock:
        lines = [_figures[k] for k in sorted(_figures)]
        lines += [f"{k}: {v}" for k, v in sorted(_counts.items())]
    return lines
