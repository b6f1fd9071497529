#!/usr/bin/env bash
# Temporary: isolate a crash by running subsets of the resource tests in separate processes.
export PYTHONPATH=/tmp/site
t="tests/test_resources.py::test_device_buffer_round_trip"
run() { out=$(timeout 120 python3 -m pytest -q -p no:cacheprovider "$@" 2>&1); echo "[$*] rc=$? :: $(echo "$out" | grep -E "passed|failed|Fatal Python error" | head -2 | tr '\n' ' ')" | sed "s#$t##g"; }
run "$t[managed-default]" "$t[managed-current]" "$t[managed-new]" "$t[managed-adopted]" "$t[device-default]" "$t[device-current]" "$t[device-new]" "$t[device-adopted]"
run "$t[managed-default]" "$t[managed-current]" "$t[managed-new]" "$t[device-default]" "$t[device-current]" "$t[device-new]" "$t[device-adopted]"
run "$t[managed-default]" "$t[managed-current]" "$t[managed-adopted]" "$t[device-default]" "$t[device-current]" "$t[device-new]" "$t[device-adopted]"
run "$t[managed-new]" "$t[managed-adopted]" "$t[device-default]" "$t[device-current]" "$t[device-new]" "$t[device-adopted]"
run "$t[managed-default]" "$t[managed-current]" "$t[device-default]" "$t[device-current]" "$t[device-new]" "$t[device-adopted]"
cat > /tmp/destroy.py <<'PY'
import sys, asyncmr, rmm, numpy as np
from asyncmr import MemPool, Location
MiB = 1 << 20
kind = sys.argv[1]
for i in range(int(sys.argv[2])):
    owner = MemPool.create(Location.device(0), kind)
    mr = (asyncmr.AsyncManagedMR if kind == "managed" else asyncmr.AsyncDeviceMR)(pool=owner.handle)
    buf = rmm.DeviceBuffer(size=MiB, mr=mr)
    owner.close()            # destroy with an allocation live
    del buf, mr              # free into the destroyed pool
    d = asyncmr.AsyncDeviceMR()
    b = rmm.DeviceBuffer(size=MiB, mr=d)
    b.copy_from_host(np.zeros(MiB, np.uint8))
print("ok", kind)
PY
for k in managed device; do timeout 60 python3 /tmp/destroy.py $k 20 2>&1 | grep -E "ok|Fatal" | head -1; done
