# SPDX-License-Identifier: Apache-2.0
"""Pools shared between processes: a pool created with export handle types is exported as a
POSIX file descriptor, imported by another process, and allocations go across with
export_pointer / import_pointer. Kernels write on one side and the other side checks; a process
that dies holding imports corrupts nothing; host (pinned) pools are tried too."""

import os

import numpy as np
import pytest

import asyncmr
from asyncmr import AsyncDeviceMR, AsyncPinnedMR, Location, MemPool

from gpu_helpers import describe, device_view, host_view, require_module, run_python, sync

MiB = 1 << 20
WORDS = MiB // 4

# The importing process: maps the exporter's allocation, checks the exporter's pattern with a
# kernel, adds `bump` to every word, then releases the import (or dies holding it).
CHILD = r"""
import os, sys
import cupy, numpy as np
import asyncmr
from asyncmr import Location, MemPool
from gpu_helpers import device_view, host_view

fd, data, nbytes, device, kind, how = (int(sys.argv[1]), bytes.fromhex(sys.argv[2]),
                                      int(sys.argv[3]), int(sys.argv[4]), sys.argv[5],
                                      sys.argv[6])
cupy.cuda.Device(device).use()
loc, atype = (Location.device(0), "device") if kind == "device" else (Location.host(), "pinned")
pool = MemPool.import_fd(fd, loc, atype)
os.close(fd)
assert pool.imported and pool.owned
if kind == "pinned" or device != 0:
    pool.set_access(device, "rw")  # this process's device reaches the exporter's memory
if how == "oversize":  # the peer claims more than it allocated: the driver knows better
    try:
        extra = pool.import_pointer(data, nbytes * 64)
    except ValueError as e:
        print("OVERSIZE REFUSED", e, flush=True)
    else:
        print("OVERSIZE ACCEPTED", extra.nbytes, flush=True)
        extra.release()
imported = pool.import_pointer(data, nbytes)
words = nbytes // 4
view = device_view(imported.ptr, words, dtype=np.uint32, device_id=device)
expected = cupy.arange(words, dtype=cupy.uint32)
ok = bool((view == expected).all())
view += 7
cupy.cuda.runtime.deviceSynchronize()
if kind == "pinned":  # host code of the importer reads the exporter's pinned memory too
    ok = ok and bool((host_view(imported.ptr, words, np.uint32)[:16] ==
                      np.arange(16, dtype=np.uint32) + 7).all())
print("CHECKED" if ok else "WRONG", flush=True)
if how == "die":
    os._exit(0)  # holding the import: the driver must clean up after this process
if how == "dealloc_gil":
    # The import dies while a Python host function waits behind a kernel on the legacy stream:
    # its release (a free and a wait on a stream of its own) must not hold the GIL, nor wait
    # for the legacy stream with it.
    spin = cupy.RawKernel('extern "C" __global__ void spin(long long cycles)'
                          '{ long long t = clock64(); while (clock64() - t < cycles) {} }', "spin")
    ran = []
    null = cupy.cuda.Stream.null
    with null:
        spin((1,), (1,), (cupy.int64(2_000_000_000),))
    null.launch_host_func(lambda _: ran.append(1), None)
    del imported, view
    null.synchronize()
    print("DEALLOC OK", ran, flush=True)
    pool.close()
    print("OK", flush=True)
    sys.exit(0)
if how == "dealloc_during_capture":
    # The import dies while another thread captures, in global mode, on a blocking stream: its
    # release must neither break that capture nor be refused there (leaving the import mapped).
    from cuda.bindings import driver as cu
    from gpu_helpers import captured_elsewhere
    address = imported.ptr
    with captured_elsewhere(cupy, "global", non_blocking=False) as outcome:
        del imported, view
    print("DEALLOC CAPTURE", outcome["capture"].upper(), flush=True)
    err, _ = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                      address)
    print("AFTER DEL", "MAPPED" if err == cu.CUresult.CUDA_SUCCESS else f"UNMAPPED ({err.name})",
          flush=True)
    pool.close()
    print("OK", flush=True)
    sys.exit(0)
if how == "two_threads":  # two threads releasing one import: one frees it, both return
    import threading
    failures = []
    imported.release()  # one import of the pointer at a time
    for _ in range(40):
        again = pool.import_pointer(data, nbytes)
        start = threading.Barrier(2)
        def release(imp=again):
            start.wait()
            try:
                imp.release()
            except Exception as e:  # noqa: BLE001 - what the test reports
                failures.append(f"{type(e).__name__}: {e}")
        threads = [threading.Thread(target=release) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert again.released
    print("RELEASE FAILURES", len(failures), failures[:2], flush=True)
    imported = pool.import_pointer(data, nbytes)
if how == "capture_release":  # a release inside a capture is refused and changes nothing
    from rmm.pylibrmm.stream import Stream
    cs = cupy.cuda.Stream(non_blocking=True)
    cs.begin_capture(cupy.cuda.runtime.streamCaptureModeThreadLocal)
    try:
        imported.release(Stream(obj=cs))
    except asyncmr.UnsupportedError as e:
        print("CAPTURE RELEASE REFUSED", e, flush=True)
    except Exception as e:
        print("CAPTURE RELEASE FAILED", type(e).__name__, e, flush=True)
    else:
        print("CAPTURE RELEASE ACCEPTED", flush=True)
    try:
        cs.end_capture()
        print("CAPTURE VALID", flush=True)
    except Exception as e:
        print("CAPTURE BROKEN", e, flush=True)
    print("IMPORT LIVE" if not imported.released else "IMPORT FORGOTTEN", flush=True)
    ok = bool((view == expected + 7).all())
    print("STILL MAPPED" if ok else "NOT MAPPED", flush=True)
imported.release()
assert imported.released
pool.close()
print("OK", flush=True)
"""


def _exporter(kind: str):
    """(pool, resource, ptr) of a shareable pool of ``kind`` holding arange(WORDS) words."""
    cupy = require_module("cupy")
    if kind == "device":
        pool = MemPool.create(Location.device(0), "device", export_handle_types="posix_fd")
        mr = AsyncDeviceMR(pool=pool)
    else:
        pool = MemPool.create(Location.host(), "pinned", export_handle_types="posix_fd")
        mr = AsyncPinnedMR(pool=pool)
    ptr = mr.allocate(MiB)
    device_view(ptr, WORDS, dtype=np.uint32)[:] = cupy.arange(WORDS, dtype=cupy.uint32)
    sync()  # the allocation and the pattern are complete before the importer looks
    return pool, mr, ptr


def _share(pool, ptr, kind: str, device: int, how: str = "release"):
    fd = pool.export_fd()
    try:
        return run_python(CHILD, str(fd), asyncmr.export_pointer(ptr).hex(), str(MiB),
                          str(device), kind, how, pass_fds=(fd,), timeout=180)
    finally:
        os.close(fd)


def _child_says(how: str, *lines: str) -> None:
    """Shares a device pool's allocation with a child run ``how``; the child must end well and
    print each of ``lines``."""
    pool, mr, ptr = _exporter("device")
    proc = _share(pool, ptr, "device", 0, how=how)
    assert proc.returncode == 0 and "OK" in proc.stdout, describe(proc)
    for line in lines:
        assert line in proc.stdout, describe(proc)
    mr.deallocate(ptr, MiB)
    sync()
    pool.close()


def _exporter_sees_the_importers_writes(ptr):
    got = device_view(ptr, WORDS, dtype=np.uint32).get()
    np.testing.assert_array_equal(got, np.arange(WORDS, dtype=np.uint32) + 7)


def test_two_processes_on_one_gpu(gpu):
    pool, mr, ptr = _exporter("device")
    proc = _share(pool, ptr, "device", 0)
    assert proc.returncode == 0 and "CHECKED" in proc.stdout and "OK" in proc.stdout, \
        describe(proc)
    _exporter_sees_the_importers_writes(ptr)
    mr.deallocate(ptr, MiB)  # only after the importer released its mapping
    sync()
    pool.close()


def test_two_processes_on_two_gpus(two_gpus):
    pool, mr, ptr = _exporter("device")  # memory on GPU 0, written by a kernel on GPU 1
    proc = _share(pool, ptr, "device", 1)
    assert proc.returncode == 0 and "CHECKED" in proc.stdout and "OK" in proc.stdout, \
        describe(proc)
    _exporter_sees_the_importers_writes(ptr)
    mr.deallocate(ptr, MiB)
    sync()


def test_an_importer_that_dies_holding_imports_corrupts_nothing(gpu):
    pool, mr, ptr = _exporter("device")
    proc = _share(pool, ptr, "device", 0, how="die")
    assert proc.returncode == 0 and "CHECKED" in proc.stdout, describe(proc)
    _exporter_sees_the_importers_writes(ptr)
    mr.deallocate(ptr, MiB)
    sync()
    # The exporter's pool goes on: allocate, write, read, close.
    p = mr.allocate(MiB)
    device_view(p, WORDS, dtype=np.uint32)[:] = 3
    assert int(device_view(p, WORDS, dtype=np.uint32).sum()) == 3 * WORDS
    mr.deallocate(p, MiB)
    sync()
    pool.close()


def test_host_pinned_pools_across_processes(gpu):
    """What the driver allows for host pools: either the whole round trip works, or the
    refusal is a clear asyncmr error naming the call. The outcome is printed for the record."""
    try:
        pool, mr, ptr = _exporter("pinned")
        fd = pool.export_fd()
        os.close(fd)
    except ValueError as e:
        # The one refusal allowed: the driver's, at creation, said as asyncmr says it.
        assert "cudaMemPoolCreate refused export_handle_types" in str(e), e
        print(f"host pinned pools: the driver refuses IPC: {e}")
        return
    proc = _share(pool, ptr, "pinned", 0)
    assert proc.returncode == 0 and "CHECKED" in proc.stdout and "OK" in proc.stdout, \
        describe(proc)
    np.testing.assert_array_equal(host_view(ptr, WORDS, np.uint32),
                                  np.arange(WORDS, dtype=np.uint32) + 7)
    mr.deallocate(ptr, MiB)
    sync()
    print("host pinned pools: exported, imported, written by the importer's kernel and read "
          "by both processes' host code")


def test_an_importer_cannot_claim_more_bytes_than_the_driver_mapped(gpu):
    _child_says("oversize", "OVERSIZE REFUSED")


def test_an_import_dying_behind_a_python_host_function_does_not_deadlock(gpu):
    _child_says("dealloc_gil", "DEALLOC OK [1]")


def test_a_release_inside_a_capture_is_refused_and_the_import_stays_live(gpu):
    _child_says("capture_release", "CAPTURE RELEASE REFUSED", "CAPTURE VALID", "IMPORT LIVE",
                "STILL MAPPED")


def test_an_import_dying_during_another_threads_global_capture_leaves_it_valid(gpu):
    # It used to be released on the legacy stream, which a capture on a blocking stream forbids:
    # the capture broke and the release was refused (the import stayed mapped).
    _child_says("dealloc_during_capture", "DEALLOC CAPTURE VALID", "AFTER DEL UNMAPPED")


def test_two_threads_releasing_one_import_free_it_once(gpu):
    _child_says("two_threads", "RELEASE FAILURES 0 []")


# ---- bad input -----------------------------------------------------------------------------------

def test_a_pool_created_without_export_types_cannot_be_exported(gpu):
    with MemPool.create(Location.device(0), "device") as pool:
        with pytest.raises(ValueError, match="created without export_handle_types"):
            pool.export_fd()
        mr = AsyncDeviceMR(pool=pool)
        p = mr.allocate(MiB)
        with pytest.raises(ValueError, match="refused to export"):
            asyncmr.export_pointer(p)
        mr.deallocate(p, MiB)
        sync()


def test_an_fd_that_is_not_a_pool_is_refused(gpu):
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        with pytest.raises((ValueError, asyncmr.CUDAError), match="not an exported memory pool|"
                           "cudaMemPoolImportFromShareableHandle"):
            MemPool.import_fd(fd, Location.device(0), "device")
    finally:
        os.close(fd)


def test_only_imported_pools_import_pointers_and_they_allocate_nothing(gpu):
    pool, mr, ptr = _exporter("device")
    fd = pool.export_fd()
    with pytest.raises(ValueError, match="needs an imported pool"):
        pool.import_pointer(asyncmr.export_pointer(ptr), MiB)
    with pytest.raises(ValueError, match="64 bytes"):
        pool.import_pointer(b"short", MiB)
    try:
        imported = MemPool.import_fd(fd, Location.device(0), "device")  # in the same process
    except ValueError as e:
        # The driver may refuse a process its own pool; then asyncmr says so, naming the call.
        assert "cudaMemPoolImportFromShareableHandle" in str(e), e
        print(f"importing into the exporting process: {e}")
    else:
        with pytest.raises(ValueError, match="imported pool cannot be allocated from"):
            AsyncDeviceMR(pool=imported).allocate(MiB)
        # An import's threshold and reserve are its exporter's: refused by name, the driver
        # never asked (an imported pool answers no attribute).
        for options in ({"reserve": MiB}, {"release_threshold": 0}):
            with pytest.raises(ValueError, match=f"{next(iter(options))} cannot be set on an "
                                                 "imported pool"):
                AsyncDeviceMR(pool=imported, **options)
        with pytest.raises(ValueError, match="imported pool cannot be made current"):
            imported.make_current()
        imported.close()
    finally:
        os.close(fd)
    mr.deallocate(ptr, MiB)
    sync()
    pool.close()


def test_import_pointer_takes_the_64_bytes_from_any_buffer():
    # A strided view of the 64 bytes is as good as bytes: it passes the data check and reaches
    # the pool (here an empty MemPool, refused by name), where memoryview's cast refused it.
    data = np.zeros(128, np.uint8)[::2]
    with pytest.raises(TypeError, match="MemPool.__new__ made an empty MemPool"):
        MemPool.__new__(MemPool).import_pointer(data, 64)
