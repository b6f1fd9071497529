"""Temporary diagnostics for failures seen only under compute-sanitizer memcheck."""
import gc
import json
import os
import sys
import weakref

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(here, "..", "tests"), os.path.join(here, "..", "tests", "reliability")]
mode = sys.argv[1]

if mode == "nogpu":
    from test_reliability_no_gpu import ENTRY_POINTS
    import asyncmr
    for expr in ENTRY_POINTS:
        print("EVAL", expr, flush=True)
        try:
            eval(expr, {"asyncmr": asyncmr})
            print("  ok", flush=True)
        except BaseException as e:
            print("  ", type(e).__name__, str(e)[:150], flush=True)
    print("DONE", flush=True)
    sys.exit(0)

if mode == "garbage":
    import ctypes
    import asyncmr
    fill = int(sys.argv[2], 0)
    b = bytearray(bytes([fill]) * 4096)
    addr = ctypes.addressof((ctypes.c_char * 4096).from_buffer(b)) + 256
    try:
        p = asyncmr.MemPool.from_handle(addr)
        print("accepted", p, flush=True)
        print("threshold", p.attributes.release_threshold, flush=True)
    except Exception as e:
        print("refused", type(e).__name__, e, flush=True)
    print("DONE", flush=True)
    sys.exit(0)

import cupy as cp
import rmm
import asyncmr
from rmm.allocators.cupy import rmm_cupy_allocator

kind = sys.argv[2] if len(sys.argv) > 2 else "device"
mr = {"device": asyncmr.AsyncDeviceMR, "managed": asyncmr.AsyncManagedMR}[kind]()
alive = weakref.ref(mr.pool)
prev = cp.cuda.get_allocator()
prev_mr = rmm.mr.get_current_device_resource()
rmm.mr.set_current_device_resource(mr)
cp.cuda.set_allocator(rmm_cupy_allocator)
arrays = [cp.arange(n // 4, dtype=cp.uint32) for n in (4096, 1 << 20)]
cp.cuda.set_allocator(prev)
rmm.mr.set_current_device_resource(prev_mr)
bufs = [rmm.DeviceBuffer(size=4096, mr=mr)]
print("refcount of resource before del:", sys.getrefcount(mr), flush=True)
del mr
total = int(arrays[1].sum())
print("sum ok:", total == sum(range((1 << 20) // 4)), flush=True)
del arrays
gc.collect()
cp.cuda.runtime.deviceSynchronize()
print("alive after arrays deleted:", alive() is not None, flush=True)
del bufs
gc.collect()
cp.cuda.runtime.deviceSynchronize()
print("alive after all deleted:", alive() is not None, flush=True)
pool = alive()
if pool is not None:
    for r in gc.get_referrers(pool):
        if type(r).__name__.startswith("Async"):
            print("resource refcount:", sys.getrefcount(r), flush=True)
            for rr in gc.get_referrers(r):
                print("  by", type(rr).__name__, repr(rr)[:300], flush=True)
                for rrr in gc.get_referrers(rr)[:6]:
                    print("    by", type(rrr).__name__, repr(rrr)[:300], flush=True)
print("DONE", flush=True)
