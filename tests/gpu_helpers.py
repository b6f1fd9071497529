# SPDX-License-Identifier: Apache-2.0
"""What the whole test tree shares: GPU detection and the switch that turns GPU skips into
failures on a GPU host, the state of the process-wide pools (saved and restored around every
GPU test), views of raw pointers for CuPy and NumPy, and the child-process runner."""

import contextlib
import ctypes
import functools
import os
import subprocess
import sys

import numpy as np
import pytest

import asyncmr
from asyncmr import Location, MemPool

HERE = os.path.dirname(os.path.abspath(__file__))


@functools.cache
def gpu_count() -> tuple[int, str]:
    """(number of visible devices, "") or (0, asyncmr's NoDeviceError message)."""
    try:
        return asyncmr.device_count(), ""
    except asyncmr.NoDeviceError as e:
        return 0, str(e)


# ---- skips that must not hide a broken GPU host -------------------------------------------------

#: ci/gpu.sh sets this to the number of GPUs the host has. Then a test that needs at most that
#: many GPUs, or a library the GPU tests use, fails instead of skipping: a missing CuPy or a wrong
#: guard on the GPU host is a failure, not one more skip among the expected ones.
REQUIRED_GPUS = int(os.environ.get("ASYNCMR_REQUIRE_GPUS", "0") or 0)
#: Skips that are right even on a GPU host say so with this prefix (see conftest.py's hook).
NOT_APPLICABLE = "not applicable: "


def skip_or_fail(reason: str, gpus: int = 1) -> None:
    """Skips with ``reason``, or fails when this host was declared to have ``gpus`` GPUs."""
    if REQUIRED_GPUS >= gpus:
        pytest.fail(f"{reason} (ASYNCMR_REQUIRE_GPUS={REQUIRED_GPUS}: this host must run it)",
                    pytrace=False)
    pytest.skip(reason)


def not_applicable(reason: str) -> None:
    """Skips a GPU test that does not apply here (the switch above lets it skip)."""
    pytest.skip(NOT_APPLICABLE + reason)


#: ci/gpu.sh sets this under compute-sanitizer. memcheck holds freed stream-ordered blocks back
#: (to catch use after free), so pool counters do not return to their start there, and it shows
#: the GPU to children even with CUDA_VISIBLE_DEVICES="".
UNDER_SANITIZER = os.environ.get("ASYNCMR_UNDER_SANITIZER") == "1"


def require_hidden_devices() -> None:
    """For a test of a child with every device hidden (CUDA_VISIBLE_DEVICES=""): not applicable
    under compute-sanitizer, which shows the GPU to the child all the same."""
    if UNDER_SANITIZER:
        not_applicable("compute-sanitizer shows the GPU to the child even with "
                       "CUDA_VISIBLE_DEVICES=''; the no-GPU paths are checked without it")


def require_gpus(n: int) -> int:
    count, why = gpu_count()
    if count == 0:
        skip_or_fail(f"no CUDA device: {why}", n)
    if count < n:
        skip_or_fail(f"needs {n} CUDA devices, this machine has {count}", n)
    return count


def require_module(name: str, why: str = "the GPU tests use it"):
    """Imports ``name``; a GPU host that lacks it fails the test instead of skipping it."""
    try:
        return __import__(name, fromlist=["_"])
    except ImportError as e:
        skip_or_fail(f"{name} is not installed ({why}): {e}")


def create_context(device: int = 0):
    """A new context on ``device`` (``cuCtxCreate``), pushed current on this thread: the caller pops
    and destroys it. cuda-bindings 13 takes ``(params, flags, dev)``, 12 ``(flags, dev)``."""
    import cuda.bindings
    from cuda.bindings import driver as cu

    err, dev = cu.cuDeviceGet(device)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    major = int(cuda.bindings.__version__.split(".")[0])
    err, ctx = cu.cuCtxCreate(None, 0, dev) if major >= 13 else cu.cuCtxCreate(0, dev)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return ctx


# ---- the process-wide pools -----------------------------------------------------------------------

# The shared pools a resource constructor, a control call or a careless caller could change.
SHARED_POOLS = (
    ("device@device(0)", Location.device(0), "device"),
    ("managed@device(0)", Location.device(0), "managed"),
    ("pinned@host", Location.host(), "pinned"),
    ("managed@host", Location.host(), "managed"),
)


@functools.cache
def shared_pool_rows() -> tuple[tuple, dict]:
    """(rows of SHARED_POOLS this machine has, {name: why not} for the others), checked once."""
    usable, missing = [], {}
    for name, loc, atype in SHARED_POOLS:
        try:
            MemPool.default(loc, atype).attributes.release_threshold
        except asyncmr.AsyncMRError as e:
            missing[name] = str(e)
            continue
        usable.append((name, loc, atype))
    return tuple(usable), missing


def shared_pools() -> dict:
    """name -> (default MemPool, location, allocation type), for the ones this machine has."""
    return {name: (MemPool.default(loc, atype), loc, atype)
            for name, loc, atype in shared_pool_rows()[0]}


def settable(pool) -> dict:
    """The read-write attributes of ``pool``."""
    attrs = pool.attributes
    return {row.name: getattr(attrs, row.name)
            for row in asyncmr.attribute_table if row.access == "read_write"}


def restore_settable(pool, saved: dict) -> None:
    attrs = pool.attributes
    for name, value in saved.items():
        if getattr(attrs, name) != value:
            setattr(attrs, name, value)


def save_process_state():
    """Everything a GPU test may change process-wide: settable attributes and routing of every
    shared pool, RMM's current device resource, CuPy's device and pinned allocators."""
    import rmm

    pools = [(pool, loc, atype, settable(pool), MemPool.current(loc, atype))
             for pool, loc, atype in shared_pools().values()]
    cupy_allocators = None
    try:
        import cupy
    except ImportError:
        pass
    else:
        cupy_allocators = (cupy.cuda.get_allocator(), _cupy_pinned_allocator(cupy))
    return pools, rmm.mr.get_current_device_resource(), cupy_allocators


def restore_process_state(saved) -> None:
    import rmm

    pools, mr, cupy_allocators = saved
    if cupy_allocators is not None:
        import cupy

        cupy.cuda.runtime.deviceSynchronize()
        cupy.cuda.set_allocator(cupy_allocators[0])
        from asyncmr.cupy import restore_pinned_allocator

        restore_pinned_allocator(cupy_allocators[1] or cupy.get_default_pinned_memory_pool().malloc)
    rmm.mr.set_current_device_resource(mr)
    for pool, loc, atype, values, current in pools:
        if MemPool.current(loc, atype) != current:
            current.make_current()
        restore_settable(pool, values)


def _cupy_pinned_allocator(cupy):
    """asyncmr's pinned allocator if CuPy uses one now, else None (then CuPy's default pool is
    put back: CuPy has no getter, and the tests install no other)."""
    from asyncmr.cupy import current_pinned_allocator

    return current_pinned_allocator()


def device_view(ptr: int, n: int, dtype=np.int32, owner=None, device_id: int = 0):
    """A CuPy array over ``n`` elements at ``ptr`` (device, managed or device-accessible host)."""
    import cupy

    nbytes = n * np.dtype(dtype).itemsize
    mem = cupy.cuda.UnownedMemory(ptr, nbytes, owner, device_id=device_id)
    return cupy.ndarray((n,), dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))


def host_view(ptr: int, n: int, dtype=np.int32):
    """A NumPy array over ``n`` elements at host-accessible ``ptr`` (pinned or managed)."""
    nbytes = n * np.dtype(dtype).itemsize
    buf = (ctypes.c_byte * nbytes).from_address(ptr)
    return np.frombuffer(buf, dtype=dtype, count=n)


@contextlib.contextmanager
def rmm_cupy(mr):
    """Route CuPy allocations through RMM's current device resource ``mr`` for a block."""
    import cupy
    import rmm
    from rmm.allocators.cupy import rmm_cupy_allocator

    previous_mr = rmm.mr.get_current_device_resource()
    previous_alloc = cupy.cuda.get_allocator()
    rmm.mr.set_current_device_resource(mr)
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    try:
        yield
    finally:
        cupy.cuda.get_current_stream().synchronize()
        cupy.cuda.set_allocator(previous_alloc)
        rmm.mr.set_current_device_resource(previous_mr)


def sync():
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


@contextlib.contextmanager
def captured_elsewhere(cupy, mode: str = "global", non_blocking: bool = True):
    """For the length of the block, another thread captures on a new CuPy stream (``mode``:
    "global" or "thread_local"); yields a dict that gets ``capture`` once the block ends:
    "valid", or "broken: ..." when ending the capture failed (something invalidated it)."""
    import threading

    modes = {"global": cupy.cuda.runtime.streamCaptureModeGlobal,
             "thread_local": cupy.cuda.runtime.streamCaptureModeThreadLocal}
    began, done, outcome = threading.Event(), threading.Event(), {}

    def capture():
        cs = cupy.cuda.Stream(non_blocking=non_blocking)
        cs.begin_capture(modes[mode])
        began.set()
        done.wait()
        try:
            cs.end_capture()
            outcome["capture"] = "valid"
        except Exception as e:  # noqa: BLE001 - what the caller asserts on
            outcome["capture"] = f"broken: {type(e).__name__}: {e}"

    t = threading.Thread(target=capture, daemon=True)
    t.start()
    began.wait()
    try:
        yield outcome
    finally:
        done.set()
        t.join(timeout=60)


def run_python(code: str, *args: str, env: dict | None = None, timeout: float = 240,
               pass_fds: tuple = ()):
    """Runs ``code`` with ``args`` as ``sys.argv[1:]`` in a fresh interpreter: this one's
    executable, the test tree's helpers importable (tests/ and tests/reliability/), faulthandler
    on so a crash prints a stack; ``pass_fds`` are inherited by the child. Returns the
    CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (HERE, os.path.join(HERE, "reliability"), full_env.get("PYTHONPATH", ""))
        if p)
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", code, *args],
                          capture_output=True, text=True, timeout=timeout, env=full_env,
                          pass_fds=pass_fds)


def describe(proc) -> str:
    """A finished child's exit code and the tails of its output, for an assertion message."""
    return (f"exit code {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}"
            f"\n--- stderr ---\n{proc.stderr[-6000:]}")
