"""A C++ exception from each extension module of asyncmr._core reaches Python as its Python
exception, never std::terminate. Run by .ci/run against a build whose libstdc++ is linked
statically (as some toolchains do by default), where every module has a C++ runtime of its own
and a translator in another module than the catching one finds no exception to rethrow.

    python ci/check_translation.py   (with no GPU: each call below refuses before the driver)
"""

import asyncmr
from asyncmr import Location, MemPool, NoDeviceError

CALLS = {
    "mem_pool": (lambda: MemPool.create(Location.device(0), "device"), NoDeviceError),
    "resources": (lambda: asyncmr.AsyncManagedMR(), NoDeviceError),
    "placement": (lambda: asyncmr.prefetch((0, 16), "device"), ValueError),
    "ipc": (lambda: asyncmr.export_pointer(0), ValueError),
}

for module, (call, expected) in CALLS.items():
    try:
        call()
    except expected as e:
        print(f"{module}: {type(e).__name__}: {str(e)[:70]}")
    else:
        raise SystemExit(f"{module}: no {expected.__name__}")
print(f"{len(CALLS)} modules translate their C++ exceptions")
