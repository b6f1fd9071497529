import faulthandler
faulthandler.enable()
import asyncmr, cupy, numpy as np
from cuda.bindings import runtime as rt
n = 1 << 20
dev = cupy.zeros(n // 4, dtype=cupy.int32)
host = np.ones(n // 4, dtype=np.int32)
err, hostalloc = rt.cudaHostAlloc(n, 0)
srcs = {"cudaHostAlloc": hostalloc}
for name, mr in [("pinned-default", asyncmr.AsyncPinnedMR()), ("pinned-new", asyncmr.AsyncPinnedMR(pool="new")),
                 ("managed", asyncmr.AsyncManagedMR())]:
    srcs[name] = mr.allocate(n)
    srcs[name + "-mr"] = mr
cupy.cuda.runtime.deviceSynchronize()
K = {"HtoD": rt.cudaMemcpyKind.cudaMemcpyHostToDevice, "DtoH": rt.cudaMemcpyKind.cudaMemcpyDeviceToHost,
     "DtoD": rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice, "Default": rt.cudaMemcpyKind.cudaMemcpyDefault}
for name, p in srcs.items():
    if name.endswith("-mr"):
        continue
    res = []
    for kname, kind in K.items():
        e1 = rt.cudaMemcpy(p, dev.data.ptr, n, kind)[0]   # device -> p
        e2 = rt.cudaMemcpy(dev.data.ptr, p, n, kind)[0]   # p -> device
        e3 = rt.cudaMemcpy(host.ctypes.data, p, n, kind)[0]  # p -> pageable host
        rt.cudaGetLastError()
        res.append(f"{kname}: to={e1.name[9:]} from={e2.name[9:]} toHost={e3.name[9:]}")
    print(name, " | ".join(res), flush=True)
