# SPDX-License-Identifier: Apache-2.0
"""The front cache against a shadow model, on the GPU: threads with streams that come and go
make random allocations, frees (on the allocating stream or, ordered by an event, on another),
stream destructions, capture-and-launch cycles (a graph's allocation freed inside the graph, or
outside it after every launch), release_cache and trim_to calls, and frees the cache must refuse
(another pool's block, a wrong size, a second free). The model knows every live block; it fails
the test when an address range is handed out while another live block covers it, when a refused
free is accepted or an accepted one refused, and a kernel checks every block's pattern before
its free (a block that two owners wrote, or that was freed under a kernel, shows up there).

The pure-CPU half of the same model runs against the bare front cache in the C++ suite
(FrontCacheStress, tests/cpp/front_cache_test.cpp), in CI.

Environment: ASYNCMR_MODEL_OPS (operations per thread; default ASYNCMR_STRESS_OPS, else 1500),
ASYNCMR_MODEL_THREADS (default 4), ASYNCMR_MODEL_RELEASE_GIL (every resource's ``release_gil``;
default: theirs),
ASYNCMR_STRESS_SEED. Under compute-sanitizer (ASYNCMR_UNDER_SANITIZER=1) every fill, check and
graph launch is instrumented: there the pattern covers each block's first 16 KiB only (a block
two owners wrote still shows it there, and memcheck itself sees any access outside a block), and
ci/gpu.sh's memcheck stage runs one thread of 300 operations, then four threads of 60 with
``release_gil="always"``: with four threads and the resources' own ``release_gil`` the
instrumented run stops making progress, and with ``"always"`` it ends in seconds.
"""

from __future__ import annotations

import bisect
import os
import random
import threading
import traceback

import pytest

import reliability_helpers as h

pytestmark = pytest.mark.gpu

OPS = int(os.environ.get("ASYNCMR_MODEL_OPS") or os.environ.get("ASYNCMR_STRESS_OPS") or 1500)
SEED = int(os.environ.get("ASYNCMR_STRESS_SEED", "20261201"))
THREADS = int(os.environ.get("ASYNCMR_MODEL_THREADS", "4"))
GIL_POLICY = os.environ.get("ASYNCMR_MODEL_RELEASE_GIL")  # every resource's release_gil
PATTERN_CAP = 16 * h.KiB if h.UNDER_SANITIZER else None  # see the module's docstring


def _patterned(n: int) -> int:
    """The bytes of an ``n``-byte block its pattern covers."""
    whole = n - n % 4
    return whole if PATTERN_CAP is None else min(whole, PATTERN_CAP)
CAP = 16 * h.MiB


class Shadow:
    """Every live block of the cached resources, by address; checks that none overlap."""

    def __init__(self):
        self.lock = threading.Lock()
        self.starts: list[int] = []
        self.blocks: dict[int, int] = {}  # start -> end
        self.overlaps: list[str] = []

    def add(self, ptr: int, nbytes: int, what: str) -> None:
        with self.lock:
            i = bisect.bisect_left(self.starts, ptr)
            for j in (i - 1, i):
                if 0 <= j < len(self.starts):
                    start = self.starts[j]
                    if start < ptr + nbytes and ptr < self.blocks[start]:
                        self.overlaps.append(f"{what}: [{ptr:#x}, +{nbytes}) overlaps the live "
                                             f"block at {start:#x}")
            if ptr in self.blocks:
                return
            self.starts.insert(i, ptr)
            self.blocks[ptr] = ptr + nbytes

    def remove(self, ptr: int) -> None:
        with self.lock:
            self.blocks.pop(ptr, None)
            i = bisect.bisect_left(self.starts, ptr)
            if i < len(self.starts) and self.starts[i] == ptr:
                self.starts.pop(i)


def _sizes(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.6:
        return rng.randint(1, 16 * h.KiB)
    if r < 0.95:
        return rng.randint(1, 1 * h.MiB)
    return rng.randint(1 * h.MiB + 1, 3 * h.MiB)  # above max_block: never cached


def test_the_front_cache_against_a_shadow_model(gpu, kernels, cp):
    import asyncmr
    from rmm.pylibrmm.stream import Stream

    resources = {
        "device": asyncmr.AsyncDeviceMR(pool="new", cache=CAP),
        "managed": asyncmr.AsyncManagedMR(pool="new", cache=CAP),
        "pinned": asyncmr.AsyncPinnedMR(pool="new", cache=CAP),
    }
    capturable = ("device", "managed")
    foreign = asyncmr.AsyncDeviceMR(pool="new")  # another pool: its blocks are refused
    if GIL_POLICY is not None:
        for mr in (*resources.values(), foreign):
            mr.release_gil = GIL_POLICY
    shadow = Shadow()
    bad = cp.zeros(1, dtype=cp.uint64)
    # Releases and trims wait for this gate exclusively; a double free holds it shared (a
    # release could otherwise hand the block to the pool and another thread, after which a late
    # second free is indistinguishable from the new owner's: no allocator can tell).
    gate = threading.Condition()
    state = {"readers": 0}
    failures: list[str] = []
    counts = {"allocs": 0, "frees": 0, "refusals": 0, "graphs": 0, "releases": 0,
              "destroyed_streams": 0}
    counts_lock = threading.Lock()

    def bump(key, n=1):
        with counts_lock:
            counts[key] += n

    def shared_gate():
        class _Shared:
            def __enter__(self):
                with gate:
                    state["readers"] += 1

            def __exit__(self, *exc):
                with gate:
                    state["readers"] -= 1
                    gate.notify_all()
        return _Shared()

    def exclusive(fn):
        with gate:
            gate.wait_for(lambda: state["readers"] == 0)
            fn()

    def expect_refused(fn, what):
        try:
            fn()
        except ValueError:
            bump("refusals")
            return
        failures.append(f"{what} was accepted")

    def worker(tid: int):
        rng = random.Random(SEED + tid)
        streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
        live: list[tuple] = []  # (kind, ptr, nbytes, seed, cupy stream)
        seed = tid << 24
        try:
            for op in range(OPS):
                r = rng.random()
                if r < 0.02:
                    # A stream dies: its blocks are freed on it first (in its order), then it
                    # is destroyed with work possibly still queued.
                    victim = rng.randrange(len(streams))
                    old = streams[victim]
                    for b in [b for b in live if b[4] is old]:
                        live.remove(b)
                        free(b, old)
                    streams[victim] = cp.cuda.Stream(non_blocking=True)
                    del old
                    bump("destroyed_streams")
                elif r < 0.04:
                    capture_cycle(rng, seed + op)
                elif r < 0.05:
                    what = rng.choice(["release", "trim"])
                    kind = rng.choice(list(resources))
                    exclusive(resources[kind].release_cache if what == "release"
                              else resources[kind].trim_to)
                    bump("releases")
                elif r < 0.06:
                    s = rng.choice(streams)
                    p = foreign.allocate(64 * h.KiB, Stream(obj=s))
                    kind = rng.choice(list(resources))
                    expect_refused(lambda: resources[kind].deallocate(p, 64 * h.KiB, Stream(obj=s)),
                                   f"{kind}: a free of another pool's block")
                    foreign.deallocate(p, 64 * h.KiB, Stream(obj=s))
                elif live and (len(live) >= 24 or r < 0.5):
                    b = live.pop(rng.randrange(len(live)))
                    s = b[4]
                    if rng.random() < 0.3:
                        # Freed on another stream, ordered after the block's work by an event.
                        other = rng.choice(streams)
                        other.wait_event(s.record())
                        s = other
                    free(b, s, rng)
                else:
                    kind = rng.choice(list(resources))
                    s = rng.choice(streams)
                    n = _sizes(rng)
                    seed += 1
                    p = resources[kind].allocate(n, Stream(obj=s))
                    shadow.add(p, n, f"{kind} allocate({n})")
                    h.fill(p, _patterned(n), seed & 0xFFFFFFFF, s)
                    live.append((kind, p, n, seed & 0xFFFFFFFF, s))
                    bump("allocs")
            for b in live:
                free(b, b[4])
            for s in streams:
                s.synchronize()
        except Exception:
            failures.append(f"thread {tid}: {traceback.format_exc()}")

    def free(b, s, rng=None):
        kind, p, n, seed, _ = b
        mr = resources[kind]
        rs = Stream(obj=s)
        h.check(p, _patterned(n), seed, bad, s)
        cacheable = n <= 1 * h.MiB
        if rng is not None and cacheable and rng.random() < 0.05:
            wrong = 2 * h.MiB if n < 256 * h.KiB else 1
            expect_refused(lambda: mr.deallocate(p, wrong, rs), f"{kind}: a wrong size")
        shadow.remove(p)
        if rng is not None and cacheable and rng.random() < 0.05:
            with shared_gate():
                mr.deallocate(p, n, rs)
                # Cached: the cache refuses a second free (ValueError). Refused by the cap and
                # freed to the pool: the driver refuses it (CUDAError).
                try:
                    mr.deallocate(p, n, rs)
                except (ValueError, asyncmr.CUDAError):
                    bump("refusals")
                else:
                    failures.append(f"{kind}: a second free of {p:#x} was accepted")
        else:
            mr.deallocate(p, n, rs)
        bump("frees")

    def capture_cycle(rng, seed):
        kind = rng.choice(capturable)
        mr = resources[kind]
        s = cp.cuda.Stream(non_blocking=True)
        rs = Stream(obj=s)
        n = rng.choice([4 * h.KiB, 64 * h.KiB, 1 * h.MiB])
        inside = rng.random() < 0.5
        with s:
            s.begin_capture(cp.cuda.runtime.streamCaptureModeThreadLocal)
            g = mr.allocate(n, rs)  # the graph's own block
            h.fill(g, _patterned(n), seed & 0xFFFFFFFF, s)
            h.check(g, _patterned(n), seed & 0xFFFFFFFF, bad, s)
            if inside:
                mr.deallocate(g, n, rs)  # a graph free node
            graph = s.end_capture()
        for _ in range(3):
            graph.launch(s)
            if not inside:
                s.synchronize()
                shadow.add(g, n, f"{kind} graph block")
                mr.deallocate(g, n, rs)  # freed outside the graph, after every launch
                shadow.remove(g)
        s.synchronize()
        # An ordinary allocation right after must never be the graph's address.
        p = mr.allocate(n, rs)
        if p == g:
            failures.append(f"{kind}: an allocation got the graph's block {g:#x}")
        mr.deallocate(p, n, rs)
        s.synchronize()
        del graph
        bump("graphs")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    cp.cuda.runtime.deviceSynchronize()
    assert not any(t.is_alive() for t in threads), "a stress thread hung"
    assert not failures, "\n".join(failures[:10])
    assert not shadow.overlaps, "\n".join(shadow.overlaps[:10])
    assert int(bad.get()[0]) == 0, f"{int(bad.get()[0])} words wrong: a block had two owners"
    for kind, mr in resources.items():
        info = mr.cache_info
        assert info["refused_not_recorded"] >= 0 and info["bytes"] <= info["cap"], (kind, info)
        mr.trim_to(0)
        assert mr.cache_info["blocks"] == 0 and mr.cache_info["parked_blocks"] == 0, kind
        if not h.UNDER_SANITIZER:  # memcheck holds freed blocks back
            assert mr.attributes.used_mem_current == 0, (kind, mr.attributes.used_mem_current)
    # About half the operations allocate: a floor that a short run (the memcheck stage's four
    # threads of 60) reaches too.
    assert counts["allocs"] > min(100, OPS * THREADS // 4), counts
    assert counts["graphs"] > 0 and counts["refusals"] > 0, counts
    h.record("cache model", "cache model: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
