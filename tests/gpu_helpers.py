# SPDX-License-Identifier: Apache-2.0
"""Small helpers the tests share: GPU detection, views of raw pointers for CuPy and NumPy."""

import contextlib
import ctypes
import functools
import os
import subprocess
import sys

import numpy as np

import asyncmr

HERE = os.path.dirname(os.path.abspath(__file__))


@functools.cache
def gpu_count() -> tuple[int, str]:
    """(number of visible devices, "") or (0, asyncmr's NoDeviceError message)."""
    try:
        return asyncmr.device_count(), ""
    except asyncmr.NoDeviceError as e:
        return 0, str(e)


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


def run_python(code: str, *args: str, env: dict | None = None, timeout: float = 240):
    """Runs ``code`` with ``args`` as ``sys.argv[1:]`` in a fresh interpreter: this one's
    executable, the test tree's helpers importable (tests/ and tests/reliability/), faulthandler
    on so a crash prints a stack. Returns the CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (HERE, os.path.join(HERE, "reliability"), full_env.get("PYTHONPATH", ""))
        if p)
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", code, *args],
                          capture_output=True, text=True, timeout=timeout, env=full_env)


def describe(proc) -> str:
    """A finished child's exit code and the tails of its output, for an assertion message."""
    return (f"exit code {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}"
            f"\n--- stderr ---\n{proc.stderr[-6000:]}")
