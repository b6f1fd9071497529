# SPDX-License-Identifier: Apache-2.0
"""Stress: N threads x M streams allocate blocks of random size (256 B .. 4 MiB) and lifetime,
a kernel fills each block with its own pattern, and every block is checked (by a kernel, and
for host-visible memory sometimes by the host) before it is freed. Blocks are rewritten and
freed on other streams and by other threads, always ordered by events. Zero corruption, and
every pool's ``used_mem_current`` back where it started.

Environment (a run ends at whichever budget is spent first):
  ASYNCMR_STRESS_SECONDS  time budget per test (default 3; soak 60)
  ASYNCMR_STRESS_OPS      operations per test, 0 = unlimited (default 2000; soak 0)
  ASYNCMR_STRESS_THREADS  threads (default 4; soak 8)
  ASYNCMR_STRESS_STREAMS  streams per thread (default 2; soak 4)
  ASYNCMR_STRESS_SEED     random seed (default 20261130)
  ASYNCMR_SOAK=1          enables the soak test (every resource at once, figures printed)
"""

from __future__ import annotations

import gc
import math
import os
import random
import threading
import time
import traceback
from dataclasses import dataclass, field

import pytest

import reliability_helpers as h

pytestmark = pytest.mark.gpu

MIN_WORDS = 64  # 256 B
MAX_WORDS = 1 << 20  # 4 MiB
LIVE_PER_THREAD = 8  # bounds memory: threads x 8 x 4 MiB + handoff, a few hundred MiB at most
HANDOFF_CAP = 8
HOST_CHECK_MAX = 64 * h.KiB  # host verification only for blocks up to this size
BUFFER_SHARE = 0.25  # share of blocks allocated as rmm.DeviceBuffer instead of mr.allocate


@dataclass(frozen=True)
class Config:
    seconds: float
    ops: int  # 0 = unlimited
    threads: int
    streams: int
    seed: int

    @classmethod
    def from_env(cls, soak: bool) -> Config:
        env = os.environ.get
        return cls(seconds=float(env("ASYNCMR_STRESS_SECONDS", "60" if soak else "3")),
                   ops=int(env("ASYNCMR_STRESS_OPS", "0" if soak else "2000")),
                   threads=int(env("ASYNCMR_STRESS_THREADS", "8" if soak else "4")),
                   streams=int(env("ASYNCMR_STRESS_STREAMS", "4" if soak else "2")),
                   seed=int(env("ASYNCMR_STRESS_SEED", "20261130")))


@dataclass
class Target:
    """A resource under stress."""

    name: str
    mr: object
    host_accessible: bool
    pool_handle: int = 0

    def __post_init__(self):
        self.pool_handle = self.mr.pool_handle


@dataclass
class Block:
    target: Target
    ptr: int
    nbytes: int
    seed: int
    event: object  # every piece of work on the block so far comes before this event
    stream: object  # the CuPy stream of the last work on the block
    owner: int  # the thread that allocated it
    buf: object = None  # the rmm.DeviceBuffer, when allocated as one (frees on buf_stream)
    buf_stream: object = None


@dataclass
class Tally:
    ops: int = 0
    allocations: int = 0
    buffers: int = 0
    frees: int = 0
    rewrites: int = 0
    cross_stream_frees: int = 0
    cross_thread_frees: int = 0
    bytes_allocated: int = 0
    bytes_checked: int = 0  # by kernels and by the host
    host_bytes_checked: int = 0
    host_mismatches: int = 0
    per_pool_allocations: dict = field(default_factory=dict)

    def add(self, other: Tally) -> None:
        for name in ("ops", "allocations", "buffers", "frees", "rewrites", "cross_stream_frees",
                     "cross_thread_frees", "bytes_allocated", "bytes_checked",
                     "host_bytes_checked", "host_mismatches"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for k, v in other.per_pool_allocations.items():
            self.per_pool_allocations[k] = self.per_pool_allocations.get(k, 0) + v


class Stress:
    def __init__(self, targets: list[Target], config: Config):
        import cupy

        self.cupy = cupy
        self.targets = targets
        self.config = config
        self.bad = cupy.zeros(1, dtype=cupy.uint64)  # mismatching words, all checks together
        self.stop = threading.Event()
        self.handoff: list[Block] = []
        self.handoff_lock = threading.Lock()
        self.errors: list[str] = []
        self.tallies: list[Tally] = []
        self.seconds = 0.0

    # -- one thread ---------------------------------------------------------------------------

    def _worker(self, tid: int, deadline: float) -> None:
        import rmm
        from rmm.pylibrmm.stream import Stream

        cupy = self.cupy
        cfg = self.config
        rng = random.Random(cfg.seed * 1009 + tid)
        tally = Tally()
        self.tallies.append(tally)
        streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(cfg.streams)]
        rmm_streams = {s.ptr: Stream(obj=s) for s in streams}
        budget = cfg.ops // cfg.threads if cfg.ops else None
        live: list[Block] = []

        def record_event(stream):
            ev = cupy.cuda.Event(disable_timing=True)
            ev.record(stream)
            return ev

        def allocate():
            target = rng.choice(self.targets)
            words = min(MAX_WORDS, max(MIN_WORDS, int(math.exp(
                rng.uniform(math.log(MIN_WORDS), math.log(MAX_WORDS))))))
            nbytes = 4 * words
            stream = rng.choice(streams)
            buf = None
            if rng.random() < BUFFER_SHARE:
                buf = rmm.DeviceBuffer(size=nbytes, stream=rmm_streams[stream.ptr], mr=target.mr)
                ptr = buf.ptr
                tally.buffers += 1
            else:
                ptr = target.mr.allocate(nbytes, rmm_streams[stream.ptr])
            seed = rng.getrandbits(32)
            h.fill(ptr, nbytes, seed, stream)
            live.append(Block(target, ptr, nbytes, seed, record_event(stream), stream, tid,
                              buf, stream if buf is not None else None))
            tally.allocations += 1
            tally.bytes_allocated += nbytes
            key = target.pool_handle
            tally.per_pool_allocations[key] = tally.per_pool_allocations.get(key, 0) + 1

        def verify_on(block: Block, stream) -> None:
            stream.wait_event(block.event)
            h.check(block.ptr, block.nbytes, block.seed, self.bad, stream)
            tally.bytes_checked += block.nbytes

        def rewrite():
            block = rng.choice(live)
            stream = rng.choice(streams)
            verify_on(block, stream)
            block.seed = rng.getrandbits(32)
            h.fill(block.ptr, block.nbytes, block.seed, stream)
            block.event, block.stream = record_event(stream), stream
            tally.rewrites += 1

        def free(block: Block) -> None:
            stream = rng.choice(streams)
            verify_on(block, stream)
            if (block.target.host_accessible and block.nbytes <= HOST_CHECK_MAX
                    and rng.random() < 0.25):
                # The host may touch the block only once the stream reached it: wait first.
                record_event(stream).synchronize()
                words = block.nbytes // 4
                got = h.host_words(block.ptr, words)
                tally.host_mismatches += int((got != h.expected_words(words, block.seed)).sum())
                tally.host_bytes_checked += block.nbytes
                tally.bytes_checked += block.nbytes
            if stream is not block.stream:
                tally.cross_stream_frees += 1
            if block.owner != tid:
                tally.cross_thread_frees += 1
            if block.buf is not None:
                # A DeviceBuffer frees on the stream it was made on: order that after the check.
                block.buf_stream.wait_event(record_event(stream))
                block.buf = None  # last reference: cudaFreeAsync on buf_stream
            else:
                block.target.mr.deallocate(block.ptr, block.nbytes, rmm_streams[stream.ptr])
            tally.frees += 1

        try:
            while not self.stop.is_set():
                if budget is not None and tally.ops >= budget:
                    break
                if time.monotonic() >= deadline:
                    break
                tally.ops += 1
                r = rng.random()
                if not live or (len(live) < LIVE_PER_THREAD and r < 0.45):
                    allocate()
                elif r < 0.65:
                    rewrite()
                elif r < 0.72:
                    with self.handoff_lock:
                        if len(self.handoff) < HANDOFF_CAP:
                            self.handoff.append(live.pop(rng.randrange(len(live))))
                            continue
                    free(live.pop(rng.randrange(len(live))))
                else:
                    taken = None
                    if rng.random() < 0.4:
                        with self.handoff_lock:
                            if self.handoff:
                                taken = self.handoff.pop(rng.randrange(len(self.handoff)))
                    free(taken if taken is not None else live.pop(rng.randrange(len(live))))
            while live:
                free(live.pop())
        except BaseException:
            self.errors.append(f"thread {tid}:\n{traceback.format_exc()}")
            self.stop.set()
            # Best effort: the error is reported; the blocks are still freed in order.
            for block in live:
                try:
                    free(block)
                except BaseException:
                    pass
        finally:
            for s in streams:
                s.synchronize()

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> Tally:
        cupy = self.cupy
        cfg = self.config
        pools = {t.pool_handle: t.mr.pool for t in self.targets}
        gc.collect()
        cupy.cuda.runtime.deviceSynchronize()
        baseline = {k: p.attributes.used_mem_current for k, p in pools.items()}
        for p in pools.values():
            p.reset_peaks()
        start = time.monotonic()
        deadline = start + cfg.seconds
        threads = [threading.Thread(target=self._worker, args=(tid, deadline),
                                    name=f"stress-{tid}") for tid in range(cfg.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Blocks handed off and never taken: free them here, after their last work.
        from rmm.pylibrmm.stream import Stream

        main = cupy.cuda.Stream(non_blocking=True)
        rmain = Stream(obj=main)
        leftover_bytes = 0
        for block in self.handoff:
            main.wait_event(block.event)
            h.check(block.ptr, block.nbytes, block.seed, self.bad, main)
            leftover_bytes += block.nbytes
            if block.buf is not None:
                ev = cupy.cuda.Event(disable_timing=True)
                ev.record(main)
                block.buf_stream.wait_event(ev)
                block.buf = None
            else:
                block.target.mr.deallocate(block.ptr, block.nbytes, rmain)
        leftovers = len(self.handoff)
        self.handoff.clear()
        cupy.cuda.runtime.deviceSynchronize()
        self.seconds = time.monotonic() - start

        total = Tally()
        for t in self.tallies:
            total.add(t)
        total.frees += leftovers
        total.bytes_checked += leftover_bytes
        mismatches = int(self.bad.get()[0])

        assert not self.errors, "stress threads failed:\n" + "\n".join(self.errors)
        assert mismatches == 0, f"{mismatches} corrupted words found by the check kernels"
        assert total.host_mismatches == 0, (
            f"{total.host_mismatches} corrupted words found by the host")
        assert total.allocations > 0 and total.frees == total.allocations, (
            f"{total.allocations} allocations, {total.frees} frees")
        # A front cache (ASYNCMR_TEST_CACHE) holds freed blocks as used: give them back first.
        for t in self.targets:
            t.mr.release_cache()
        # Not under memcheck, which holds freed blocks back (see h.UNDER_SANITIZER); the
        # frees == allocations check above still holds there.
        for key, pool in pools.items() if not h.UNDER_SANITIZER else ():
            attrs = pool.attributes
            assert attrs.used_mem_current == baseline[key], (
                f"pool {key:#x}: used_mem_current {attrs.used_mem_current} after the run, "
                f"{baseline[key]} before: memory lost or freed twice")
            if total.per_pool_allocations.get(key):
                # The blocks really came from this pool.
                assert attrs.used_mem_high > baseline[key]
        return total


def figures_line(label: str, total: Tally, seconds: float, config: Config, corruption=0) -> str:
    return (f"{label}: operations={total.ops} allocations={total.allocations} "
            f"(DeviceBuffer {total.buffers}) rewrites={total.rewrites} "
            f"cross-stream frees={total.cross_stream_frees} "
            f"cross-thread frees={total.cross_thread_frees} "
            f"bytes allocated={total.bytes_allocated} bytes checked={total.bytes_checked} "
            f"(host {total.host_bytes_checked}) duration={seconds:.1f}s "
            f"threads={config.threads} streams/thread={config.streams} seed={config.seed} "
            f"corruption={corruption}")


CASES = [(kind, pool) for kind in h.KINDS for pool in h.POOL_CHOICES]


@pytest.mark.parametrize("kind, pool", CASES, ids=[f"{k}-{p}" for k, p in CASES])
def test_stress_one_resource(gpu, kernels, kind, pool):
    config = Config.from_env(soak=False)
    target = Target(f"{kind}-{pool}", h.make_resource(kind, pool), h.HOST_ACCESSIBLE[kind])
    stress = Stress([target], config)
    total = stress.run()
    h.count("stress (short): operations", total.ops)
    h.count("stress (short): bytes checked", total.bytes_checked)
    h.record(f"stress {kind}-{pool}", figures_line(f"stress {kind}-{pool}", total,
                                                    stress.seconds, config))


@pytest.mark.soak
@pytest.mark.skipif(os.environ.get("ASYNCMR_SOAK") != "1",
                    reason="not applicable: soak run, set ASYNCMR_SOAK=1 (duration: ASYNCMR_STRESS_SECONDS)")
def test_soak_every_resource_at_once(gpu, kernels):
    config = Config.from_env(soak=True)
    targets = [Target(f"{kind}-{pool}", h.make_resource(kind, pool), h.HOST_ACCESSIBLE[kind])
               for kind, pool in CASES]
    stress = Stress(targets, config)
    total = stress.run()
    line = figures_line(f"soak ({len(targets)} resources at once)", total, stress.seconds, config)
    h.record("soak", line)
    print("\n" + line)
