# SPDX-License-Identifier: Apache-2.0
"""PyTorch and Numba allocating through RMM onto asyncmr's resources.

Both libraries take their allocator once, before their first CUDA allocation, and keep it for
the life of the process; each case therefore runs in a fresh interpreter. The child checks that
the memory came from the resource's pool (its ``used_mem_current`` grows by at least the
arrays' size and falls back once they are freed), that kernels computed the right values in
it, and prints one line starting with ``OK``.
"""

import importlib.util
import textwrap

import pytest

from gpu_helpers import describe, run_python, skip_or_fail

KINDS = ["managed", "pinned", "device"]

_PRELUDE = """
import ctypes, gc, sys
import numpy as np
import rmm, asyncmr

kind = sys.argv[1]
n = 1 << 20

def make():
    return {"managed": asyncmr.AsyncManagedMR, "pinned": asyncmr.AsyncPinnedMR,
            "device": asyncmr.AsyncDeviceMR}[kind]()

def host_int64(ptr, count):
    # Pool pinned memory is host memory: CUDA refuses explicit device-to-host copies from it,
    # so it is read in place. Managed memory is read in place too, after a synchronize.
    return np.frombuffer((ctypes.c_byte * (8 * count)).from_address(ptr), np.int64, count)
"""

_TORCH = _PRELUDE + """
import torch
from rmm.allocators.torch import rmm_torch_allocator

torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
mr = make()
rmm.mr.set_current_device_resource(mr)
before = mr.attributes.used_mem_current

x = torch.arange(n, dtype=torch.int64, device="cuda")
y = x * 3 + 1
torch.cuda.synchronize()
during = mr.attributes.used_mem_current
assert during >= before + 2 * 8 * n, (before, during)
values = host_int64(y.data_ptr(), n) if kind != "device" else y.cpu().numpy()
assert (values == np.arange(n, dtype=np.int64) * 3 + 1).all()

del x, y, values
gc.collect()
torch.cuda.synchronize()
after = mr.attributes.used_mem_current
assert after == before, (before, after)
print("OK torch", kind, before, during, after)
"""

_NUMBA = _PRELUDE + """
import cupy
from numba import cuda
from rmm.allocators.numba import RMMNumbaManager

cuda.set_memory_manager(RMMNumbaManager)
mr = make()
rmm.mr.set_current_device_resource(mr)
before = mr.attributes.used_mem_current

a = cuda.device_array(n, dtype=np.int64)
cuda.synchronize()
during = mr.attributes.used_mem_current
assert during >= before + 8 * n, (before, during)
# A kernel writes Numba's array through the CUDA array interface: CuPy's, because what is under
# test is Numba's allocation, and the numba-cuda on the GPU test host cannot compile kernels
# against its NumPy (numpy.row_stack is gone).
ptr = a.__cuda_array_interface__["data"][0]
mem = cupy.cuda.UnownedMemory(ptr, 8 * n, a, device_id=0)  # device 0 also for host memory
view = cupy.ndarray((n,), cupy.int64, cupy.cuda.MemoryPointer(mem, 0))
cupy.multiply(cupy.arange(n, dtype=cupy.int64), 3, out=view)
view += 1
cupy.cuda.runtime.deviceSynchronize()
values = host_int64(ptr, n) if kind != "device" else a.copy_to_host()
assert (values == np.arange(n, dtype=np.int64) * 3 + 1).all()

del a, view, mem, values
gc.collect()
cuda.current_context().deallocations.clear()  # Numba defers frees; flush them
cuda.synchronize()
after = mr.attributes.used_mem_current
assert after == before, (before, after)
print("OK numba", kind, before, during, after)
"""


def _run_child(script: str, kind: str) -> None:
    proc = run_python(textwrap.dedent(script), kind, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("OK"), describe(proc)


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        skip_or_fail(f"{module} is not installed")


@pytest.mark.parametrize("kind", KINDS)
def test_pytorch_allocates_through_rmm(gpu, kind):
    _require("torch")
    _run_child(_TORCH, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_numba_allocates_through_rmm(gpu, kind):
    _require("cupy")
    _require("numba")
    _require("numba.cuda")
    _run_child(_NUMBA, kind)
