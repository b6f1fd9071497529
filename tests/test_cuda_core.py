# SPDX-License-Identifier: Apache-2.0
"""asyncmr and cuda.core, both ways, with the real cuda.core: asyncmr's pools behind cuda.core's
``MemoryResource`` (``asyncmr.cuda_core.Resource``), and cuda.core's pools under asyncmr's
control (``MemPool.from_handle`` of a cuda.core resource).

On any machine: bad input (objects that are no pool, cuda.bindings streams and events among
them; closed cuda.core resources; streams of a wrong type) is refused by type before any driver
call; on a machine without a GPU a driver call would raise NoDeviceError instead. On the GPU: the
case that motivates the module (cuda.core raises the default pool's release threshold; asyncmr
sets it back, and cudaMallocAsync users get their memory back at the next synchronization),
per-phase peaks and trims of cuda.core's pools, beside another thread's global capture too;
kernels launched by cuda.core on asyncmr buffers; routing cuda.core's ManagedMemoryResource();
the front cache, recording and prefetch through the wrapper; graph capture.
"""

import contextlib
import gc
import sys
import weakref

import numpy as np
import pytest
from cuda.bindings import driver, runtime

import asyncmr
from asyncmr import AsyncDeviceMR, AsyncManagedMR, AsyncPinnedMR, Location, MemPool

from gpu_helpers import (captured_elsewhere, describe, host_view, require_module, run_python,
                         skip_or_fail)

KiB, MiB = 1 << 10, 1 << 20
UINT64_MAX = 2**64 - 1
ADDRESS = 0x7F0000001000  # a plausible address: these checks never reach the driver


@pytest.fixture
def cc():
    """cuda.core (asyncmr's [test] extra installs it; a GPU host without it fails)."""
    return require_module("cuda.core", "asyncmr.cuda_core wraps it")


@pytest.fixture
def wrapper(cc):
    import asyncmr.cuda_core

    return asyncmr.cuda_core


# ---- import -------------------------------------------------------------------------------------

def test_import_asyncmr_does_not_import_cuda_core(cc):
    proc = run_python("import sys, asyncmr\n"
                      "assert 'cuda.core' not in sys.modules, 'import asyncmr loaded cuda.core'\n"
                      "import asyncmr.cuda_core\n"
                      "assert 'cuda.core' in sys.modules\n"
                      "print('ok')\n")
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", describe(proc)


# ---- objects that are no pool: refused by type, before any driver call (any machine) --------------

NOT_POOLS = [
    pytest.param(lambda: driver.CUstream(ADDRESS), "cuda.bindings.driver.CUstream", id="CUstream"),
    pytest.param(lambda: driver.CUevent(ADDRESS), "cuda.bindings.driver.CUevent", id="CUevent"),
    pytest.param(lambda: runtime.cudaStream_t(ADDRESS), "cuda.bindings.runtime.cudaStream_t",
                 id="cudaStream_t"),
    pytest.param(lambda: runtime.cudaEvent_t(ADDRESS), "cuda.bindings.runtime.cudaEvent_t",
                 id="cudaEvent_t"),
    pytest.param(lambda: driver.CUcontext(ADDRESS), "cuda.bindings.driver.CUcontext",
                 id="CUcontext"),
    pytest.param(lambda: driver.CUdeviceptr(ADDRESS), "cuda.bindings.driver.CUdeviceptr",
                 id="CUdeviceptr"),
]
ADOPTERS = [
    pytest.param(lambda pool: MemPool.from_handle(pool), id="MemPool.from_handle"),
    pytest.param(lambda pool: AsyncDeviceMR(pool=pool), id="AsyncDeviceMR"),
    pytest.param(lambda pool: AsyncManagedMR(pool=pool), id="AsyncManagedMR"),
    pytest.param(lambda pool: AsyncPinnedMR(pool=pool), id="AsyncPinnedMR"),
]


@pytest.mark.parametrize("adopt", ADOPTERS)
@pytest.mark.parametrize("make, name", NOT_POOLS)
def test_cuda_bindings_handles_that_are_no_pool_are_refused(adopt, make, name):
    # Each converts to int (the driver would have read a stream or an event as a pool).
    value = make()
    assert int(value) == ADDRESS
    with pytest.raises(TypeError, match=rf"a {name} is not a memory pool .*its int value is no "
                                        "pool handle"):
        adopt(value)


@pytest.mark.parametrize("adopt", ADOPTERS)
@pytest.mark.parametrize("value, name", [(object(), "object"), (1.5, "float"), (b"\x10", "bytes"),
                                         ([ADDRESS], "list")])
def test_objects_that_are_no_pool_are_refused(adopt, value, name):
    with pytest.raises(TypeError, match=r"(pool handle|pool) must be .*a cuda.bindings "
                                        rf"CUmemoryPool or cudaMemPool_t, or a cuda.core .*, got "
                                        rf"{name}$"):
        adopt(value)


def test_a_cuda_core_object_that_is_no_pool_resource_is_refused(cc):
    # A stream (a cuda.core object, not a resource) and a resource without a pool.
    with pytest.raises(TypeError, match=r"pool handle must be .*, got cuda\.core\._stream\.Stream"):
        MemPool.from_handle(cc.Stream.from_handle(ADDRESS))
    legacy = cc.LegacyPinnedMemoryResource()
    for adopt in (MemPool.from_handle, lambda r: AsyncPinnedMR(pool=r)):
        with pytest.raises(TypeError, match=r"a cuda\.core\.LegacyPinnedMemoryResource allocates "
                                            "from no memory pool asyncmr can adopt"):
            adopt(legacy)


@pytest.mark.parametrize("kind", ["DeviceMemoryResource", "PinnedMemoryResource",
                                  "ManagedMemoryResource"])
@pytest.mark.parametrize("adopt", ADOPTERS + [
    pytest.param(lambda pool: MemPool.from_handle(pool, owned=True), id="owned")])
def test_a_closed_cuda_core_resource_is_refused(cc, kind, adopt):
    # An instance cuda.core never opened holds no pool, as close() leaves one (the GPU test below
    # closes a real one): refused before its handle, 0, is taken for anything.
    resource = getattr(cc, kind).__new__(getattr(cc, kind))
    assert resource.is_closed and int(resource.handle) == 0
    with pytest.raises(asyncmr.PoolClosedError, match=rf"this cuda\.core\.{kind} is closed: it "
                                                      "holds no pool to adopt"):
        adopt(resource)


@pytest.mark.parametrize("make", [lambda: driver.CUmemoryPool(ADDRESS),
                                  lambda: runtime.cudaMemPool_t(ADDRESS)],
                         ids=["CUmemoryPool", "cudaMemPool_t"])
def test_cuda_bindings_pool_handles_pass_every_check(no_gpu, make):
    # Valid: they pass every check and reach the device, which this machine lacks.
    with pytest.raises(asyncmr.NoDeviceError):
        MemPool.from_handle(make())
    with pytest.raises(asyncmr.NoDeviceError):
        AsyncDeviceMR(pool=make())


def test_a_null_cuda_bindings_pool_is_refused():
    for null in (driver.CUmemoryPool(0), runtime.cudaMemPool_t(0)):
        with pytest.raises(ValueError, match="pool handle must be a non-zero 64-bit address, got 0"):
            MemPool.from_handle(null)


# ---- the wrapper's arguments (any machine) --------------------------------------------------------

@pytest.mark.parametrize("mr, name", [(object(), "object"), (None, "NoneType"),
                                      ("device", "str")])
def test_the_wrapper_takes_only_an_asyncmr_resource(wrapper, mr, name):
    with pytest.raises(TypeError, match=r"asyncmr\.cuda_core\.Resource wraps an asyncmr resource "
                                        rf"\(AsyncManagedMR, AsyncPinnedMR or AsyncDeviceMR\), got "
                                        rf"{name}$"):
        wrapper.Resource(mr)


def test_the_wrapper_refuses_an_rmm_resource(wrapper):
    import rmm

    with pytest.raises(TypeError, match=r"got rmm\..*CudaMemoryResource"):
        wrapper.Resource(rmm.mr.CudaMemoryResource())


def test_the_wrapper_is_a_cuda_core_memory_resource(cc, wrapper):
    assert issubclass(wrapper.Resource, cc.MemoryResource)


@pytest.fixture
def unbound(wrapper):
    """A Resource with no asyncmr resource behind it: a check that let bad input through would
    reach for the missing resource (AttributeError) instead of raising its own error."""
    return wrapper.Resource.__new__(wrapper.Resource)


STREAM_EXPECTED = (r"stream must be a cuda\.core Stream or GraphBuilder, or an object with "
                   r"__cuda_stream__ \(a CuPy, PyTorch, Numba or rmm stream\), got ")


@pytest.mark.parametrize("stream, name", [(None, "NoneType"), (0, "int"), ("default", "str"),
                                          (object(), "object"), (driver.CUdeviceptr(1),
                                                                 "cuda.bindings.driver.CUdeviceptr")])
def test_a_wrong_stream_type_is_refused_by_name(unbound, stream, name):
    with pytest.raises(TypeError, match=STREAM_EXPECTED + rf"{name}$"):
        unbound.allocate(MiB, stream=stream)
    with pytest.raises(TypeError, match=STREAM_EXPECTED + rf"{name}$"):
        unbound.deallocate(ADDRESS, MiB, stream=stream)


class _Foreign:
    """A stream of another library, as the CUDA stream protocol shows it."""

    def __init__(self, info):
        self.info = info

    def __cuda_stream__(self):
        return self.info


@pytest.mark.parametrize("info, exc, match", [
    ((1, ADDRESS), ValueError, r"must return \(0, handle\) with an int handle, got \(1, "),
    ((0, "0x10"), ValueError, r"must return \(0, handle\) with an int handle"),
    ((0, -1), ValueError, r"must return \(0, handle\) with an int handle"),
    (ADDRESS, TypeError, r"_Foreign\.__cuda_stream__\(\) must return \(0, handle\), got "),
    ((0, 1, 2), TypeError, r"must return \(0, handle\), got \(0, 1, 2\)"),
])
def test_a_stream_protocol_answer_that_names_no_stream_is_refused(unbound, info, exc, match):
    with pytest.raises(exc, match=match):
        unbound.allocate(MiB, stream=_Foreign(info))


@pytest.mark.parametrize("size, exc, match", [
    ("1", TypeError, "size must be an int number of bytes, got str"),
    (1.0, TypeError, "size must be an int number of bytes, got float"),
    (True, TypeError, "size must be an int number of bytes, got bool"),
    (-1, ValueError, r"size must be in \[0, 2\*\*64\), got -1"),
])
def test_a_bad_size_is_refused_by_name(unbound, cc, size, exc, match):
    stream = cc.Stream.from_handle(ADDRESS)
    with pytest.raises(exc, match=match):
        unbound.allocate(size, stream=stream)
    with pytest.raises(exc, match=match):
        unbound.deallocate(ADDRESS, size, stream=stream)


def test_streams_reach_asyncmr_by_their_handle(cc, wrapper):
    from rmm.pylibrmm.stream import Stream

    core = cc.Stream.from_handle(ADDRESS)
    kept, rmm_stream = wrapper._streams(core)
    assert kept is core and rmm_stream.__cuda_stream__() == (0, ADDRESS)
    for foreign in (_Foreign((0, ADDRESS)), Stream(_Foreign((0, ADDRESS)))):
        kept, rmm_stream = wrapper._streams(foreign)
        assert kept is None and rmm_stream.__cuda_stream__() == (0, ADDRESS)
    # What a Buffer records for a foreign stream: cuda.core's own default streams by handle.
    assert wrapper._core_stream(0) is cc.LEGACY_DEFAULT_STREAM
    assert wrapper._core_stream(1) is cc.LEGACY_DEFAULT_STREAM
    assert wrapper._core_stream(2) is cc.PER_THREAD_DEFAULT_STREAM
    assert wrapper._core_stream(ADDRESS).__cuda_stream__() == (0, ADDRESS)


def test_a_bad_address_to_free_is_refused_by_name(unbound, cc):
    with pytest.raises(TypeError, match="ptr must be an int address or a cuda.bindings "
                                        "CUdeviceptr, got str"):
        unbound.deallocate("0x10", MiB, stream=cc.Stream.from_handle(ADDRESS))


# ---- on the GPU ----------------------------------------------------------------------------------

@pytest.fixture
def dev(gpu, cc):
    device = cc.Device(0)
    device.set_current()
    return device


@pytest.fixture
def stream(dev):
    s = dev.create_stream()
    yield s
    s.sync()
    s.close()


def _cuda_ok(result):
    """The value of a cuda.bindings.runtime call, which must have succeeded."""
    err, *rest = result
    assert err == runtime.cudaError_t.cudaSuccess, err
    return rest[0] if len(rest) == 1 else tuple(rest)


def _malloc_free_sync(nbytes, stream):
    """What the simulation code does: a temporary from the device's current pool
    (cudaMallocAsync), freed in stream order (cudaFreeAsync), then a synchronization."""
    ptr = _cuda_ok(runtime.cudaMallocAsync(nbytes, stream.handle))
    assert runtime.cudaFreeAsync(ptr, stream.handle)[0] == runtime.cudaError_t.cudaSuccess
    stream.sync()


@contextlib.contextmanager
def _control_window(capture, outcomes):
    """Where asyncmr's control calls run: as they are, or while another thread captures a stream
    in global mode (PyTorch's default); that capture's outcome goes to ``outcomes``. cuda.core's
    own calls stay outside: beside a global capture the driver refuses them (they are not made in
    relaxed capture mode, docs/DRIVER_FACTS.md)."""
    if capture == "none":
        yield
        return
    cupy = require_module("cupy", "it captures on the other thread")
    with captured_elsewhere(cupy, "global") as outcome:
        yield
    outcomes.append(outcome.get("capture"))


def _windows_left_captures_valid(capture, outcomes):
    assert outcomes == ([] if capture == "none" else ["valid"] * len(outcomes)), outcomes
    assert capture == "none" or outcomes


CAPTURES = ["none", "global"]


@pytest.mark.parametrize("capture", CAPTURES)
def test_cuda_core_raises_the_default_pool_threshold_and_asyncmr_sets_it_back(dev, stream, cc,
                                                                              capture):
    outcomes = []
    default = MemPool.default(Location.device(0), "device")
    default.attributes.release_threshold = 0  # the driver's default, whatever ran before
    stream.sync()
    default.trim_to(0)
    baseline = default.attributes.reserved_mem_current  # only blocks others hold (0 alone)

    ccmr = cc.DeviceMemoryResource(0)
    assert ccmr.attributes.release_threshold == UINT64_MAX  # for the whole process
    pool = MemPool.from_handle(ccmr)
    assert pool == default and not pool.owned
    assert pool.location == Location.device(0) and pool.allocation_type == "device"

    nbytes = 8 * MiB
    _malloc_free_sync(nbytes, stream)
    assert default.attributes.reserved_mem_current >= nbytes  # kept after the synchronization

    with _control_window(capture, outcomes):
        pool.attributes.release_threshold = 0
    assert ccmr.attributes.release_threshold == 0  # cuda.core reads what asyncmr set

    _malloc_free_sync(nbytes, stream)  # given back at the next synchronization
    assert default.attributes.reserved_mem_current == baseline
    buf = ccmr.allocate(nbytes, stream=stream)  # cuda.core's own allocations too
    buf.close(stream)
    stream.sync()
    attrs = default.attributes
    assert attrs.reserved_mem_current == baseline
    assert attrs.used_mem_current > 0 or attrs.reserved_mem_current == 0
    _windows_left_captures_valid(capture, outcomes)


@pytest.mark.parametrize("capture", CAPTURES)
def test_a_phase_peak_of_cuda_core_allocations(dev, stream, cc, capture):
    outcomes = []
    ccmr = cc.DeviceMemoryResource(0, cc.DeviceMemoryResourceOptions())  # a pool of its own
    pool = MemPool.from_handle(ccmr)
    phases = {}
    for name, sizes in (("big", (MiB, 3 * MiB)), ("small", (512 * KiB,))):
        with _control_window(capture, outcomes):  # the phase opens: the marks are reset
            phases[name] = pool.track_peak(name).__enter__()
        buffers = [ccmr.allocate(n, stream=stream) for n in sizes]  # live at once
        for buf in buffers:
            buf.close(stream)
        stream.sync()
        with _control_window(capture, outcomes):  # the phase closes: its marks are read
            phases[name].__exit__(None, None, None)
    big, small = phases["big"], phases["small"]
    assert big.used >= 4 * MiB and big.reserved >= 4 * MiB
    assert 512 * KiB <= small.used < 4 * MiB
    assert ccmr.attributes.used_mem_high == small.used  # cuda.core reads the reset marks
    _windows_left_captures_valid(capture, outcomes)


@pytest.mark.parametrize("capture", CAPTURES)
def test_trim_to_on_a_cuda_core_pinned_pool(dev, stream, cc, capture):
    outcomes = []
    ccmr = cc.PinnedMemoryResource(cc.PinnedMemoryResourceOptions())  # a pool of its own
    pool = MemPool.from_handle(ccmr)
    assert pool.location == Location.host() and pool.allocation_type == "pinned"
    with _control_window(capture, outcomes):
        pool.attributes.release_threshold = UINT64_MAX  # keep what it reserves
    buf = ccmr.allocate(8 * MiB, stream=stream)
    buf.close(stream)
    stream.sync()
    assert pool.attributes.reserved_mem_current >= 8 * MiB
    assert pool.attributes.used_mem_current == 0
    with _control_window(capture, outcomes):
        pool.trim_to(0)
    assert ccmr.attributes.reserved_mem_current == 0  # cuda.core sees the trim
    _windows_left_captures_valid(capture, outcomes)


def test_adopted_cuda_core_pools_know_their_kind_and_route(dev, cc):
    for resource, loc, atype in [
            (cc.DeviceMemoryResource(0), Location.device(0), "device"),
            (cc.PinnedMemoryResource(), Location.host(), "pinned"),
            (cc.ManagedMemoryResource(), Location.none(), "managed")]:
        pool = MemPool.from_handle(resource)
        assert pool.handle == int(resource.handle) and not pool.owned
        assert (pool.location, pool.allocation_type) == (loc, atype)
        attrs = pool.attributes  # the 13.2 attributes, from what cuda.core says on older drivers
        assert (attrs.location_type, attrs.allocation_type) == (loc.kind, atype)
        flag = attrs.reuse_allow_opportunistic  # settable through asyncmr, read by cuda.core
        attrs.reuse_allow_opportunistic = not flag
        assert resource.attributes.reuse_allow_opportunistic == (not flag)
        attrs.reuse_allow_opportunistic = flag
        # cuda.core's resources made without options wrap the current pool of their kind.
        assert pool == MemPool.current(loc, atype)
        with MemPool.create(loc, atype) as other:
            with other.as_current():
                assert MemPool.current(loc, atype) == other
                with pool.as_current():  # the adopted pool routes on a 13.0 driver too
                    assert MemPool.current(loc, atype) == pool
            assert MemPool.current(loc, atype) == pool


def test_adoption_keeps_a_cuda_core_resource_alive(dev, stream, cc):
    ccmr = cc.DeviceMemoryResource(0, cc.DeviceMemoryResourceOptions())  # owns its pool
    alive = weakref.ref(ccmr)
    pool = MemPool.from_handle(ccmr)
    mr = AsyncDeviceMR(pool=ccmr, release_threshold=0)
    del ccmr
    gc.collect()
    assert alive() is not None  # so its pool is not destroyed under asyncmr's views
    mr.deallocate(mr.allocate(MiB, stream=_rmm(stream)), MiB, _rmm(stream))
    stream.sync()
    pool.attributes.release_threshold = MiB
    assert mr.attributes.release_threshold == MiB
    del pool
    gc.collect()
    assert alive() is not None  # the resource's pool keeps it too
    del mr
    gc.collect()
    assert alive() is None


def _rmm(stream):
    from rmm.pylibrmm.stream import Stream

    return Stream(stream)


def test_a_cuda_core_pool_is_adopted_as_a_view_and_as_it_is(dev, cc):
    ccmr = cc.DeviceMemoryResource(0)
    with pytest.raises(ValueError, match=r"the pool of a cuda\.core\.DeviceMemoryResource is its "
                                         r"resource's to destroy: adopt it with owned=False"):
        MemPool.from_handle(ccmr, owned=True)
    with pytest.raises(ValueError, match=r"location=Location\.host\(\), but the pool of this "
                                         r"cuda\.core\.DeviceMemoryResource is at "
                                         r"Location\.device\(0\)"):
        MemPool.from_handle(ccmr, location=Location.host())
    with pytest.raises(ValueError, match=r"allocation_type='managed', but the pool of this "
                                         r"cuda\.core\.DeviceMemoryResource is 'device'"):
        MemPool.from_handle(ccmr, allocation_type="managed")
    with pytest.raises(TypeError, match="location must be an asyncmr.Location"):
        MemPool.from_handle(ccmr, location="device")
    same = MemPool.from_handle(ccmr, location=Location.device(0), allocation_type="device")
    assert same.handle == int(ccmr.handle)


def test_a_closed_cuda_core_resource_is_not_adopted(dev, cc):
    ccmr = cc.DeviceMemoryResource(0, cc.DeviceMemoryResourceOptions())
    ccmr.close()
    with pytest.raises(asyncmr.PoolClosedError, match=r"this cuda\.core\.DeviceMemoryResource is "
                                                      "closed"):
        MemPool.from_handle(ccmr)
    with pytest.raises(asyncmr.PoolClosedError):
        AsyncDeviceMR(pool=ccmr)


def test_cuda_core_managed_resource_follows_as_current(dev, stream, cc):
    # ManagedMemoryResource() wraps the current managed pool of no preferred location.
    before = int(cc.ManagedMemoryResource().handle)
    assert before == MemPool.current(Location.none(), "managed").handle
    with MemPool.create(Location.none(), "managed") as pool:
        with pool.as_current():
            routed = cc.ManagedMemoryResource()
            assert int(routed.handle) == pool.handle
            buf = routed.allocate(MiB, stream=stream)
            stream.sync()
            assert pool.attributes.used_mem_current >= MiB
            buf.close(stream)
            stream.sync()
            del routed
        assert int(cc.ManagedMemoryResource().handle) == before  # restored
        assert pool.attributes.used_mem_current == 0


# ---- asyncmr's pools behind cuda.core -----------------------------------------------------------

KERNEL = r'''
extern "C" __global__ void twice_plus_one(int* data, unsigned int n)
{
    unsigned int const i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { data[i] = 2 * data[i] + 1; }
}
'''


def _kernel(cc, dev):
    try:
        program = cc.Program(KERNEL, code_type="c++",
                             options=cc.ProgramOptions(arch=f"sm_{dev.arch}"))
        return program.compile("cubin").get_kernel("twice_plus_one")
    except Exception as e:  # noqa: BLE001 - NVRTC missing: the reason names it
        if type(e).__name__ != "DynamicLibNotFoundError":
            raise
        skip_or_fail(f"cuda.core cannot load NVRTC to compile the test kernel: {e}")


@pytest.mark.parametrize("make", [AsyncManagedMR, AsyncPinnedMR], ids=["managed", "pinned"])
def test_a_cuda_core_kernel_reads_and_writes_an_asyncmr_buffer(dev, stream, cc, wrapper, make):
    kernel = _kernel(cc, dev)
    res = wrapper.Resource(make())
    n = 4096
    buf = res.allocate(n * 4, stream=stream)
    assert buf.memory_resource is res and buf.size == n * 4
    stream.sync()  # the host touches the block only once its stream reached the allocation
    host = host_view(int(buf.handle), n)
    host[:] = np.arange(n, dtype=np.int32)
    config = cc.LaunchConfig(grid=(n + 255) // 256, block=256)
    cc.launch(stream, config, kernel, buf, np.uint32(n))
    stream.sync()
    assert np.array_equal(host, 2 * np.arange(n, dtype=np.int32) + 1)
    used = res.pool.attributes.used_mem_current
    buf.close(stream)
    stream.sync()
    assert res.pool.attributes.used_mem_current <= used - n * 4


@pytest.mark.parametrize("make, kind", [
    (lambda: AsyncDeviceMR(), "device"),
    (lambda: AsyncManagedMR(), "managed"),
    (lambda: AsyncPinnedMR(), "pinned")], ids=["device", "managed", "pinned"])
def test_the_wrapper_says_what_its_pool_holds(dev, stream, cc, wrapper, make, kind):
    res = wrapper.Resource(make())
    expected = {"device": (True, False, False, 0), "managed": (True, True, True, 0),
                "pinned": (True, True, False, -1)}[kind]
    said = (res.is_device_accessible, res.is_host_accessible, res.is_managed, res.device_id)
    assert said == expected
    buf = res.allocate(64 * KiB, stream=stream)
    assert buf.memory_resource is res and buf.device_id == expected[3]
    assert isinstance(buf, cc.ManagedBuffer) == (kind == "managed")  # with cuda.core's advice API
    assert res.attributes.used_mem_current >= 64 * KiB and res.pool == res.mr.pool
    buf.close(stream)


def test_buffers_go_back_to_asyncmr_in_stream_order(dev, stream, cc, wrapper):
    res = wrapper.Resource(AsyncDeviceMR(pool="new"))
    attrs = res.pool.attributes
    closed = res.allocate(MiB, stream=stream)
    collected = res.allocate(MiB, stream=stream)
    stream.sync()
    assert attrs.used_mem_current >= 2 * MiB
    closed.close(stream)
    del collected  # freed on the stream it was allocated on
    gc.collect()
    stream.sync()
    assert attrs.used_mem_current == 0
    with pytest.raises(TypeError, match=STREAM_EXPECTED + "int$"):
        res.allocate(MiB, stream=0)
    assert attrs.used_mem_current == 0  # nothing was allocated


def test_a_foreign_stream_allocates_and_frees(dev, cc, wrapper):
    cupy = require_module("cupy", "its stream is the foreign one")
    res = wrapper.Resource(AsyncDeviceMR(pool="new"))
    cs = cupy.cuda.Stream(non_blocking=True)
    buf = res.allocate(MiB, stream=cs)
    cs.synchronize()
    assert res.pool.attributes.used_mem_current >= MiB
    buf.close()  # on the CuPy stream, which cuda.core knows by its handle
    cs.synchronize()
    assert res.pool.attributes.used_mem_current == 0


def test_the_front_cache_and_the_recording_work_through_the_wrapper(dev, stream, wrapper):
    res = wrapper.Resource(AsyncDeviceMR(pool="new", cache=8 * MiB))
    with res.mr.record_history(stacks="python") as h:
        first = res.allocate(64 * KiB, stream=stream)
        address = int(first.handle)
        live = h.outstanding()
        first.close()  # on its allocation stream, into the cache
        second = res.allocate(64 * KiB, stream=stream)
        assert int(second.handle) == address  # the block came back from the cache
        second.close(stream)
    info = res.mr.cache_info
    assert info["hits"] == 1 and info["misses"] == 1
    events = [e for e in h.history().events if e["action"] not in ("grow", "trim")]
    assert [e["action"] for e in events] == ["alloc", "cache_put", "cache_hit", "cache_put"]
    assert events[0]["stream"] == int(stream.handle) and events[0]["address"] == address
    # The stack names the caller, not asyncmr's wrapper.
    assert live[0]["frames"][0]["name"] == (
        "test_the_front_cache_and_the_recording_work_through_the_wrapper")


def test_prefetch_works_through_the_wrapper(dev, stream, wrapper):
    from test_prefetch import CPU, last_prefetch

    res = wrapper.Resource(AsyncManagedMR(pool="new", prefetch="host"))
    buf = res.allocate(2 * MiB, stream=stream)
    stream.sync()
    assert last_prefetch(int(buf.handle), 2 * MiB) == CPU
    buf.close(stream)


@pytest.mark.parametrize("make", [lambda: AsyncDeviceMR(pool="new"),
                                  lambda: AsyncManagedMR(pool="new")], ids=["device", "managed"])
def test_a_graph_allocates_from_a_pool_on_the_device(dev, stream, cc, wrapper, make):
    res = wrapper.Resource(make())
    out = wrapper.Resource(AsyncManagedMR()).allocate(64 * KiB, stream=stream)
    out.fill(0, stream=stream)
    stream.sync()
    builder = stream.create_graph_builder().begin_building()
    scratch = res.allocate(64 * KiB, stream=builder)  # a graph allocation node
    scratch.fill(7, stream=builder)
    out.copy_from(scratch, stream=builder)
    scratch.close(builder)  # a graph free node
    graph = builder.end_building().complete()
    graph.launch(stream)
    stream.sync()
    assert (host_view(int(out.handle), 64 * KiB, np.uint8) == 7).all()
    graph.close()
    builder.close()
    out.close(stream)


@pytest.mark.parametrize("make", [lambda: AsyncPinnedMR(pool="new"),
                                  lambda: AsyncManagedMR(pool="new", location=Location.host())],
                         ids=["pinned", "managed@host"])
def test_a_graph_cannot_allocate_from_a_host_pool_and_stays_valid(dev, stream, wrapper, make):
    res = wrapper.Resource(make())
    builder = stream.create_graph_builder().begin_building()
    with pytest.raises(asyncmr.UnsupportedError, match="inside a stream capture"):
        res.allocate(4 * KiB, stream=builder)
    graph = builder.end_building().complete()  # the capture is still valid
    graph.launch(stream)
    stream.sync()
    graph.close()
    builder.close()
    assert res.pool.attributes.used_mem_current == 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
