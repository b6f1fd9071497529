# SPDX-License-Identifier: Apache-2.0
"""MemPool, PoolAttributes, peaks, trim, access, routing and capture safety on the GPU."""

import threading

import pytest
import rmm

import asyncmr
from asyncmr import AsyncDeviceMR, AsyncManagedMR, AsyncPinnedMR, Location, MemPool

from gpu_helpers import require_module, sync

MiB = 1 << 20
UINT64_MAX = 2**64 - 1
POOL_KINDS = [
    (Location.device(0), "device"),
    (Location.device(0), "managed"),
    (Location.none(), "managed"),
    (Location.host(), "pinned"),
    (Location.host_numa(0), "pinned"),
]
NEW_DRIVER = 13020


def driver_has_13_2():
    return asyncmr.driver_version() >= NEW_DRIVER


# ---- MemPool --------------------------------------------------------------------------------

@pytest.mark.parametrize("loc, atype", POOL_KINDS)
def test_default_and_current_pools(gpu, loc, atype):
    default = MemPool.default(loc, atype)
    current = MemPool.current(loc, atype)
    assert default.handle == current.handle  # until someone routes elsewhere
    assert not default.owned
    assert default.location == loc and default.allocation_type == atype


@pytest.mark.parametrize("loc, atype", POOL_KINDS)
def test_created_pools_are_owned_context_managers(gpu, loc, atype):
    with MemPool.create(loc, atype) as pool:
        assert pool.owned and not pool.closed
        assert pool.attributes.release_threshold == UINT64_MAX
        assert pool.location == loc and pool.allocation_type == atype
    assert pool.closed
    with pytest.raises(asyncmr.PoolClosedError, match="closed"):
        pool.attributes.release_threshold
    pool.close()  # idempotent


def test_refused_combinations_say_why(gpu):
    with pytest.raises(ValueError, match="device memory lives on a device"):
        MemPool.default(Location.host(), "device")
    with pytest.raises(ValueError, match="pinned memory lives on the host"):
        MemPool.create(Location.device(0), "pinned")
    with pytest.raises(ValueError, match="host_numa_current"):
        MemPool.create(Location.host_numa_current(), "pinned")


def test_from_handle_adopts_without_owning(gpu):
    with MemPool.create(Location.device(0), "device") as owner:
        view = MemPool.from_handle(owner.handle)
        assert not view.owned and view.handle == owner.handle
        assert view == owner
        view.close()  # a view's close never destroys the pool
        assert owner.attributes.release_threshold == UINT64_MAX


# ---- PoolAttributes -------------------------------------------------------------------------

@pytest.fixture
def owned_device_pool(gpu):
    with MemPool.create(Location.device(0), "device") as pool:
        yield pool


def test_attributes_repr_and_dict(owned_device_pool):
    attrs = owned_device_pool.attributes
    d = attrs.as_dict()
    for name in ("release_threshold", "reserved_mem_current", "used_mem_high",
                 "reuse_allow_opportunistic"):
        assert name in d
    assert repr(attrs).startswith("PoolAttributes(") and "release_threshold=" in repr(attrs)


@pytest.mark.parametrize("row", [r for r in asyncmr.attribute_table if r.access == "read_write"],
                         ids=lambda r: r.name)
def test_read_write_attributes_round_trip(owned_device_pool, row):
    attrs = owned_device_pool.attributes
    before = getattr(attrs, row.name)
    new = (not before) if row.kind == "boolean" else 123 * MiB
    setattr(attrs, row.name, new)
    assert getattr(attrs, row.name) == new
    setattr(attrs, row.name, before)
    assert getattr(attrs, row.name) == before


@pytest.mark.parametrize("row", [r for r in asyncmr.attribute_table if r.access == "read_only"],
                         ids=lambda r: r.name)
def test_read_only_attributes_refuse_writes(owned_device_pool, row):
    with pytest.raises(AttributeError, match="read-only"):
        setattr(owned_device_pool.attributes, row.name, 0)


@pytest.mark.parametrize("name", ["used_mem_high", "reserved_mem_high"])
def test_watermarks_reset_with_zero_only(owned_device_pool, name):
    pool = owned_device_pool
    mr = AsyncDeviceMR(pool=pool)
    ptr = mr.allocate(8 * MiB)
    mr.deallocate(ptr, 8 * MiB)
    sync()
    high = getattr(pool.attributes, name)
    assert high >= 8 * MiB
    with pytest.raises(ValueError, match="can only be reset"):
        setattr(pool.attributes, name, 5)
    assert getattr(pool.attributes, name) == high  # unchanged
    setattr(pool.attributes, name, 0)
    current = name.replace("_high", "_current")
    assert getattr(pool.attributes, name) == getattr(pool.attributes, current)


def test_bad_attribute_values(owned_device_pool):
    attrs = owned_device_pool.attributes
    with pytest.raises(ValueError, match="release_threshold must be in"):
        attrs.release_threshold = -1
    with pytest.raises(TypeError, match="must be a bool"):
        attrs.reuse_allow_opportunistic = "yes"
    with pytest.raises(AttributeError):
        attrs.no_such_attribute = 1


def test_cuda_13_2_attributes_on_owned_pools(gpu):
    with MemPool.create(Location.device(0), "device", max_size=256 * MiB) as pool:
        a = pool.attributes
        assert a.max_pool_size == 256 * MiB
        assert a.location_type == "device" and a.location_id == 0
        assert a.allocation_type == "device" == pool.allocation_type  # one decoding
        assert a.export_handle_types == 0
        assert a.hw_decompress_enabled is False


def test_cuda_13_2_attributes_of_shared_pools(gpu):
    a = MemPool.default(Location.host(), "pinned").attributes
    assert a.location_type == "host"  # known from how asyncmr obtained the pool
    assert a.allocation_type == "pinned"
    if driver_has_13_2():
        assert isinstance(a.max_pool_size, int)
    else:
        with pytest.raises(asyncmr.UnsupportedError, match=r"needs a CUDA driver >= 13\.2"):
            a.max_pool_size
        assert "max_pool_size" not in a.as_dict()


def test_cuda_13_2_attributes_of_foreign_handles(gpu):
    # A handle asyncmr did not obtain by location (here the default pool's, adopted raw).
    adopted = MemPool.from_handle(MemPool.default(Location.device(0), "device").handle)
    if driver_has_13_2():
        assert adopted.location == Location.device(0)
    else:
        assert adopted.location is None and adopted.allocation_type is None
        with pytest.raises(asyncmr.UnsupportedError, match="13.2"):
            adopted.attributes.location_type
        with pytest.raises(asyncmr.UnsupportedError, match="location"):
            adopted.make_current()
    told = MemPool.from_handle(adopted.handle, location=Location.device(0),
                               allocation_type="device")
    assert told.location == Location.device(0) and told.attributes.location_type == "device"


def test_adopting_an_owned_handle_shares_its_state(gpu):
    with MemPool.create(Location.device(0), "device", max_size=128 * MiB) as owner:
        handle = owner.handle
        view = MemPool.from_handle(handle)
        assert not view.owned
        assert view.location == Location.device(0)  # known from the owner
        assert view.attributes.max_pool_size == 128 * MiB
    assert view.closed  # the owner's close reaches the view: no dangling handle
    with pytest.raises(asyncmr.PoolClosedError):
        MemPool.from_handle(view)


def test_closing_with_live_allocations_defers_destruction(gpu):
    pool = MemPool.create(Location.device(0), "device")
    handle = pool.handle
    mr = AsyncDeviceMR(pool=pool)
    ptr = mr.allocate(MiB)
    pool.close()  # a block is still live: the driver pool must outlive it
    with pytest.raises(asyncmr.PoolClosedError):
        mr.allocate(MiB)
    with pytest.raises(ValueError, match="closed by asyncmr"):
        MemPool.from_handle(handle)  # parked: alive in the driver, but asyncmr's to destroy
    mr.deallocate(ptr, MiB)  # freeing into the closed pool is safe
    sync()
    AsyncDeviceMR(pool="new")  # a later create destroys the parked pool
    sync()


def test_scoped_sets_and_restores(owned_device_pool):
    attrs = owned_device_pool.attributes
    with attrs.scoped(release_threshold=0, reuse_allow_opportunistic=False):
        assert attrs.release_threshold == 0
        assert attrs.reuse_allow_opportunistic is False
    assert attrs.release_threshold == UINT64_MAX
    assert attrs.reuse_allow_opportunistic is True
    with pytest.raises(AttributeError, match="cannot be scoped"):
        with attrs.scoped(used_mem_current=0):
            pass


# ---- peaks and trim --------------------------------------------------------------------------

def test_track_peak_per_phase(owned_device_pool):
    mr = AsyncDeviceMR(pool=owned_device_pool)
    with mr.track_peak() as big:
        p = mr.allocate(16 * MiB)
        mr.deallocate(p, 16 * MiB)
        sync()
    with mr.track_peak() as small:
        p = mr.allocate(MiB)
        mr.deallocate(p, MiB)
        sync()
    assert big.used >= 16 * MiB and big.reserved >= 16 * MiB
    assert MiB <= small.used < 16 * MiB


def test_a_peak_tracker_is_used_once_and_says_so(owned_device_pool):
    mr = AsyncDeviceMR(pool=owned_device_pool)
    tracker = mr.track_peak()
    with tracker:
        pass
    with pytest.raises(RuntimeError, match="a peak tracker is used once"):
        with tracker:
            pass


def test_reset_peak_on_resource(owned_device_pool):
    mr = AsyncDeviceMR(pool=owned_device_pool)
    p = mr.allocate(4 * MiB)
    mr.deallocate(p, 4 * MiB)
    sync()
    mr.reset_peaks()
    assert mr.attributes.used_mem_high == mr.attributes.used_mem_current == 0


@pytest.mark.parametrize("loc, atype", [(Location.device(0), "device"),
                                        (Location.device(0), "managed"),
                                        (Location.host(), "pinned")])
def test_trim_returns_reserved_memory(gpu, loc, atype):
    with MemPool.create(loc, atype) as pool:
        mr = {"device": AsyncDeviceMR, "managed": AsyncManagedMR, "pinned": AsyncPinnedMR}[atype](
            pool=pool)
        ptrs = [mr.allocate(32 * MiB) for _ in range(3)]
        for p in ptrs:
            mr.deallocate(p, 32 * MiB)
        sync()
        assert pool.attributes.reserved_mem_current >= 96 * MiB
        mr.trim_to(32 * MiB)
        assert 32 * MiB <= pool.attributes.reserved_mem_current < 96 * MiB
        mr.trim_to()
        assert pool.attributes.reserved_mem_current == 0


# ---- reserve: growing the pool up front --------------------------------------------------------

RESOURCES = {"device": AsyncDeviceMR, "managed": AsyncManagedMR, "pinned": AsyncPinnedMR}


@pytest.mark.parametrize("atype", ["device", "managed", "pinned"])
def test_a_reservation_is_held_unused_and_serves_the_allocations_after_it(gpu, atype):
    mr = RESOURCES[atype](pool="new", reserve=64 * MiB)
    attrs = mr.attributes
    held = attrs.reserved_mem_current
    assert held >= 64 * MiB
    assert attrs.used_mem_current == 0 and attrs.used_mem_high == 0  # peaks start after it
    ptrs = [mr.allocate(2 * MiB) for _ in range(16)]  # 32 MiB live: carved from the reservation
    assert attrs.reserved_mem_current == held
    for p in ptrs:
        mr.deallocate(p, 2 * MiB)
    sync()
    assert attrs.reserved_mem_current == held  # kept across the synchronization


@pytest.mark.parametrize("atype", ["device", "managed", "pinned"])
def test_a_reservation_above_the_release_threshold_is_refused_before_any_change(gpu, atype):
    make = RESOURCES[atype]
    with pytest.raises(ValueError, match=r"reserve \(67108864 bytes\) is above the pool's "
                                         r"release threshold \(1048576 bytes\)"):
        make(pool="new", release_threshold=MiB, reserve=64 * MiB)
    loc = Location.host() if atype == "pinned" else Location.device(0)
    shared = MemPool.default(loc, atype)
    before = shared.attributes.release_threshold
    reserved = shared.attributes.reserved_mem_current
    try:
        shared.attributes.release_threshold = 5 * MiB  # someone else's non-zero value is kept
        with pytest.raises(ValueError, match="pass release_threshold >= reserve"):
            make(reserve=64 * MiB)
        assert shared.attributes.release_threshold == 5 * MiB
        assert shared.attributes.reserved_mem_current <= max(reserved, 5 * MiB)
    finally:
        shared.attributes.release_threshold = before


@pytest.mark.parametrize("value, error, match", [
    (-1, ValueError, r"reserve must be in \[0, 2\*\*64\)"),
    (True, TypeError, "reserve must be an int number of bytes, got bool"),
    ("64M", TypeError, "reserve must be an int number of bytes, got str"),
    (None, TypeError, "reserve must be an int number of bytes, got NoneType"),
])
@pytest.mark.parametrize("atype", ["device", "managed", "pinned"])
def test_a_bad_reserve_is_refused_by_name(atype, value, error, match):
    # Checked before any CUDA call: runs without a GPU too.
    with pytest.raises(error, match=match):
        RESOURCES[atype](pool="new", reserve=value)


def test_an_impossible_reservation_raises_memory_error_and_puts_the_threshold_back(gpu):
    pool = MemPool.default(Location.device(0), "device")
    before = pool.attributes.release_threshold
    try:
        pool.attributes.release_threshold = 0  # as in a fresh process
        with pytest.raises(MemoryError, match="out of memory allocating 1125899906842624 bytes"):
            AsyncDeviceMR(reserve=1 << 50)  # 1 PiB of device memory
        assert pool.attributes.release_threshold == 0
        mr = AsyncDeviceMR(pool="new", reserve=MiB)  # the context still works
        assert mr.attributes.reserved_mem_current >= MiB
    finally:
        pool.attributes.release_threshold = before


def test_a_reservation_on_a_bounded_pool_that_does_not_fit_changes_nothing(gpu):
    with MemPool.create(Location.device(0), "device", max_size=64 * MiB,
                        release_threshold=0) as pool:
        with pytest.raises(MemoryError, match="out of memory"):
            AsyncDeviceMR(pool=pool, release_threshold=UINT64_MAX, reserve=128 * MiB)
        assert pool.attributes.release_threshold == 0
        assert pool.attributes.reserved_mem_current == 0
        assert pool.attributes.used_mem_current == 0


@pytest.mark.parametrize("atype", ["device", "managed", "pinned"])
def test_a_reservation_the_threshold_would_trim_is_refused_naming_what_the_pool_holds(gpu, atype):
    # The release threshold bounds all the pool reserves, in use or not: a pool holding 32 MiB
    # of live blocks under a 64 MiB threshold can keep 32 MiB unused, not a 64 MiB reservation.
    loc = Location.host() if atype == "pinned" else Location.device(0)
    with MemPool.create(loc, atype, release_threshold=64 * MiB) as pool:
        holder = RESOURCES[atype](pool=pool)
        live = holder.allocate(32 * MiB)
        sync()
        reserved = pool.attributes.reserved_mem_current
        with pytest.raises(ValueError, match=r"reserve \(67108864 bytes\) and the 33554432 "
                                             r"bytes the pool has in use are above its release "
                                             r"threshold \(67108864 bytes\)"):
            RESOURCES[atype](pool=pool, reserve=64 * MiB)
        assert pool.attributes.release_threshold == 64 * MiB
        assert pool.attributes.reserved_mem_current == reserved
        holder.deallocate(live, 32 * MiB)
        sync()


@pytest.mark.parametrize("atype", ["device", "managed", "pinned"])
def test_a_reservation_is_either_held_whole_or_refused(gpu, atype):
    # A pool grows in chunks: a threshold equal to an odd-sized reservation may give the chunk
    # back at the reservation's own synchronization. Whatever the chunk, the resource either
    # holds what it was asked to reserve or refuses, the pool as it was.
    make = RESOURCES[atype]
    for reserve in (MiB, 3 * MiB, 5 * MiB + 4096):
        try:
            mr = make(pool="new", release_threshold=reserve, reserve=reserve)
        except ValueError as e:
            assert "gave back" in str(e) and f"reserve ({reserve} bytes)" in str(e), e
            continue
        sync()
        attrs = mr.attributes
        assert attrs.reserved_mem_current - attrs.used_mem_current >= reserve, (
            reserve, attrs.reserved_mem_current)


def test_a_failed_reservation_never_undoes_another_resources_on_the_same_pool(gpu):
    # Two threads build resources on one bounded pool at once: one asks a reservation the pool
    # cannot hold (it fails, giving back what it grew and putting the threshold back), the other
    # a threshold and a reservation that fit. In whatever order they ran, the pool ends with the
    # second one's threshold and its reservation held.
    lost = []
    for round_ in range(12):
        with MemPool.create(Location.device(0), "device", max_size=64 * MiB,
                            release_threshold=0) as pool:
            start = threading.Barrier(2)
            results = {}

            def failing():
                start.wait()
                try:
                    AsyncDeviceMR(pool=pool, release_threshold=256 * MiB, reserve=128 * MiB)
                except MemoryError:
                    results["failing"] = "refused"

            def fitting():
                start.wait()
                results["fitting"] = AsyncDeviceMR(pool=pool, release_threshold=32 * MiB,
                                                   reserve=16 * MiB)

            threads = [threading.Thread(target=failing), threading.Thread(target=fitting)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert results.get("failing") == "refused", results
            sync()
            threshold = pool.attributes.release_threshold
            unused = pool.attributes.reserved_mem_current - pool.attributes.used_mem_current
            if threshold != 32 * MiB or unused < 16 * MiB:
                lost.append((round_, threshold, unused))
            del results
    assert lost == [], f"(round, threshold, unused bytes) where the fitting resource lost: {lost}"


def test_a_resource_on_an_owned_current_pool_is_closed_with_it(gpu):
    pool = MemPool.create(Location.device(0), "device")
    with pool.as_current():
        mr = AsyncDeviceMR(pool="current")
        current = MemPool.current(Location.device(0), "device")
    assert mr.pool_handle == pool.handle
    pool.close()
    # The routed resource and the view shared the owner's pool: closed with it, never left
    # holding the handle of a destroyed driver pool.
    assert mr.pool.closed and current.closed
    with pytest.raises(asyncmr.PoolClosedError):
        mr.allocate(MiB)


def test_an_adopted_device_pool_refuses_a_device_it_does_not_live_on(gpu):
    with MemPool.create(Location.device(0), "device") as pool:
        with pytest.raises(ValueError, match=r"the pool lives on device 0; device=1 names "
                                             r"another"):
            AsyncDeviceMR(1, pool=pool)
        assert AsyncDeviceMR(0, pool=pool).device == 0


def test_an_adopted_managed_pool_refuses_a_location_it_does_not_have(gpu):
    with MemPool.create(Location.device(0), "managed") as pool:
        with pytest.raises(ValueError, match=r"the pool is located at device\(0\); location=host "
                                             r"names another"):
            AsyncManagedMR(pool=pool, location=Location.host())
        assert AsyncManagedMR(pool=pool, location=Location.device(0)).pool_handle == pool.handle


# ---- access ----------------------------------------------------------------------------------

def test_set_access_on_a_host_pool(gpu):
    with MemPool.create(Location.host(), "pinned") as pool:
        assert pool.access(0) == "none"  # host pools start with no device access (FACTS)
        pool.set_access("all", "rw")
        assert pool.access(0) == "rw"
        pool.set_access([0], "none")
        assert pool.access(0) == "none"
    with pytest.raises(ValueError, match="access mode"):
        MemPool.default(Location.host(), "pinned").set_access([0], "write")


def test_read_only_access_is_granted_or_refused_as_unsupported(gpu):
    # Driver 580 refuses it on every pool (docs/DRIVER_FACTS.md, "Access"); the refusal names
    # what was asked, leaves the access as it was, and the pool works on.
    with MemPool.create(Location.host(), "pinned") as pool:
        try:
            pool.set_access(0, "r")
        except asyncmr.UnsupportedError as e:
            assert "read-only access" in str(e)
            assert pool.access(0) == "none"
        else:
            assert pool.access(0) == "r"
        pool.set_access(0, "rw")
        mr = AsyncPinnedMR(pool=pool)
        mr.deallocate(mr.allocate(4096), 4096)


def test_a_device_pool_keeps_its_own_devices_access_through_all(gpu):
    # "all" names the pool's own device too: less than read-write is refused before any
    # device's access changes, and read-write for all is taken.
    with MemPool.create(Location.device(0), "device") as pool:
        with pytest.raises(ValueError, match="device 0 holds this pool's memory"):
            pool.set_access("all", "none")
        assert pool.access(0) == "rw"
        pool.set_access("all", "rw")
        assert pool.access(0) == "rw"


def test_access_on_a_missing_device(gpu):
    pool = MemPool.default(Location.host(), "pinned")
    with pytest.raises(ValueError, match="device 64 does not exist"):
        pool.access(64)
    with pytest.raises(ValueError, match="does not exist"):
        pool.set_access([64], "rw")


# ---- routing ---------------------------------------------------------------------------------

@pytest.mark.parametrize("loc, atype", [(Location.device(0), "device"),
                                        (Location.device(0), "managed"),
                                        (Location.host(), "pinned")])
def test_make_current_routes_and_returns_the_previous_pool(gpu, loc, atype):
    default = MemPool.default(loc, atype)
    with MemPool.create(loc, atype) as pool:
        previous = pool.make_current()
        assert previous.handle == default.handle
        assert MemPool.current(loc, atype).handle == pool.handle
        previous.make_current()
        assert MemPool.current(loc, atype).handle == default.handle
        with pool.as_current():
            assert MemPool.current(loc, atype).handle == pool.handle
        assert MemPool.current(loc, atype).handle == default.handle


def test_routing_reaches_cudaMallocAsync_users(gpu):
    cupy = require_module("cupy")
    with MemPool.create(Location.device(0), "device") as pool:
        with pool.as_current():
            # CuPy's MemoryAsyncPool allocates with cudaMallocAsync from the current pool.
            async_pool = cupy.cuda.MemoryAsyncPool()
            mem = async_pool.malloc(4 * MiB)
            cupy.cuda.runtime.deviceSynchronize()
            assert pool.attributes.used_mem_current >= 4 * MiB
            del mem
            cupy.cuda.runtime.deviceSynchronize()


def test_resource_on_the_current_pool_follows_routing(gpu):
    with MemPool.create(Location.device(0), "device") as pool:
        with pool.as_current():
            mr = AsyncDeviceMR(pool="current")
            assert mr.pool_handle == pool.handle


def test_closing_a_current_pool_routes_back_to_the_default(gpu):
    default = MemPool.default(Location.device(0), "device")
    pool = MemPool.create(Location.device(0), "device")
    pool.make_current()
    pool.close()
    assert MemPool.current(Location.device(0), "device").handle == default.handle


# ---- the case from the field -----------------------------------------------------------------

def test_users_can_set_the_default_pool_threshold_back_to_zero(gpu):
    AsyncDeviceMR(pool="default")  # raises the default pool's threshold (policy)
    mr = AsyncDeviceMR()
    assert mr.attributes.release_threshold == UINT64_MAX
    mr.attributes.release_threshold = 0  # what the simulation library's users do
    ptr = mr.allocate(256 * MiB)
    mr.deallocate(ptr, 256 * MiB)
    reserved_before_sync = mr.attributes.reserved_mem_current
    assert reserved_before_sync >= 256 * MiB
    sync()  # the pool returns unused memory at the next synchronization
    assert mr.attributes.reserved_mem_current < reserved_before_sync - 128 * MiB


# ---- capture safety --------------------------------------------------------------------------

def _exercise_every_control_call():
    """Attribute reads and writes, trim, access and routing, on all three kinds of pool."""
    for loc, atype in [(Location.device(0), "device"), (Location.device(0), "managed"),
                       (Location.host(), "pinned")]:
        pool = MemPool.default(loc, atype)
        attrs = pool.attributes
        attrs.as_dict()
        threshold = attrs.release_threshold
        attrs.release_threshold = threshold
        attrs.reuse_allow_opportunistic = attrs.reuse_allow_opportunistic
        attrs.used_mem_high = 0
        pool.trim_to(UINT64_MAX)
        pool.access(0)
        if loc.is_host:
            pool.set_access([0], "rw")
        previous = MemPool.current(loc, atype).make_current()
        previous.make_current()


def _capture_with(mode):
    cupy = require_module("cupy")
    return cupy, {"global": cupy.cuda.runtime.streamCaptureModeGlobal,
                  "thread_local": cupy.cuda.runtime.streamCaptureModeThreadLocal}[mode]


def test_control_calls_during_a_global_capture_on_another_thread(gpu):
    cupy, mode = _capture_with("global")
    started, done = threading.Event(), threading.Event()
    result = {}

    def capture():
        try:
            s = cupy.cuda.Stream(non_blocking=True)
            x = cupy.zeros(1024, dtype=cupy.float32)
            cupy.cuda.runtime.deviceSynchronize()
            with s:
                s.begin_capture(mode)
                started.set()
                done.wait(30)
                x += 1
                graph = s.end_capture()
            graph.launch(s)
            s.synchronize()
            result["value"] = float(x[0].get())
        except Exception as e:  # reported to the main thread
            result["error"] = e
            started.set()

    t = threading.Thread(target=capture)
    t.start()
    assert started.wait(30), "the capturing thread never started its capture"
    try:
        _exercise_every_control_call()
    finally:
        done.set()
        t.join(60)
    assert "error" not in result, result.get("error")
    assert result["value"] == 1.0


def test_control_calls_during_a_thread_local_capture_on_this_thread(gpu):
    cupy, mode = _capture_with("thread_local")
    s = cupy.cuda.Stream(non_blocking=True)
    x = cupy.zeros(1024, dtype=cupy.float32)
    cupy.cuda.runtime.deviceSynchronize()
    with s:
        s.begin_capture(mode)
        _exercise_every_control_call()
        x += 2
        graph = s.end_capture()
    graph.launch(s)
    s.synchronize()
    assert float(x[0].get()) == 2.0


def _graph_node_types(drv, graph) -> list:
    err, _, count = drv.cuGraphGetNodes(graph, 0)
    assert err == drv.CUresult.CUDA_SUCCESS
    err, nodes, count = drv.cuGraphGetNodes(graph, count)
    assert err == drv.CUresult.CUDA_SUCCESS
    types = []
    for node in nodes[:count]:
        err, node_type = drv.cuGraphNodeGetType(node)
        assert err == drv.CUresult.CUDA_SUCCESS
        types.append(node_type)
    return types


@pytest.mark.parametrize("kind", ["device", "managed"])
def test_allocation_inside_a_capture_becomes_a_graph_node(gpu, kind):
    cupy = require_module("cupy")
    drv = require_module("cuda.bindings.driver", "the test reads the captured graph's nodes")
    ok = drv.CUresult.CUDA_SUCCESS
    mr = {"device": AsyncDeviceMR, "managed": AsyncManagedMR}[kind]()
    s = cupy.cuda.Stream(non_blocking=True)
    rs = rmm.pylibrmm.stream.Stream(obj=s)
    hs = drv.CUstream(s.ptr)
    mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    assert drv.cuStreamBeginCapture(hs, mode)[0] == ok
    try:
        ptr = mr.allocate(MiB, rs)
        cupy.cuda.runtime.memsetAsync(ptr, 1, MiB, s.ptr)
        mr.deallocate(ptr, MiB, rs)
    finally:
        err, graph = drv.cuStreamEndCapture(hs)
    assert err == ok
    try:
        types = _graph_node_types(drv, graph)
        kinds = drv.CUgraphNodeType
        # As the C++ test: one allocation node and one free node, around the memset.
        assert types.count(kinds.CU_GRAPH_NODE_TYPE_MEM_ALLOC) == 1, types
        assert types.count(kinds.CU_GRAPH_NODE_TYPE_MEM_FREE) == 1, types
        assert types.count(kinds.CU_GRAPH_NODE_TYPE_MEMSET) == 1, types
        err, graph_exec = drv.cuGraphInstantiate(graph, 0)
        assert err == ok
        assert drv.cuGraphLaunch(graph_exec, hs)[0] == ok
        s.synchronize()
        assert drv.cuGraphExecDestroy(graph_exec)[0] == ok
    finally:
        drv.cuGraphDestroy(graph)


@pytest.mark.parametrize("make", [lambda: AsyncPinnedMR(),
                                  lambda: AsyncManagedMR(location=Location.host(), pool="new")],
                         ids=["pinned", "managed@host"])
def test_host_pool_allocation_inside_a_capture_is_refused_cleanly(gpu, make):
    cupy, mode = _capture_with("thread_local")
    mr = make()
    s = cupy.cuda.Stream(non_blocking=True)
    rs = rmm.pylibrmm.stream.Stream(obj=s)
    x = cupy.zeros(16, dtype=cupy.int32)
    cupy.cuda.runtime.deviceSynchronize()
    with s:
        s.begin_capture(mode)
        with pytest.raises(RuntimeError, match="inside a stream capture"):
            mr.allocate(MiB, rs)
        x += 1
        graph = s.end_capture()  # the capture is still valid
    graph.launch(s)
    s.synchronize()
    assert int(x[0].get()) == 1


# ---- nested and concurrent peak trackers -------------------------------------------------------

def _peak(mr, nbytes):
    """Allocates and frees ``nbytes`` on ``mr``, and waits for the free: a peak made and undone."""
    mr.deallocate(mr.allocate(nbytes), nbytes)
    sync()


def test_an_outer_peak_tracker_keeps_the_peak_it_saw_before_an_inner_one(owned_device_pool):
    mr = AsyncDeviceMR(pool=owned_device_pool)
    with mr.track_peak() as outer:
        _peak(mr, 16 * MiB)
        mr.trim_to()  # the reserve falls back too, so the inner reset lowers both marks
        with mr.track_peak() as inner:
            _peak(mr, MiB)
    assert outer.used >= 16 * MiB and outer.reserved >= 16 * MiB  # 1 MiB before the registry
    assert MiB <= inner.used < 16 * MiB
    assert inner.reserved <= outer.reserved


def test_a_peak_tracker_opened_on_another_thread_leaves_this_ones_peak(owned_device_pool):
    mr = AsyncDeviceMR(pool=owned_device_pool)
    freed, measured = threading.Event(), threading.Event()
    peaks, errors = {}, []

    def first():  # peaks at 16 MiB, then stays open across the second thread's whole tracker
        try:
            with mr.track_peak() as peak:
                _peak(mr, 16 * MiB)
                freed.set()
                assert measured.wait(30), "the second tracker never finished"
            peaks["first"] = peak.used
        except BaseException as e:  # reported to the main thread
            errors.append(e)
            freed.set()

    def second():  # opens its tracker after the first one's 16 MiB came and went
        try:
            assert freed.wait(30), "the first thread never freed its block"
            with mr.track_peak() as peak:
                _peak(mr, MiB)
            peaks["second"] = peak.used
        except BaseException as e:
            errors.append(e)
        finally:
            measured.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert peaks["first"] >= 16 * MiB  # 1 MiB before the registry
    assert MiB <= peaks["second"] < 16 * MiB


def test_peak_trackers_on_two_mempool_objects_of_one_pool_see_each_others_resets(
        owned_device_pool):
    pool = owned_device_pool
    mr = AsyncDeviceMR(pool=MemPool.from_handle(pool.handle))
    assert mr.pool is not pool and mr.pool == pool  # another MemPool of the same driver pool
    with pool.track_peak() as outer:
        _peak(mr, 16 * MiB)
        with mr.track_peak() as inner:  # resets the marks through the other MemPool
            _peak(mr, MiB)
    assert outer.used >= 16 * MiB
    assert MiB <= inner.used < 16 * MiB


def _reset_both_marks(mr):
    mr.attributes.used_mem_high = 0
    mr.attributes.reserved_mem_high = 0


@pytest.mark.parametrize("reset", [lambda mr: mr.reset_peaks(), lambda mr: mr.pool.reset_peaks(),
                                   _reset_both_marks],
                         ids=["resource", "pool", "attributes"])
def test_a_reset_inside_a_peak_tracker_leaves_its_peak(owned_device_pool, reset):
    mr = AsyncDeviceMR(pool=owned_device_pool)
    with mr.track_peak() as peak:
        _peak(mr, 16 * MiB)
        mr.trim_to()
        reset(mr)
        assert mr.attributes.used_mem_high < 16 * MiB  # the pool's marks were reset
        assert mr.attributes.reserved_mem_high < 16 * MiB
    assert peak.used >= 16 * MiB and peak.reserved >= 16 * MiB


def test_a_peak_tracker_that_cannot_read_its_closed_pool_raises_and_leaves_the_registry(gpu):
    from asyncmr import _attributes

    pool = MemPool.create(Location.device(0), "device")
    handle = pool.handle
    tracker = pool.track_peak()
    with pytest.raises(asyncmr.PoolClosedError):
        with tracker:
            assert tracker in _attributes._OPEN[handle]
            pool.close()
    assert tracker.used is None and tracker.reserved is None
    assert handle not in _attributes._OPEN  # no later reset of a pool at this handle finds it
