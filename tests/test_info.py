# SPDX-License-Identifier: Apache-2.0
"""``python -m asyncmr info``: the no-GPU path, the readable report, and the JSON checked
against direct CUDA driver queries (cuda.bindings.driver), which the command does not use
(it asks the runtime and asyncmr)."""

import gc
import json

import pytest

from gpu_helpers import describe, run_python

RUN_INFO = "import sys; from asyncmr.__main__ import main; sys.exit(main(['info', *sys.argv[1:]]))"


def _no_device_checks(proc, args):
    assert proc.returncode == 3, describe(proc)  # no usable GPU: _cli.EXIT_NO_GPU
    assert "asyncmr info: no usable CUDA device" in proc.stderr, describe(proc)
    assert "Traceback" not in proc.stderr, describe(proc)
    if "--json" in args:
        # A script gets a JSON document on stdout either way, saying why there is no more.
        doc = json.loads(proc.stdout)
        assert doc["usable"] is False and doc["devices"] == [] and doc["error"], doc
        # The same keys as a usable machine's document, so one reader reads both.
        assert doc["device_count"] == 0, doc
        assert isinstance(doc["runtime_version"], str) and "." in doc["runtime_version"], doc
        assert doc["driver_version"] is None or "." in doc["driver_version"], doc
        assert "driver" not in doc and "runtime" not in doc, doc
    else:
        assert proc.stdout == "", describe(proc)


@pytest.mark.parametrize("args", [[], ["--json"]])
def test_without_gpu_says_so_and_fails(no_gpu, args):
    _no_device_checks(run_python(RUN_INFO, *args, timeout=120), args)


@pytest.mark.parametrize("args", [[], ["--json"]])
def test_with_no_visible_device_says_so_and_fails(args):
    # Runs on GPU hosts too: CUDA_VISIBLE_DEVICES="" hides every device from the child.
    _no_device_checks(run_python(RUN_INFO, *args, env={"CUDA_VISIBLE_DEVICES": ""},
                                 timeout=120), args)


def test_report_renders_every_section():
    from asyncmr._info import render

    info = {
        "asyncmr": "0.1.0", "driver_version": "13.0", "runtime_version": "13.0",
        "cuda_bindings": "13.5.0", "device_count": 1, "note": "probe note",
        "devices": [{"ordinal": 0, "name": "GPU X", "compute_capability": "9.0",
                     "concurrent_managed_access": True, "pageable_memory_access": False,
                     "numa_id": -1, "host_numa_id": 0, "memory_pools_supported": True,
                     "host_memory_pools_supported": None,
                     "host_numa_memory_pools_supported": True,
                     "memory_pool_supported_handle_types": 9}],
        "support": [
            {"kind": "device", "location": "device(0)", "pool": p, "supported": True,
             "reason": None} for p in ("default", "current", "new")] + [
            {"kind": "pinned", "location": "device(0)", "pool": p, "supported": False,
             "reason": "ValueError: pinned pools live on the host"}
            for p in ("default", "current", "new")],
        "pools": [{"kind": "device", "location": "device(0)", "pool": p, "handle": 0x1234,
                   "is_default": True, "release_threshold": 2**64 - 1,
                   "reserved_mem_current": 1 << 20, "reserved_mem_high": 2 << 20,
                   "used_mem_current": 0, "used_mem_high": 4096}
                  for p in ("default", "current")],
    }
    text = render(info)
    assert "GPU X" in text and "9.0" in text
    assert "no [1]" in text and "[1] ValueError: pinned pools live on the host" in text
    assert text.count("[1] ValueError") == 1  # each reason once, however often it applies
    assert "current (= default)" in text and "1,048,576" in text and "probe note" in text


# ---- GPU -----------------------------------------------------------------------------------

def _driver():
    from cuda.bindings import driver

    err, = driver.cuInit(0)
    assert int(err) == 0, err
    return driver


def _ok(result):
    err, *values = result
    assert int(err) == 0, err
    return values[0] if values else None


# Device attributes newer than the cuda-bindings at hand (12.9 has no HOST_MEMORY_POOLS_SUPPORTED),
# by their CUDA 13 number.
_NUMBERS = {"CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED": 144}


def _device_attr(driver, dev, name):
    attr = getattr(driver.CUdevice_attribute, name, None)
    if attr is None:  # ask libcuda itself, by number
        import ctypes

        value = ctypes.c_int(-1)
        rc = ctypes.CDLL("libcuda.so.1").cuDeviceGetAttribute(
            ctypes.byref(value), ctypes.c_int(_NUMBERS[name]), ctypes.c_int(int(dev)))
        assert rc == 0, f"cuDeviceGetAttribute({name}) returned {rc}"
        return value.value
    return int(_ok(driver.cuDeviceGetAttribute(attr, dev)))


def test_json_matches_the_driver(gpu):
    proc = run_python(RUN_INFO, "--json", timeout=240)
    assert proc.returncode == 0, describe(proc)
    info = json.loads(proc.stdout)
    assert info["usable"] is True
    driver = _driver()
    version = _ok(driver.cuDriverGetVersion())
    assert info["driver_version"] == f"{version // 1000}.{version % 1000 // 10}"
    assert info["device_count"] == _ok(driver.cuDeviceGetCount()) == len(info["devices"])
    flags = {
        "concurrent_managed_access": "CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS",
        "pageable_memory_access": "CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS",
        "memory_pools_supported": "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED",
        "host_memory_pools_supported": "CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED",
        "host_numa_memory_pools_supported":
            "CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED",
    }
    numbers = {"host_numa_id": "CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID",
               "numa_id": "CU_DEVICE_ATTRIBUTE_NUMA_ID"}
    for d in info["devices"]:
        dev = _ok(driver.cuDeviceGet(d["ordinal"]))
        name = _ok(driver.cuDeviceGetName(256, dev)).split(b"\0", 1)[0].decode()
        assert d["name"] == name
        major = _device_attr(driver, dev, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR")
        minor = _device_attr(driver, dev, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")
        assert d["compute_capability"] == f"{major}.{minor}"
        for key, attr in flags.items():
            assert d[key] == bool(_device_attr(driver, dev, attr)), key
        for key, attr in numbers.items():
            value = _device_attr(driver, dev, attr)
            assert d[key] == (value if value < 2**31 else value - 2**32), key
    support = {(e["kind"], e["location"], e["pool"]): e for e in info["support"]}
    for d in info["devices"]:
        for choice in ("default", "current", "new"):
            assert support[("device", f"device({d['ordinal']})", choice)]["supported"]
    for entry in info["support"]:
        assert entry["supported"] == (entry["reason"] is None), entry
        assert entry["supported"] or entry["reason"], entry
    listed = {(p["kind"], p["location"], p["pool"]) for p in info["pools"]}
    for (kind, loc, choice), entry in support.items():
        if choice != "new":
            assert ((kind, loc, choice) in listed) == entry["supported"], entry


def test_pool_state_matches_the_driver(gpu):
    import cupy

    from asyncmr._info import STATE, collect

    gc.collect()
    cupy.cuda.runtime.deviceSynchronize()  # no stream-ordered free still on its way
    info = collect()
    driver = _driver()
    attrs = {key: getattr(driver.CUmemPool_attribute, f"CU_MEMPOOL_ATTR_{key.upper()}")
             for key in STATE}
    assert info["pools"]
    for pool in info["pools"]:
        handle = driver.CUmemoryPool(pool["handle"])
        for key, attr in attrs.items():
            value = int(_ok(driver.cuMemPoolGetAttribute(handle, attr)))
            assert pool[key] == value, (pool["kind"], pool["location"], pool["pool"], key)
    # The text report renders the same data.
    from asyncmr._info import render

    assert "Default and current pools" in render(info)
