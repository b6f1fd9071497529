# SPDX-License-Identifier: Apache-2.0
"""No GPU: every public entry point raises asyncmr.NoDeviceError, with a message that names
the missing driver or device, instead of a crash or a CUDA error name.

On a machine without a GPU (CPU CI) the entry points run in this process. On a GPU machine they
run in a child process that sees no device (CUDA_VISIBLE_DEVICES=""), so both cases are covered
wherever the suite runs.
"""

from __future__ import annotations

import json
import re

import pytest

import asyncmr

import reliability_helpers as h

# Every public way into CUDA, as source text so a child process can run the same list.
ENTRY_POINTS = [
    "asyncmr.device_count()",
    "asyncmr.AsyncManagedMR()",
    "asyncmr.AsyncManagedMR(0)",
    "asyncmr.AsyncManagedMR(pool='current')",
    "asyncmr.AsyncManagedMR(pool='new')",
    "asyncmr.AsyncManagedMR(location=asyncmr.Location.host())",
    "asyncmr.AsyncManagedMR(location=asyncmr.Location.none(), release_threshold=0)",
    "asyncmr.AsyncPinnedMR()",
    "asyncmr.AsyncPinnedMR(pool='current')",
    "asyncmr.AsyncPinnedMR(pool='new')",
    "asyncmr.AsyncPinnedMR(numa_node=0, accessible_from=[0])",
    "asyncmr.AsyncDeviceMR()",
    "asyncmr.AsyncDeviceMR(0)",
    "asyncmr.AsyncDeviceMR(pool='current')",
    "asyncmr.AsyncDeviceMR(pool='new', release_threshold=1 << 30)",
    "asyncmr.AsyncDeviceMR(pool=0x1000)",  # an int handle: refused before it is touched
    "asyncmr.MemPool.default(asyncmr.Location.device(0), 'device')",
    "asyncmr.MemPool.default(asyncmr.Location.device(0), 'managed')",
    "asyncmr.MemPool.default(asyncmr.Location.none(), 'managed')",
    "asyncmr.MemPool.default(asyncmr.Location.host(), 'pinned')",
    "asyncmr.MemPool.default(asyncmr.Location.host(), 'managed')",
    "asyncmr.MemPool.default(asyncmr.Location.host_numa(0), 'pinned')",
    "asyncmr.MemPool.current(asyncmr.Location.device(0), 'device')",
    "asyncmr.MemPool.current(asyncmr.Location.host(), 'pinned')",
    "asyncmr.MemPool.create(asyncmr.Location.device(0), 'device')",
    # (max_size stays 0: a bounded managed pool is an argument error, refused before this)
    "asyncmr.MemPool.create(asyncmr.Location.device(0), 'managed')",
    "asyncmr.MemPool.create(asyncmr.Location.host(), 'pinned')",
    "asyncmr.MemPool.create(asyncmr.Location.host_numa(0), 'pinned')",
    "asyncmr.MemPool.from_handle(0x1000)",
    "asyncmr.MemPool.from_handle(0x1000, owned=True, location=asyncmr.Location.device(0), "
    "allocation_type='device')",
]
# What the message must say: which of driver or device is missing.
NAMES_THE_PROBLEM = re.compile(r"(?i)\b(driver|device)\b")

CHILD = r"""
import json, sys
import asyncmr
results = []
for expr in json.loads(sys.argv[1]):
    try:
        eval(expr, {"asyncmr": asyncmr})
        results.append([expr, None, ""])
    except BaseException as e:
        results.append([expr, type(e).__name__, str(e)])
# The version queries never raise, device or not.
results.append(["driver_version", type(asyncmr.driver_version()).__name__, ""])
results.append(["runtime_version", asyncmr.runtime_version() > 0, ""])
print(json.dumps(results))
"""


@pytest.mark.parametrize("expr", ENTRY_POINTS)
def test_entry_point_without_a_gpu(no_gpu, expr):
    with pytest.raises(asyncmr.NoDeviceError) as info:
        eval(expr, {"asyncmr": asyncmr})
    assert NAMES_THE_PROBLEM.search(str(info.value)), str(info.value)
    assert str(info.value).startswith("asyncmr: "), str(info.value)


def test_version_queries_without_a_gpu(no_gpu):
    assert isinstance(asyncmr.driver_version(), int)  # 0 when no driver is installed
    assert asyncmr.runtime_version() >= 12060


@pytest.mark.gpu
@pytest.mark.cuda_api_error
def test_no_device_errors_in_a_child_without_visible_devices(gpu):
    h.require_hidden_devices()
    code = "import sys; sys.argv[1:] = [" + repr(json.dumps(ENTRY_POINTS)) + "]\n" + CHILD
    proc = h.run_python(code, env={"CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    assert proc.returncode == 0, h.describe(proc)
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    wrong = []
    for expr, kind, message in results[:-2]:
        if kind != "NoDeviceError" or not NAMES_THE_PROBLEM.search(message) or (
                "CUDA_VISIBLE_DEVICES" not in message):
            wrong.append(f"{expr}: {kind}: {message}")
    assert not wrong, "entry points without a clear NoDeviceError:\n" + "\n".join(wrong)
    assert results[-2] == ["driver_version", "int", ""]
    assert results[-1] == ["runtime_version", True, ""]
    h.record("no-gpu", f"no GPU: {len(ENTRY_POINTS)} entry points raise NoDeviceError naming "
                       f"the device (child with CUDA_VISIBLE_DEVICES='')")
