# SPDX-License-Identifier: Apache-2.0
"""Capture: at least 1000 tiny capture cycles, in global and in thread-local mode, while other
threads, and the capturing thread itself from inside each capture, call every attribute getter
and setter, trim, set_access/access and make_current/as_current. Every capture must end valid
(``cudaStreamEndCapture`` via cuda.bindings.runtime returns success), and its graph, which
allocates from a pool, writes and checks a pattern and bumps a counter, must instantiate and run.

Environment: ASYNCMR_CAPTURE_CYCLES (default 1000, split evenly between the two modes).
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
import traceback

import pytest

import asyncmr
from asyncmr import Location, MemPool

import reliability_helpers as h

pytestmark = pytest.mark.gpu

CYCLES = int(os.environ.get("ASYNCMR_CAPTURE_CYCLES", "1000"))
HAMMER_THREADS = 3
BLOCK = 4096  # bytes each captured graph allocates, writes, checks and frees


class ControlCalls:
    """Every control call on a set of pools, as (name, callable) pairs; each call leaves the
    pools as it found them (a setter writes another value, then the saved one)."""

    def __init__(self, pools, routed):
        # pools: [(name, MemPool, is_host)]; routed: [(name, owned MemPool, Location, type)]
        self.saved = {name: h.settable(pool) for name, pool, _ in pools}
        self.route_lock = threading.Lock()
        self.calls: list[tuple[str, object]] = []
        for name, pool, is_host in pools:
            self._pool_calls(name, pool, is_host)
        for name, owned, loc, atype in routed:
            self._routing_calls(name, owned, loc, atype)

    def _add(self, name, fn):
        self.calls.append((name, fn))

    def _pool_calls(self, name, pool, is_host):
        attrs = pool.attributes
        saved = self.saved[name]

        driver = asyncmr.driver_version()
        for row in asyncmr.attribute_table:
            def get(row=row):
                try:
                    getattr(attrs, row.name)
                except asyncmr.UnsupportedError:
                    # Only an attribute newer than this driver may be unanswerable, and only for
                    # a pool asyncmr cannot describe itself.
                    if row.min_driver <= driver:
                        raise
            self._add(f"{name}.get({row.name})", get)
        for attr, value in saved.items():
            other = (not value) if isinstance(value, bool) else (0 if value else 64 * h.MiB)

            def set_and_back(attr=attr, value=value, other=other):
                setattr(attrs, attr, other)
                setattr(attrs, attr, value)
            self._add(f"{name}.set({attr})", set_and_back)
        threshold = saved["release_threshold"]

        def scoped():
            with attrs.scoped(release_threshold=0 if threshold else h.MiB):
                pass
        self._add(f"{name}.scoped(release_threshold)", scoped)
        self._add(f"{name}.set(used_mem_high=0)", lambda: setattr(attrs, "used_mem_high", 0))
        self._add(f"{name}.set(reserved_mem_high=0)",
                  lambda: setattr(attrs, "reserved_mem_high", 0))
        self._add(f"{name}.reset_peaks()", pool.reset_peaks)
        self._add(f"{name}.as_dict()", attrs.as_dict)
        self._add(f"{name}.repr()", lambda: repr(attrs) and repr(pool))
        self._add(f"{name}.trim_to(0)", lambda: pool.trim_to(0))
        self._add(f"{name}.trim_to(1MiB)", lambda: pool.trim_to(h.MiB))
        self._add(f"{name}.access(0)", lambda: pool.access(0))
        if is_host:
            # Only grants what the resources already granted: never revoke access to a shared
            # pool (a kernel touching memory it cannot access ruins the context).
            self._add(f"{name}.set_access(0, 'rw')", lambda: pool.set_access(0, "rw"))
            self._add(f"{name}.set_access('all', 'rw')", lambda: pool.set_access("all", "rw"))

    def _routing_calls(self, name, owned, loc, atype):
        lock = self.route_lock

        def as_current():
            with lock, owned.as_current():
                assert MemPool.current(loc, atype) == owned, "as_current did not route"

        def make_current():
            with lock:
                previous = owned.make_current()
                try:
                    assert MemPool.current(loc, atype) == owned, "make_current did not route"
                finally:
                    previous.make_current()

        def current():
            MemPool.current(loc, atype)

        self._add(f"route {name}: as_current()", as_current)
        self._add(f"route {name}: make_current() and back", make_current)
        self._add(f"route {name}: MemPool.current()", current)


class Capturer:
    """Runs capture cycles on one non-blocking stream of the calling thread."""

    def __init__(self, cupy, allocators):
        from cuda.bindings import runtime as rt
        from rmm.pylibrmm.stream import Stream

        self.rt = rt
        self.cupy = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.rmm_stream = Stream(obj=self.stream)
        self.allocators = allocators
        # Allocated before any capture: cudaMalloc is not allowed while one is open.
        self.bad = cupy.zeros(1, dtype=cupy.uint64)
        self.runs = cupy.zeros(1, dtype=cupy.uint64)
        self.launched = 0
        self.failures: list[tuple[int, str]] = []
        self.inside: set[tuple[str, str]] = set()  # (mode, control call) made inside a capture
        self.capturing = threading.Event()
        self.cycle = -1

    def _ok(self, err, what, cycle, mode, op):
        if err != self.rt.cudaError_t.cudaSuccess:
            self.failures.append((cycle, f"cycle {cycle} ({mode}), control call {op!r} inside: "
                                         f"{what} returned {err.name}"))
            return False
        return True

    def cycles(self, mode: str, n: int, calls, first: int) -> None:
        rt = self.rt
        cmode = {"global": rt.cudaStreamCaptureMode.cudaStreamCaptureModeGlobal,
                 "thread_local": rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal}[mode]
        sptr = self.stream.ptr
        for i in range(first, first + n):
            mr = self.allocators[i % len(self.allocators)]
            op_name, op = calls[i % len(calls)]
            self.cycle = i
            err, = rt.cudaStreamBeginCapture(sptr, cmode)
            if not self._ok(err, "cudaStreamBeginCapture", i, mode, op_name):
                break
            self.capturing.set()
            ptr = 0
            try:
                ptr = mr.allocate(BLOCK, self.rmm_stream)  # a graph allocation node
                h.fill(ptr, BLOCK, i, self.stream)
                h.check(ptr, BLOCK, i, self.bad, self.stream)
                h.bump(self.runs, self.stream)
                op()  # a control call from the capturing thread, inside its capture
                self.inside.add((mode, op_name))
                time.sleep(0)  # let the other threads' calls land inside this capture too
            except Exception:
                self.failures.append((i, f"cycle {i} ({mode}), control call {op_name!r} raised:"
                                         f"\n{traceback.format_exc()}"))
            finally:
                if ptr:
                    mr.deallocate(ptr, BLOCK, self.rmm_stream)  # a graph free node
                self.capturing.clear()
                err, graph = rt.cudaStreamEndCapture(sptr)
            if not self._ok(err, "cudaStreamEndCapture", i, mode, op_name):
                continue
            err, gexec = rt.cudaGraphInstantiate(graph, 0)
            if self._ok(err, "cudaGraphInstantiate", i, mode, op_name):
                err, = rt.cudaGraphLaunch(gexec, sptr)
                if self._ok(err, "cudaGraphLaunch", i, mode, op_name):
                    err, = rt.cudaStreamSynchronize(sptr)
                    if self._ok(err, "cudaStreamSynchronize", i, mode, op_name):
                        self.launched += 1
                rt.cudaGraphExecDestroy(gexec)
            rt.cudaGraphDestroy(graph)
            if len(self.failures) >= 10:
                break


def test_capture_cycles_stay_valid_under_pool_control(gpu, kernels, cp):
    assert CYCLES >= 2
    dev_mr, man_mr, pin_mr = (h.make_resource(k) for k in ("device", "managed", "pinned"))
    own_mr = h.make_resource("device", "new")
    routed = [("device", MemPool.create(Location.device(0), "device"), Location.device(0),
               "device"),
              ("managed", MemPool.create(Location.device(0), "managed"), Location.device(0),
               "managed"),
              ("pinned", MemPool.create(Location.host(), "pinned"), Location.host(), "pinned")]
    routing_before = {name: MemPool.current(loc, atype) for name, _, loc, atype in routed}
    control = ControlCalls([("device-default", dev_mr.pool, False),
                            ("managed-default", man_mr.pool, False),
                            ("pinned-default", pin_mr.pool, True),
                            ("device-owned", own_mr.pool, False)], routed)
    calls = control.calls
    capturer = Capturer(cp, [dev_mr, man_mr, own_mr])

    stop = threading.Event()
    hammer_errors: list[str] = []
    hammer_counts = [0] * HAMMER_THREADS
    during: dict[int, list[str]] = {}
    during_lock = threading.Lock()

    def hammer(tid):
        rng = random.Random(tid)
        order = list(calls)
        try:
            while not stop.is_set():
                rng.shuffle(order)
                for name, fn in order:
                    if stop.is_set():
                        break
                    cycle = capturer.cycle if capturer.capturing.is_set() else None
                    fn()
                    hammer_counts[tid] += 1
                    if cycle is not None:
                        with during_lock:
                            during.setdefault(cycle, []).append(name)
                    time.sleep(0)
        except BaseException:
            hammer_errors.append(f"hammer {tid}: {traceback.format_exc()}")

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # interleave the threads finely while captures are open
    threads = [threading.Thread(target=hammer, args=(t,), name=f"hammer-{t}")
               for t in range(HAMMER_THREADS)]
    start = time.monotonic()
    try:
        for t in threads:
            t.start()
        half = CYCLES // 2
        capturer.cycles("global", half, calls, 0)
        global_ok = capturer.launched
        capturer.cycles("thread_local", CYCLES - half, calls, half)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
        sys.setswitchinterval(switch)
        seconds = time.monotonic() - start
        for name, pool, _ in [("device-default", dev_mr.pool, False),
                              ("managed-default", man_mr.pool, False),
                              ("pinned-default", pin_mr.pool, True),
                              ("device-owned", own_mr.pool, False)]:
            h.restore_settable(pool, control.saved[name])
    runs = int(capturer.runs.get()[0])
    mismatches = int(capturer.bad.get()[0])
    in_capture_by_others = sum(len(v) for v in during.values())

    assert not any(t.is_alive() for t in threads), "a control thread hung"
    assert not capturer.failures, (
        f"{len(capturer.failures)} capture cycle(s) failed:\n" + "\n".join(
            f"{text}\n  calls from other threads during it: {during.get(cycle, [])}"
            for cycle, text in capturer.failures))
    assert not hammer_errors, "\n".join(hammer_errors)
    assert capturer.launched == CYCLES and runs == CYCLES, (
        f"{CYCLES} cycles, {capturer.launched} graphs launched, {runs} ran")
    assert mismatches == 0, f"{mismatches} words wrong in graph-allocated blocks"
    if CYCLES // 2 >= len(calls):  # each mode had a cycle for every call
        for mode in ("global", "thread_local"):
            missed = {name for name, _ in calls} - {n for m, n in capturer.inside if m == mode}
            assert not missed, f"never made inside a {mode} capture: {sorted(missed)}"
    assert in_capture_by_others > 0, (
        "no control call from another thread landed inside a capture; the test proved nothing")
    # Everything the calls changed is back.
    for name, pool, _ in [("device-default", dev_mr.pool, False),
                          ("managed-default", man_mr.pool, False),
                          ("pinned-default", pin_mr.pool, True),
                          ("device-owned", own_mr.pool, False)]:
        assert h.settable(pool) == control.saved[name]
    for name, _, loc, atype in routed:
        assert MemPool.current(loc, atype) == routing_before[name], f"{name} routing not restored"
    for _, owned, _, _ in routed:
        owned.close()
    h.record("capture", f"capture: {CYCLES} cycles ({global_ok} global, "
                        f"{capturer.launched - global_ok} thread-local), every capture valid and "
                        f"its graph run; {len(calls)} control calls each made inside captures by "
                        f"the capturing thread; {sum(hammer_counts)} calls from "
                        f"{HAMMER_THREADS} other threads, {in_capture_by_others} of them while "
                        f"a capture was open; {seconds:.1f}s")
