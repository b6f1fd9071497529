# SPDX-License-Identifier: Apache-2.0
"""The bad-input catalogue: what a careless caller does, one table row each.

Every row states the exception it must raise and a message that names the problem. On a GPU
each row also proves that nothing else happened: the state of the shared pools (every
attribute except the usage counters, device 0's access, which pool is current) is the same
before and after, with their release thresholds first set to 0 as in a fresh process (the
state in which the resources' threshold policy fires); and the CUDA context still works
afterwards (an allocation and a kernel succeed).

Rows marked cpu raise before any CUDA call and also run on machines without a GPU; the others
skip there, saying why.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import rmm
from cuda.bindings import driver as cu_driver
from cuda.bindings import runtime as cu_runtime

import asyncmr
from asyncmr import (
    AsyncDeviceMR,
    AsyncManagedMR,
    AsyncPinnedMR,
    CUDAError,
    Location,
    MemPool,
    PoolClosedError,
    UnsupportedError,
)

import reliability_helpers as h

MiB = h.MiB
DEV0 = Location.device(0)
HOST = Location.host()
TOO_MANY = 4096  # a device id no machine has, and a NUMA node no Linux kernel allows
HUGE = 1 << 50  # 1 PiB of device memory


@dataclass(frozen=True)
class Case:
    id: str
    call: Callable  # call(ctx) makes the bad call
    raises: type | tuple | None  # None: the call must succeed (closing twice, zero bytes)
    match: str | None = None
    cpu: bool = False  # raises before any CUDA call: runs without a GPU too
    setup: Callable | None = None  # setup(ctx), before the "before" state is taken
    post: Callable | None = None  # post(ctx, result) after the state check
    xfail: str | None = None  # a known library bug, with file, line and fix in the reason
    api_error: bool = False  # a CUDA call fails on purpose (sanitizers report it)
    only_if: Callable | None = None  # only_if() -> reason to skip, or None


# ---- setups ------------------------------------------------------------------------------------


def closed_pool(loc, atype):
    def setup(ctx):
        ctx.pool = MemPool.create(loc, atype)
        ctx.handle = ctx.pool.handle
        ctx.pool.close()
    return setup


def owned_device_mr(ctx):
    ctx.mr = AsyncDeviceMR(pool="new")


def default_pool(loc, atype):
    def setup(ctx):
        ctx.pool = MemPool.default(loc, atype)
    return setup


def bounded_pool(loc, atype):
    """An owned pool of at most 64 MiB, in ``ctx.pool``."""
    def setup(ctx):
        ctx.pool = MemPool.create(loc, atype, max_size=64 * MiB, release_threshold=0)
    return setup


def own_device_still_rw(ctx, _):
    """The refused call left the pool's own device its read-write access, and the pool works."""
    assert ctx.pool.access(0) == "rw", f"device 0's access became {ctx.pool.access(0)!r}"
    if ctx.pool.owned:
        ctx.pool.close()


def resource(make):
    def setup(ctx):
        ctx.mr = make()
    return setup


def closed_resource(make):
    def setup(ctx):
        ctx.mr = make()
        ctx.mr.pool.close()
    return setup


def bounded(kind, loc, atype):
    """A resource on an owned pool of at most 64 MiB: never ask the driver for more managed or
    pinned memory than the machine has."""
    def setup(ctx):
        pool = MemPool.create(loc, atype, max_size=64 * MiB, release_threshold=0)
        ctx.mr = h.make_resource(kind, pool)
    return setup


class Capture:
    """A global- or thread-local-mode capture around ``body(rmm_stream)`` that always ends it,
    then instantiates and runs the graph; ``ended``/``ran`` say whether that worked."""

    def __init__(self, mode="global"):
        import cupy
        from cuda.bindings import runtime as rt
        from rmm.pylibrmm.stream import Stream

        self.rt, self.cupy = rt, cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.rmm_stream = Stream(obj=self.stream)
        self.counter = cupy.zeros(1, dtype=cupy.uint64)
        self.mode = {"global": rt.cudaStreamCaptureMode.cudaStreamCaptureModeGlobal,
                     "thread_local": rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal}[
                         mode]
        self.ended = self.ran = None

    def run(self, body):
        rt, ok = self.rt, self.rt.cudaError_t.cudaSuccess
        err, = rt.cudaStreamBeginCapture(self.stream.ptr, self.mode)
        assert err == ok, err
        try:
            h.bump(self.counter, self.stream)  # work before the refused call
            return body(self.rmm_stream)
        finally:
            err, graph = rt.cudaStreamEndCapture(self.stream.ptr)
            self.ended = err
            if err == ok:
                err, gexec = rt.cudaGraphInstantiate(graph, 0)
                if err == ok:
                    err, = rt.cudaGraphLaunch(gexec, self.stream.ptr)
                    if err == ok:
                        err, = rt.cudaStreamSynchronize(self.stream.ptr)
                    rt.cudaGraphExecDestroy(gexec)
                rt.cudaGraphDestroy(graph)
                self.ran = err

    def assert_valid_and_ran(self):
        ok = self.rt.cudaError_t.cudaSuccess
        assert self.ended == ok, f"the capture was invalidated: {self.ended}"
        assert self.ran == ok, f"the captured graph did not run: {self.ran}"
        assert int(self.counter.get()[0]) == 1, "the captured work did not run"


def capture_with(make, mode="global"):
    def setup(ctx):
        ctx.mr = make()
        ctx.capture = Capture(mode)
    return setup


def capture_post(ctx, _):
    ctx.capture.assert_valid_and_ran()


def closed_view(loc, atype):
    def setup(ctx):
        ctx.pool = MemPool.default(loc, atype)
        ctx.pool.close()  # a view: stops being usable here, the pool itself lives on
    return setup


def with_then_close(ctx):
    with MemPool.create(HOST, "pinned") as pool:
        pass
    pool.close()  # already closed by the with block
    return pool.closed


def close_twice(ctx):
    ctx.pool.close()
    ctx.pool.close()
    return ctx.pool.closed


def is_closed(ctx, result):
    assert result, "close() did not close"


def zero_bytes_post(ctx, result):
    assert result == 0, f"allocate(0) returned {result:#x}, not 0 (nullptr)"
    ctx.mr.deallocate(0, 0)


def old_driver():
    return None if asyncmr.driver_version() < 13020 else (
        "this driver answers the CUDA 13.2 attributes and reports adopted pools' locations")


# ---- known library bugs (reasons say where and how to fix) -------------------------------



# ---- the table ---------------------------------------------------------------------------

C = Case
CASES = [
    # -- wrong types -------------------------------------------------------------------------
    C("managed-device-str", lambda c: AsyncManagedMR(device="0"), TypeError,
      r"device must be an int, got str", cpu=True),
    C("device-device-float", lambda c: AsyncDeviceMR(device=0.0), TypeError,
      r"device must be an int, got float", cpu=True),
    C("managed-device-bool", lambda c: AsyncManagedMR(device=True), TypeError,
      r"device must be an int, got bool", cpu=True),
    C("managed-location-str", lambda c: AsyncManagedMR(location="host"), TypeError,
      r"location must be an asyncmr\.Location", cpu=True),
    C("location-unknown-kind", lambda c: AsyncManagedMR(location=Location("moon")), ValueError,
      r"unknown location kind 'moon'", cpu=True),
    C("managed-prefetch-unknown", lambda c: AsyncManagedMR(prefetch="gpu"), ValueError,
      r'prefetch must be None, "device", a device ordinal, "host".*got \'gpu\'', cpu=True),
    C("managed-prefetch-bool", lambda c: AsyncManagedMR(prefetch=True), TypeError,
      r"prefetch must be None.*got True \(bool\)", cpu=True),
    C("managed-prefetch-negative", lambda c: AsyncManagedMR(prefetch=-1), ValueError,
      r"prefetch must be in \[0, 2\*\*31\), got -1", cpu=True),
    C("managed-prefetch-no-such-device", lambda c: AsyncManagedMR(prefetch=4096), ValueError,
      r"4096"),
    C("managed-prefetch-nowhere", lambda c: AsyncManagedMR(prefetch=Location.none()),
      ValueError, r"prefetch must be a device or the host, got none$", cpu=True),
    C("device-prefetch", lambda c: AsyncDeviceMR(prefetch="device"), TypeError,
      r"prefetch", cpu=True),
    C("managed-discard-int", lambda c: AsyncManagedMR(prefetch="device", discard=1), TypeError,
      r"discard must be a bool, got int", cpu=True),
    C("managed-discard-numpy-bool",
      lambda c: AsyncManagedMR(prefetch="device", discard=np.True_), TypeError,
      r"discard must be a bool, got numpy\.bool", cpu=True),
    C("managed-discard-without-prefetch", lambda c: AsyncManagedMR(discard=True), ValueError,
      r"discard needs a prefetch target", cpu=True),
    C("pinned-discard", lambda c: AsyncPinnedMR(discard=True), TypeError, r"discard", cpu=True),
    C("advise-unknown", lambda c: asyncmr.advise((4096, 16), "prefer_gpu"), ValueError,
      r"advice must be one of \('set_read_mostly'", cpu=True),
    C("advise-bad-target", lambda c: asyncmr.advise((4096, 16), "set_accessed_by", to="gpu"),
      ValueError, r'to must be "device", a device ordinal, "host"', cpu=True),
    C("advise-null-range", lambda c: asyncmr.advise((0, 16), "set_read_mostly"), ValueError,
      r"null pointer of 16 bytes", cpu=True),
    C("location-device-without-id", lambda c: MemPool.default(Location("device"), "device"),
      TypeError, r"device id must be an int, got NoneType", cpu=True),
    C("threshold-float", lambda c: AsyncPinnedMR(release_threshold=1.5), TypeError,
      r"release_threshold must be an int number of bytes, got float", cpu=True),
    C("threshold-str", lambda c: AsyncDeviceMR(release_threshold="1GiB"), TypeError,
      r"release_threshold must be an int number of bytes, got str", cpu=True),
    C("pool-none", lambda c: AsyncDeviceMR(pool=None), TypeError,
      r"pool must be 'default', 'current', 'new'.*got NoneType", cpu=True),
    C("pool-float", lambda c: AsyncManagedMR(pool=1.0), TypeError,
      r"pool must be .*got float", cpu=True),
    C("accessible-from-float", lambda c: AsyncPinnedMR(accessible_from=0.5), TypeError,
      r"accessible_from must be 'all', a device id or a list of ids, got float", cpu=True),
    C("accessible-from-str-item", lambda c: AsyncManagedMR(accessible_from=[0, "1"]), TypeError,
      r"accessible_from device must be an int, got str", cpu=True),
    C("numa-node-str", lambda c: AsyncPinnedMR(numa_node="0"), TypeError,
      r"must be an int, got str", cpu=True),
    C("allocation-type-int", lambda c: MemPool.current(DEV0, 1), TypeError,
      r"allocation_type must be 'device', 'pinned', 'managed' or an AllocationType, got int",
      cpu=True),
    C("mempool-location-str", lambda c: MemPool.default("device", "device"), TypeError,
      r"location must be an asyncmr\.Location", cpu=True),
    C("mempool-constructor", lambda c: MemPool(), TypeError, r"use MemPool\.default\(\)",
      cpu=True),
    C("create-max-size-none", lambda c: MemPool.create(DEV0, "device", max_size=None), TypeError,
      r"max_size must be an int number of bytes, got NoneType", cpu=True),
    C("from-handle-float", lambda c: MemPool.from_handle(1.5), TypeError,
      r"pool handle must be an int", cpu=True),
    C("from-handle-str", lambda c: MemPool.from_handle("0x7f00"), TypeError,
      r"pool handle must be an int", cpu=True),
    # cuda.bindings' handles convert to int: a stream or an event would be read as a pool.
    C("from-handle-cuda-bindings-stream",
      lambda c: MemPool.from_handle(cu_driver.CUstream(0x7F0000001000)), TypeError,
      r"a cuda\.bindings\.driver\.CUstream is not a memory pool", cpu=True),
    C("from-handle-cuda-bindings-event",
      lambda c: MemPool.from_handle(cu_runtime.cudaEvent_t(0x7F0000001000)), TypeError,
      r"a cuda\.bindings\.runtime\.cudaEvent_t is not a memory pool", cpu=True),
    C("pool-cuda-bindings-stream",
      lambda c: AsyncDeviceMR(pool=cu_runtime.cudaStream_t(0x7F0000001000)), TypeError,
      r"a cuda\.bindings\.runtime\.cudaStream_t is not a memory pool", cpu=True),
    C("pinned-device-keyword", lambda c: AsyncPinnedMR(device=0), TypeError,
      r"unexpected keyword argument 'device'", cpu=True),
    C("device-location-keyword", lambda c: AsyncDeviceMR(location=DEV0), TypeError,
      r"unexpected keyword argument 'location'", cpu=True),
    C("pool-positional", lambda c: AsyncDeviceMR(0, "new"), TypeError, r"positional argument",
      cpu=True),
    C("allocate-size-float", lambda c: c.mr.allocate(1.5), TypeError,
      r"nbytes must be an int, got float", setup=owned_device_mr),
    C("allocate-size-bool", lambda c: c.mr.allocate(True), TypeError,
      r"nbytes must be an int, got bool", setup=owned_device_mr),
    C("allocate-stream-int", lambda c: c.mr.allocate(256, 5), TypeError, r"stream",
      setup=owned_device_mr),
    C("trim-str", lambda c: c.pool.trim_to("all"), TypeError,
      r"min_bytes_to_keep must be an int number of bytes, got str",
      setup=default_pool(DEV0, "device")),
    C("access-none", lambda c: c.pool.access(None), TypeError, r"device must be an int",
      setup=default_pool(HOST, "pinned")),
    C("set-access-mode-int", lambda c: c.pool.set_access(0, 2), TypeError,
      r"access mode must be a str, got int", setup=default_pool(HOST, "pinned")),
    C("attribute-threshold-none",
      lambda c: setattr(c.pool.attributes, "release_threshold", None), TypeError,
      r"release_threshold must be an int number of bytes, got NoneType",
      setup=default_pool(DEV0, "device")),
    C("attribute-bool-is-two",
      lambda c: setattr(c.pool.attributes, "reuse_allow_opportunistic", 2), TypeError,
      r"reuse_allow_opportunistic must be a bool, got 2", setup=default_pool(DEV0, "managed")),

    # -- negative, zero and oversized values ------------------------------------------------
    C("device-negative", lambda c: AsyncManagedMR(device=-1), ValueError,
      r"device must be in \[0, 2\*\*31\), got -1", cpu=True),
    C("location-device-negative", lambda c: Location.device(-1), ValueError,
      r"device ordinal must be in \[0, 2\*\*31\), got -1", cpu=True),
    C("location-raw-negative-id", lambda c: AsyncManagedMR(location=Location("device", -1)),
      ValueError, r"device id must be in \[0, 2\*\*31\), got -1", cpu=True),
    C("numa-node-negative", lambda c: AsyncPinnedMR(numa_node=-1), ValueError,
      r"in \[0, 2\*\*31\), got -1", cpu=True),
    C("numa-node-negative-names-numa", lambda c: AsyncPinnedMR(numa_node=-1), ValueError,
      r"(?i)numa", cpu=True),
    C("location-numa-negative", lambda c: Location.host_numa(-3), ValueError,
      r"NUMA node must be in \[0, 2\*\*31\), got -3", cpu=True),
    C("threshold-negative", lambda c: AsyncDeviceMR(release_threshold=-1), ValueError,
      r"release_threshold must be in \[0, 2\*\*64\), got -1", cpu=True),
    C("threshold-oversized", lambda c: AsyncManagedMR(release_threshold=2**64), ValueError,
      r"release_threshold must be in \[0, 2\*\*64\)", cpu=True),
    C("reserve-negative", lambda c: AsyncPinnedMR(reserve=-1), ValueError,
      r"reserve must be in \[0, 2\*\*64\), got -1", cpu=True),
    C("reserve-above-the-threshold-asked",
      lambda c: AsyncDeviceMR(release_threshold=MiB, reserve=64 * MiB), ValueError,
      r"reserve \(67108864 bytes\) is above the pool's release threshold \(1048576 bytes\)"),
    C("reserve-more-than-the-device-has", lambda c: AsyncDeviceMR(reserve=HUGE), MemoryError,
      r"out of memory allocating 1125899906842624 bytes of device memory", api_error=True),
    C("create-max-size-negative", lambda c: MemPool.create(DEV0, "device", max_size=-1),
      ValueError, r"max_size must be in \[0, 2\*\*64\), got -1", cpu=True),
    C("create-managed-max-size", lambda c: MemPool.create(DEV0, "managed", max_size=64 * MiB),
      ValueError, r"managed pools cannot be bounded", cpu=True),
    C("create-threshold-oversized",
      lambda c: MemPool.create(HOST, "pinned", release_threshold=2**64), ValueError,
      r"release_threshold must be in", cpu=True),
    C("create-export-types-negative",
      lambda c: MemPool.create(DEV0, "device", export_handle_types=-1), ValueError,
      r"export_handle_types must be in \[0, 2\*\*31\)", cpu=True),
    C("pool-handle-zero", lambda c: AsyncPinnedMR(pool=0), ValueError,
      r"pool handle must be a non-zero 64-bit address, got 0", cpu=True),
    C("pool-handle-negative", lambda c: AsyncDeviceMR(pool=-1), ValueError,
      r"pool handle must be a non-zero 64-bit address, got -1", cpu=True),
    C("pool-handle-oversized", lambda c: AsyncDeviceMR(pool=2**64), ValueError,
      r"pool handle must be a non-zero 64-bit address", cpu=True),
    C("from-handle-zero", lambda c: MemPool.from_handle(0), ValueError,
      r"pool handle must be a non-zero", cpu=True),
    C("accessible-from-negative", lambda c: AsyncPinnedMR(accessible_from=[-1]), ValueError,
      r"accessible_from device must be in \[0, 2\*\*31\), got -1", cpu=True),
    C("device-beyond-int32", lambda c: AsyncDeviceMR(device=2**31), ValueError,
      r"device must be in \[0, 2\*\*31\), got 2147483648", cpu=True),
    C("numa-node-beyond-int32", lambda c: AsyncPinnedMR(numa_node=2**40), ValueError,
      r"numa_node must be in \[0, 2\*\*31\)", cpu=True),
    C("trim-negative", lambda c: c.pool.trim_to(-1), ValueError,
      r"min_bytes_to_keep must be in \[0, 2\*\*64\), got -1", setup=default_pool(DEV0, "device")),
    C("attribute-threshold-negative",
      lambda c: setattr(c.pool.attributes, "release_threshold", -1), ValueError,
      r"release_threshold must be in", setup=default_pool(HOST, "pinned")),
    C("allocate-size-negative", lambda c: c.mr.allocate(-1), ValueError,
      r"nbytes must be in \[0, 2\*\*64\), got -1", setup=owned_device_mr),
    C("allocate-size-beyond-size-t", lambda c: c.mr.allocate(2**64), ValueError,
      r"nbytes must be in \[0, 2\*\*64\), got 18446744073709551616", setup=owned_device_mr),
    C("device-buffer-size-negative",
      lambda c: rmm.DeviceBuffer(size=-1, mr=c.mr), OverflowError, r"negative",
      setup=owned_device_mr),
    C("allocate-zero-bytes", lambda c: c.mr.allocate(0), None,
      setup=resource(AsyncPinnedMR), post=zero_bytes_post),

    # -- unknown names --------------------------------------------------------------------------
    C("pool-unknown-name", lambda c: AsyncDeviceMR(pool="shared"), ValueError,
      r"pool must be 'default', 'current', 'new'.*got 'shared'", cpu=True),
    C("pool-name-case", lambda c: AsyncManagedMR(pool="Default"), ValueError,
      r"got 'Default'", cpu=True),
    C("allocation-type-unknown", lambda c: MemPool.default(DEV0, "unified"), ValueError,
      r"unknown allocation_type 'unified'", cpu=True),
    C("accessible-from-unknown-name", lambda c: AsyncPinnedMR(accessible_from="everyone"),
      ValueError, r"accessible_from must be 'all'", cpu=True),
    C("access-mode-unknown", lambda c: c.pool.set_access(0, "write"), ValueError,
      r"access mode must be one of", setup=default_pool(HOST, "pinned")),
    C("attribute-misspelt",
      lambda c: setattr(c.pool.attributes, "release_treshold", 0), AttributeError,
      r"release_treshold", setup=default_pool(DEV0, "device")),
    C("scoped-unknown-attribute", lambda c: c.pool.attributes.scoped(foo=1).__enter__(),
      AttributeError, r"unknown pool attribute 'foo'", setup=default_pool(DEV0, "device")),

    # -- impossible combinations --------------------------------------------------------
    C("device-memory-on-host", lambda c: MemPool.default(HOST, "device"), ValueError,
      r"device memory at host is not possible", cpu=True),
    C("device-memory-nowhere", lambda c: MemPool.create(Location.none(), "device"), ValueError,
      r"device memory lives on a device", cpu=True),
    C("pinned-memory-on-device", lambda c: MemPool.current(DEV0, "pinned"), ValueError,
      r"pinned memory lives on the host", cpu=True),
    C("managed-on-numa-node", lambda c: MemPool.default(Location.host_numa(0), "managed"),
      ValueError, r"managed pools are located on a device, the host, or nowhere", cpu=True),
    C("create-numa-current", lambda c: MemPool.create(Location.host_numa_current(), "pinned"),
      ValueError, r"does not accept host_numa_current", cpu=True),
    C("managed-resource-on-numa", lambda c: AsyncManagedMR(location=Location.host_numa(0)),
      ValueError, r"managed memory at host_numa\(0\) is not possible"),
    C("from-handle-impossible-location",
      lambda c: MemPool.from_handle(c.pool.handle, location=HOST, allocation_type="device"),
      ValueError, r"device memory lives on a device", setup=default_pool(DEV0, "device")),
    C("device-mr-adopts-managed-pool", lambda c: AsyncDeviceMR(pool=c.pool), ValueError,
      r"AsyncDeviceMR needs a device pool; this pool hands out managed memory",
      setup=default_pool(DEV0, "managed")),
    C("pinned-mr-adopts-device-pool", lambda c: AsyncPinnedMR(pool=c.pool), ValueError,
      r"AsyncPinnedMR needs a pinned pool; this pool hands out device memory",
      setup=default_pool(DEV0, "device")),
    C("managed-mr-adopts-pinned-pool", lambda c: AsyncManagedMR(pool=c.pool), ValueError,
      r"AsyncManagedMR needs a managed pool; this pool hands out pinned memory",
      setup=default_pool(HOST, "pinned")),

    # -- device ids and NUMA nodes out of range -----------------------------------------
    C("managed-device-out-of-range", lambda c: AsyncManagedMR(device=TOO_MANY), ValueError,
      rf"device {TOO_MANY} does not exist; visible devices are 0\.\."),
    C("device-device-out-of-range", lambda c: AsyncDeviceMR(TOO_MANY), ValueError,
      rf"device {TOO_MANY} does not exist"),
    C("device-out-of-range-new-pool", lambda c: AsyncDeviceMR(TOO_MANY, pool="new"), ValueError,
      rf"device {TOO_MANY} does not exist"),
    C("managed-location-out-of-range", lambda c: AsyncManagedMR(location=Location.device(TOO_MANY)),
      ValueError, rf"device {TOO_MANY} does not exist"),
    C("mempool-default-out-of-range",
      lambda c: MemPool.default(Location.device(TOO_MANY), "device"), ValueError,
      rf"device {TOO_MANY} does not exist"),
    C("mempool-create-out-of-range", lambda c: MemPool.create(Location.device(TOO_MANY), "managed"),
      ValueError, rf"device {TOO_MANY} does not exist"),
    C("pinned-accessible-from-out-of-range-new-pool",
      lambda c: AsyncPinnedMR(pool="new", accessible_from=[0, TOO_MANY]), ValueError,
      rf"device {TOO_MANY} does not exist"),
    C("pinned-accessible-from-out-of-range",
      lambda c: AsyncPinnedMR(accessible_from=[TOO_MANY]), ValueError,
      rf"device {TOO_MANY} does not exist"),
    C("managed-host-accessible-from-out-of-range",
      lambda c: AsyncManagedMR(location=HOST, accessible_from=TOO_MANY), ValueError,
      rf"device {TOO_MANY} does not exist"),
    C("set-access-out-of-range", lambda c: c.pool.set_access([0, TOO_MANY]), ValueError,
      rf"device {TOO_MANY} does not exist", setup=default_pool(HOST, "pinned")),
    # The device a device pool lives on always has read-write access to it; less is refused
    # before the driver is asked, naming the device (the driver said "invalid device ordinal":
    # probe-access), and so is a device named twice (the driver took the last).
    C("set-access-own-device-none", lambda c: c.pool.set_access(0, "none"), ValueError,
      r"set_access: device 0 holds this pool's memory and always has read-write access to it",
      setup=default_pool(DEV0, "device"), post=own_device_still_rw),
    C("set-access-own-device-read-new-pool", lambda c: c.pool.set_access([0], "r"), ValueError,
      r"set_access: device 0 holds this pool's memory and always has read-write access to it",
      setup=bounded_pool(DEV0, "device"), post=own_device_still_rw),
    C("set-access-all-none-device-pool", lambda c: c.pool.set_access("all", "none"), ValueError,
      r"set_access: device 0 holds this pool's memory",
      setup=default_pool(DEV0, "device"), post=own_device_still_rw),
    C("set-access-twice", lambda c: c.pool.set_access([0, 0]), ValueError,
      r"devices: device 0 is named twice", setup=default_pool(HOST, "pinned")),
    C("access-out-of-range", lambda c: c.pool.access(TOO_MANY), ValueError,
      rf"device {TOO_MANY} does not exist", setup=default_pool(DEV0, "device")),
    C("set-access-negative", lambda c: c.pool.set_access(-1), ValueError,
      r"set_access: device must be in \[0, 2\*\*31\), got -1",
      setup=default_pool(HOST, "pinned")),
    C("access-negative", lambda c: c.pool.access(-1), ValueError,
      r"access: device must be in \[0, 2\*\*31\), got -1", setup=default_pool(DEV0, "device")),
    # A NUMA node the host lacks is refused before the driver, which would say only
    # cudaErrorInvalidValue.
    C("numa-node-out-of-range", lambda c: AsyncPinnedMR(numa_node=TOO_MANY), ValueError,
      r"numa_node: the host has no NUMA node 4096 \(its nodes: ", cpu=True),
    C("numa-node-out-of-range-new-pool", lambda c: AsyncPinnedMR(pool="new", numa_node=TOO_MANY),
      ValueError, r"numa_node: the host has no NUMA node 4096 \(its nodes: ", cpu=True),
    C("mempool-create-numa-out-of-range",
      lambda c: MemPool.create(Location.host_numa(TOO_MANY), "pinned"), ValueError,
      r"pinned memory at host_numa\(4096\): the host has no NUMA node 4096 \(its nodes: ",
      cpu=True),
    C("mempool-default-numa-out-of-range",
      lambda c: MemPool.default(Location.host_numa(TOO_MANY), "pinned"), ValueError,
      r"pinned memory at host_numa\(4096\): the host has no NUMA node 4096", cpu=True),
    C("prefetch-to-numa-out-of-range",
      lambda c: asyncmr.prefetch((4096, 16), Location.host_numa(TOO_MANY)), ValueError,
      r"a prefetch to host_numa\(4096\): the host has no NUMA node 4096 \(its nodes: ",
      cpu=True),
    C("managed-prefetch-numa-out-of-range",
      lambda c: AsyncManagedMR(prefetch=Location.host_numa(TOO_MANY)), ValueError,
      r"a prefetch to host_numa\(4096\): the host has no NUMA node 4096", cpu=True),

    # -- read-only attributes and watermarks --------------------------------------------
    C("set-used-mem-current", lambda c: setattr(c.pool.attributes, "used_mem_current", 0),
      AttributeError, r"pool attribute 'used_mem_current' is read-only",
      setup=default_pool(DEV0, "device")),
    C("set-reserved-mem-current",
      lambda c: setattr(c.pool.attributes, "reserved_mem_current", 0), AttributeError,
      r"'reserved_mem_current' is read-only", setup=default_pool(HOST, "pinned")),
    C("set-allocation-type", lambda c: setattr(c.pool.attributes, "allocation_type", "managed"),
      AttributeError, r"'allocation_type' is read-only", setup=default_pool(DEV0, "managed")),
    C("set-max-pool-size", lambda c: setattr(c.mr.attributes, "max_pool_size", 0),
      AttributeError, r"'max_pool_size' is read-only", setup=owned_device_mr),
    C("scoped-read-only", lambda c: c.pool.attributes.scoped(used_mem_current=0).__enter__(),
      AttributeError, r"cannot be scoped", setup=default_pool(DEV0, "device")),
    C("resource-pool-not-writable", lambda c: setattr(c.mr, "pool", None), AttributeError,
      r"pool", setup=owned_device_mr),
    C("watermark-non-zero", lambda c: setattr(c.pool.attributes, "used_mem_high", 1), ValueError,
      r"'used_mem_high' is a high-water mark: it can only be reset, by setting 0 \(got 1\)",
      setup=default_pool(DEV0, "device")),
    C("watermark-true", lambda c: setattr(c.pool.attributes, "reserved_mem_high", True),
      TypeError, r"must be the int 0 \(a high-water mark can only be reset\), got bool",
      setup=default_pool(HOST, "pinned")),
    C("watermark-huge", lambda c: setattr(c.mr.attributes, "reserved_mem_high", 2**63),
      ValueError, r"high-water mark", setup=owned_device_mr),
    C("cuda-13-2-attribute-on-13-0-driver", lambda c: c.pool.attributes.max_pool_size,
      UnsupportedError, r"'max_pool_size' needs a CUDA driver >= 13\.2",
      setup=default_pool(DEV0, "device"), only_if=old_driver),
    C("make-current-adopted-handle", lambda c: MemPool.from_handle(c.pool.handle).make_current(),
      UnsupportedError, r"make_current needs the pool's location and allocation type",
      setup=default_pool(DEV0, "device"), only_if=old_driver),

    # -- closing twice, use after close, destroyed handles ----------------------------
    C("close-owned-twice", close_twice, None, setup=closed_pool(DEV0, "device"), post=is_closed),
    C("close-view-twice", close_twice, None, setup=default_pool(DEV0, "device"), post=is_closed),
    C("close-resource-pool-twice", lambda c: (c.mr.pool.close(), c.mr.pool.close()), None,
      setup=resource(lambda: AsyncPinnedMR(pool="new"))),
    C("with-then-close", with_then_close, None, post=is_closed),
    C("closed-get-attribute", lambda c: c.pool.attributes.release_threshold, PoolClosedError,
      r"closed", setup=closed_pool(DEV0, "device")),
    C("closed-set-attribute", lambda c: setattr(c.pool.attributes, "release_threshold", 0),
      PoolClosedError, r"closed", setup=closed_pool(HOST, "pinned")),
    C("closed-as-dict", lambda c: c.pool.attributes.as_dict(), PoolClosedError, r"closed",
      setup=closed_pool(DEV0, "managed")),
    C("closed-trim", lambda c: c.pool.trim_to(), PoolClosedError, r"closed",
      setup=closed_pool(DEV0, "device")),
    C("closed-reset-peak", lambda c: c.pool.reset_peaks(), PoolClosedError, r"closed",
      setup=closed_pool(DEV0, "device")),
    C("closed-access", lambda c: c.pool.access(0), PoolClosedError, r"closed",
      setup=closed_pool(HOST, "pinned")),
    C("closed-set-access", lambda c: c.pool.set_access(0), PoolClosedError, r"closed",
      setup=closed_pool(HOST, "pinned")),
    C("closed-make-current", lambda c: c.pool.make_current(), PoolClosedError, r"closed",
      setup=closed_pool(DEV0, "device")),
    C("closed-as-current", lambda c: c.pool.as_current().__enter__(), PoolClosedError,
      r"closed", setup=closed_pool(DEV0, "managed")),
    C("closed-handle", lambda c: c.pool.handle, PoolClosedError, r"closed",
      setup=closed_pool(DEV0, "device")),
    # The driver dereferences pool handles unchecked: an integer with nothing mapped at it
    # would crash the process at the first pool call, so it is refused before that call.
    C("from-handle-unmapped-address", lambda c: MemPool.from_handle(0x1000), ValueError,
      r"0x1000 is not a memory pool handle \(nothing is mapped there\)"),
    C("resource-over-unmapped-handle", lambda c: AsyncDeviceMR(pool=0x1000), ValueError,
      r"0x1000 is not a memory pool handle"),
    C("pinned-resource-over-unmapped-handle", lambda c: AsyncPinnedMR(pool=0x2000), ValueError,
      r"0x2000 is not a memory pool handle"),
    C("destroyed-handle-from-closed-mempool", lambda c: MemPool.from_handle(c.pool),
      PoolClosedError, r"closed", setup=closed_pool(DEV0, "device")),
    C("closed-view-of-default-pool", lambda c: c.pool.trim_to(), PoolClosedError, r"closed",
      setup=closed_view(DEV0, "device")),
    C("resource-over-closed-pinned-pool", lambda c: AsyncPinnedMR(pool=c.pool), PoolClosedError,
      r"closed", setup=closed_pool(HOST, "pinned")),
    C("resource-over-closed-device-pool", lambda c: AsyncDeviceMR(pool=c.pool), PoolClosedError,
      r"closed", setup=closed_pool(DEV0, "device")),
    C("allocate-over-closed-device-pool", lambda c: AsyncDeviceMR(pool=c.pool).allocate(256),
      RuntimeError, r"closed", setup=closed_pool(DEV0, "device")),
    C("allocate-after-close", lambda c: c.mr.allocate(256), RuntimeError,
      r"allocating from a memory pool that was closed",
      setup=closed_resource(lambda: AsyncManagedMR(pool="new"))),
    C("allocate-after-close-is-pool-closed-error", lambda c: c.mr.allocate(256), PoolClosedError,
      r"closed", setup=closed_resource(lambda: AsyncDeviceMR(pool="new"))),
    C("device-buffer-after-close",
      lambda c: rmm.DeviceBuffer(size=256, mr=c.mr), RuntimeError, r"closed",
      setup=closed_resource(lambda: AsyncPinnedMR(pool="new"))),
    C("closed-resource-trim", lambda c: c.mr.trim_to(), PoolClosedError, r"closed",
      setup=closed_resource(lambda: AsyncDeviceMR(pool="new"))),
    C("closed-resource-attributes", lambda c: c.mr.attributes.used_mem_current, PoolClosedError,
      r"closed", setup=closed_resource(lambda: AsyncManagedMR(pool="new"))),

    # -- host pools inside a capture: a clear error, the capture stays valid -----------------
    C("pinned-default-alloc-in-global-capture",
      lambda c: c.capture.run(lambda s: c.mr.allocate(4096, s)), RuntimeError,
      r"cannot allocate 4096 bytes of pinned memory at host inside a stream capture",
      setup=capture_with(AsyncPinnedMR), post=capture_post, api_error=True),
    C("pinned-new-alloc-in-thread-local-capture",
      lambda c: c.capture.run(lambda s: c.mr.allocate(4096, s)), RuntimeError,
      r"inside a stream capture.*The capture is still valid",
      setup=capture_with(lambda: AsyncPinnedMR(pool="new"), "thread_local"),
      post=capture_post, api_error=True),
    C("pinned-device-buffer-in-capture",
      lambda c: c.capture.run(
          lambda s: rmm.DeviceBuffer(size=4096, stream=s, mr=c.mr)),
      RuntimeError, r"inside a stream capture", setup=capture_with(AsyncPinnedMR),
      post=capture_post, api_error=True),
    C("managed-host-alloc-in-capture",
      lambda c: c.capture.run(lambda s: c.mr.allocate(4096, s)), RuntimeError,
      r"managed memory at host inside a stream capture",
      setup=capture_with(lambda: AsyncManagedMR(location=HOST)), post=capture_post,
      api_error=True),
    C("managed-nowhere-alloc-in-capture",
      lambda c: c.capture.run(lambda s: c.mr.allocate(4096, s)), RuntimeError,
      r"managed memory at none inside a stream capture",
      setup=capture_with(lambda: AsyncManagedMR(location=Location.none())), post=capture_post,
      api_error=True),
    C("pinned-alloc-in-capture-is-unsupported-error",
      lambda c: c.capture.run(lambda s: c.mr.allocate(4096, s)), UnsupportedError,
      r"inside a stream capture", setup=capture_with(AsyncPinnedMR), post=capture_post,
      api_error=True),

    # -- enormous allocations -----------------------------------------------------------------
    C("device-default-1-PiB", lambda c: c.mr.allocate(HUGE), MemoryError,
      rf"out of memory allocating {HUGE} bytes of device memory at device\(0\)",
      setup=resource(AsyncDeviceMR), api_error=True),
    C("device-buffer-1-PiB", lambda c: rmm.DeviceBuffer(size=HUGE, mr=c.mr),
      MemoryError, r"out of memory", setup=resource(AsyncDeviceMR), api_error=True),
    C("device-new-pool-1-PiB", lambda c: c.mr.allocate(HUGE), MemoryError, r"out of memory",
      setup=owned_device_mr, api_error=True),
    C("managed-pool-max-size", lambda c: MemPool.create(DEV0, "managed", max_size=64 * MiB),
      ValueError, r"managed pools cannot be bounded", api_error=True),
    C("pinned-beyond-pool-max-size", lambda c: c.mr.allocate(128 * MiB), MemoryError,
      r"out of memory allocating 134217728 bytes of pinned memory",
      setup=bounded("pinned", HOST, "pinned"), api_error=True),
]


def _params():
    for case in CASES:
        marks = []
        if not case.cpu:
            marks.append(pytest.mark.gpu)
        if case.api_error:
            marks.append(pytest.mark.cuda_api_error)
        if case.xfail:
            # CPU rows are checked here and must flip when the bug is fixed; GPU rows were
            # written without a GPU to run them on, so an unexpected pass is only reported.
            marks.append(pytest.mark.xfail(reason=case.xfail, strict=case.cpu))
        yield pytest.param(case, id=case.id, marks=marks)


def _run(case: Case, ctx):
    if case.raises is None:
        return case.call(ctx)
    with pytest.raises(case.raises, match=case.match) as info:
        case.call(ctx)
    return info


@pytest.mark.parametrize("case", list(_params()))
def test_bad_input(case: Case, request):
    count, why = h.gpu_count()
    if not count:
        if not case.cpu:
            h.skip_or_fail(f"needs a CUDA device (no CUDA device: {why})")
        _run(case, types.SimpleNamespace())
        h.count("bad-input catalogue: cases passed")
        return
    request.getfixturevalue("kernels")  # also restores the shared pools afterwards (gpu)
    if case.only_if is not None and (reason := case.only_if()):
        h.not_applicable(reason)
    probe = request.getfixturevalue("probe_resource")
    ctx = types.SimpleNamespace()
    if case.setup is not None:
        case.setup(ctx)
    h.sync()
    pools = h.shared_pools()
    with h.fresh_thresholds(pools):
        before = h.shared_state(pools)
        result = _run(case, ctx)
        after = h.shared_state(pools)
    assert after == before, "the failed call changed a shared pool"
    if case.post is not None:
        case.post(ctx, result)
    del ctx, result
    h.assert_context_works(probe)
    h.count("bad-input catalogue: cases passed")


def test_catalogue_size():
    """The issue asks for at least 30 cases; say how many there are."""
    cpu = sum(c.cpu for c in CASES)
    known_bugs = sum(bool(c.xfail) for c in CASES)
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES), "duplicate case ids"
    h.record("bad-input catalogue", f"bad-input catalogue: {len(CASES)} cases ({cpu} checked "
                                    f"without a GPU too; {known_bugs} mark known library bugs)")
