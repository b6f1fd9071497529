# SPDX-License-Identifier: Apache-2.0
"""asyncmr.dask: the worker plugin and the cluster-wide pool helpers.

CPU tests: argument checks, the refusal message for dask-cuda's rmm_* options (built from
dask-cuda's real RMMSetup plugin), and the plugin on a worker without a GPU. GPU tests run
LocalCUDACluster workers (one per GPU): a dask.array-on-CuPy workload whose results are
checked against NumPy, each worker's resource verified from the worker, per-worker peaks,
trim_to(0) on every worker, and the rmm_pool_size conflict.

Functions sent to the workers with client.run are made inside the tests, so cloudpickle ships
them by value and the workers need not import this file.
"""

import pickle
import time

import numpy as np
import pytest

pytest.importorskip("distributed", reason="asyncmr.dask needs Dask's distributed")

import asyncmr  # noqa: E402
import asyncmr.dask as amd  # noqa: E402

# Generous startup (workers import CuPy and RMM), small work.
TIMEOUT = "180s"
CLUSTER = dict(threads_per_worker=1, dashboard_address=None, silence_logs=40)


def rows(table):
    """pool_state/peaks/trim_to answer a DataFrame when pandas is there, else dicts."""
    return table.to_dict("records") if hasattr(table, "to_dict") else list(table)


# ---- CPU -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(kind="pinned"), ValueError, "wrong door|names a direction"),
    (dict(kind="host"), ValueError, "kind must be one of"),
    (dict(pool=5), TypeError, "do not cross processes"),
    (dict(pool="shared"), ValueError, "pool must be one of"),
    (dict(release_threshold="lots"), ValueError, "not a byte count"),
    (dict(release_threshold=-1), ValueError, "release_threshold"),
    (dict(release_threshold=1.5), TypeError, "release_threshold"),
    (dict(release_threshold="1e400"), ValueError, "release_threshold '1e400'"),
    (dict(release_threshold=""), ValueError, "release_threshold '' is not a byte count"),
    (dict(cupy="yes"), TypeError, "cupy must be a bool"),
    (dict(replace_existing=1), TypeError, "replace_existing must be a bool"),
    (dict(name=""), ValueError, "name"),
])
def test_plugin_arguments_are_checked(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        amd.AsyncMRPlugin(**kwargs)


@pytest.mark.parametrize("kwargs,what", [
    (dict(kind=1), "kind"), (dict(kind=None), "kind"), (dict(kind=["managed"]), "kind"),
    (dict(kind=b"managed"), "kind"), (dict(name=5), "name"), (dict(name=None), "name"),
    (dict(name=b"asyncmr"), "name"),
])
def test_a_plugin_argument_of_the_wrong_type_is_a_type_error(kwargs, what):
    # As pool=5, cupy="yes" and release_threshold=1.5 are: a wrong type is a TypeError naming
    # the argument and the type, a wrong str a ValueError.
    got = type(kwargs[what])
    with pytest.raises(TypeError, match=rf"^{what} must be .*, got {got.__name__}$"):
        amd.AsyncMRPlugin(**kwargs)


@pytest.mark.parametrize("name,exc", [(5, TypeError), (None, TypeError), ("", ValueError)])
def test_the_helpers_check_the_plugin_name_before_they_ask_the_cluster(name, exc):
    # A name no plugin can have was sent to every worker, each answering LookupError (or, for
    # the recording and the phase, once the with block began).
    client = object()  # never asked: the name is refused first
    calls = [lambda: amd.pool_state(client, name=name), lambda: amd.peaks(client, name=name),
             lambda: amd.reset_peaks(client, name=name),
             lambda: amd.trim_to(client, 0, name=name),
             lambda: amd.track_peaks(client, name=name),
             lambda: amd.record_history(client, name=name),
             lambda: amd.worker_resource(client, name=name)]
    for call in calls:
        with pytest.raises(exc, match="^name must be a non-empty str, got "):
            call()


def test_plugin_settings_and_pickling():
    plugin = amd.AsyncMRPlugin("device", pool="new", release_threshold="1 GiB", cupy=False)
    assert (plugin.kind, plugin.pool, plugin.release_threshold, plugin.cupy) == (
        "device", "new", 1 << 30, False)
    assert plugin.name == "asyncmr"
    again = pickle.loads(pickle.dumps(plugin))
    assert repr(again) == repr(plugin) and again._mr is None


def test_trim_to_checks_its_argument():
    with pytest.raises(ValueError, match="min_bytes_to_keep"):
        amd.trim_to(None, -5)


def test_conflict_message_names_dask_cuda_options():
    plugins = pytest.importorskip("dask_cuda.plugins")
    assert amd.conflict_message("CudaMemoryResource") is None  # RMM's untouched default
    setup = plugins.RMMSetup(
        initial_pool_size="256MiB", maximum_pool_size="1GiB", managed_memory=False,
        async_alloc=False, release_threshold=None, log_directory=None,
        track_allocations=True, external_lib_list=["cupy"])
    text = amd.conflict_message("PoolMemoryResource", setup, "tcp://127.0.0.1:1234")
    assert "PoolMemoryResource" in text and "tcp://127.0.0.1:1234" in text
    assert "rmm_pool_size='256MiB'" in text and "rmm_maximum_pool_size='1GiB'" in text
    assert "rmm_track_allocations=True" in text and "replace_existing=True" in text
    assert "rmm_managed_memory" not in text and "rmm_allocator_external_lib_list" not in text
    other = amd.conflict_message("CudaAsyncMemoryResource")
    assert "preload" in other and "replace_existing=True" in other


def test_plugin_on_a_worker_without_gpu(no_gpu):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, processes=False, **CLUSTER) as cluster, \
            Client(cluster) as client:
        with pytest.raises(asyncmr.NoDeviceError, match="CUDA"):
            client.register_plugin(amd.AsyncMRPlugin())
        # A plugin whose setup failed installed nothing the helpers could use.
        with pytest.raises(LookupError, match="no asyncmr plugin named 'asyncmr'"):
            amd.pool_state(client)


def _mark(tag, dask_worker):  # a phase's start on a worker: fails where told to
    if dask_worker.name == "refuses":
        raise RuntimeError(f"refused {tag}")
    dask_worker._asyncmr_test_open = getattr(dask_worker, "_asyncmr_test_open", set()) | {tag}
    return dask_worker.address


def _unmark(tag, dask_worker):
    dask_worker._asyncmr_test_open.remove(tag)  # KeyError where nothing was opened
    return {"worker": dask_worker.address}


def test_workers_open_and_close_together_and_only_where_they_opened():
    # The helpers both phases and recordings use, on a real (CPU) cluster: a start that fails
    # on one worker is undone on the others; the end asks exactly the workers that started, not
    # one that joined since.
    import dask
    from distributed import Client, LocalCluster, Worker

    with LocalCluster(n_workers=0, processes=False, **CLUSTER) as cluster, \
            Client(cluster) as client:
        ok = client.sync(lambda: Worker(cluster.scheduler_address, name="ok", nthreads=1))
        bad = client.sync(lambda: Worker(cluster.scheduler_address, name="refuses", nthreads=1))
        try:
            with pytest.raises(RuntimeError, match="refused one"):
                amd._open_on_workers(client, None, _mark, _unmark, "one")
            assert ok._asyncmr_test_open == set()  # undone where it ran
            opened = amd._open_on_workers(client, [ok.address], _mark, _unmark, "two")
            assert opened == [ok.address]
            late = client.sync(lambda: Worker(cluster.scheduler_address, name="late",
                                              nthreads=1))
            client.wait_for_workers(3)
            answers, errors = amd._close_on_workers(client, opened, _unmark, "two")
            assert answers == {ok.address: {"worker": ok.address}} and errors == {}
            assert not hasattr(late, "_asyncmr_test_open")
            # A worker that left is reported, and the others' answers kept.
            amd._open_on_workers(client, [ok.address, late.address], _mark, _unmark, "three")
            client.sync(late.close)
            while late.address in client.scheduler_info()["workers"]:
                time.sleep(0.01)
            with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):  # it is gone
                answers, errors = amd._close_on_workers(client, [ok.address, late.address],
                                                        _unmark, "three")
            assert list(answers) == [ok.address] and list(errors) == [late.address], errors
        finally:
            for w in (ok, bad):
                client.sync(w.close)


# ---- GPU -----------------------------------------------------------------------------------

@pytest.fixture
def cuda_cluster(gpu):
    """LocalCUDACluster(n_workers=...) and a Client, torn down afterwards."""
    import dask
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    made = []

    def make(n_workers, **kwargs):
        with dask.config.set({"distributed.comm.timeouts.connect": TIMEOUT}):
            cluster = LocalCUDACluster(n_workers=n_workers, **CLUSTER, **kwargs)
            made.append(cluster)
            client = Client(cluster, timeout=TIMEOUT)
            made.append(client)
        return client

    yield make
    for thing in reversed(made):
        thing.close()


def worker_view(client):
    """Each worker's own account of its resource, pool, CuPy allocator and device."""

    def look(dask_worker):
        import os

        import cupy
        import rmm
        from rmm.allocators.cupy import rmm_cupy_allocator

        import asyncmr
        import asyncmr.dask

        mr = asyncmr.dask.worker_resource(dask_worker)
        return {
            "resource": type(mr).__name__,
            "is_current": rmm.mr.get_current_device_resource() is mr,
            "default_managed_pool": mr.pool_handle == asyncmr.MemPool.default(
                asyncmr.Location.device(0), "managed").handle,
            "cupy_through_rmm": cupy.cuda.get_allocator() is rmm_cupy_allocator,
            "device": cupy.cuda.runtime.getDevice(),
            "pci_bus_id": cupy.cuda.Device(0).pci_bus_id,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    return client.run(look)


def workload(client):
    """Blockwise, rechunk and reduction on CuPy chunks made on the workers; checked against
    NumPy on the same numbers."""
    import cupy
    import dask.array as da

    rs = da.random.RandomState(1234, RandomState=cupy.random.RandomState)
    x = rs.standard_normal((1024, 1024), chunks=(128, 128)).persist()  # 64 root chunks
    y = (x * 2.0 + 1.0).rechunk((1024, 64))  # column strips gather from every row block
    z = (y ** 2).sum(axis=0)
    to_host = dict(dtype=np.float64, meta=np.empty((0,), np.float64))
    got = z.map_blocks(cupy.asnumpy, **to_host).compute()
    x_np = x.map_blocks(cupy.asnumpy, dtype=np.float64,
                        meta=np.empty((0, 0), np.float64)).compute()
    np.testing.assert_allclose(got, ((x_np * 2.0 + 1.0) ** 2).sum(axis=0), rtol=1e-10)
    del x, y, z


def wait_until_workers_hold_nothing(client, seconds=60):
    deadline = time.monotonic() + seconds
    while True:
        held = client.run(lambda dask_worker: len(dask_worker.data))
        if not any(held.values()) or time.monotonic() > deadline:
            return held
        time.sleep(0.2)


def run_and_check(client, n_workers):
    client.register_plugin(amd.AsyncMRPlugin("managed"))
    views = worker_view(client)
    assert len(views) == n_workers
    for address, view in views.items():
        assert view["resource"] == "AsyncManagedMR", (address, view)
        assert view["is_current"] and view["default_managed_pool"], (address, view)
        assert view["cupy_through_rmm"] and view["device"] == 0, (address, view)
    # dask-cuda put each worker on its own GPU, as device 0 there.
    assert len({v["pci_bus_id"] for v in views.values()}) == n_workers, views

    with amd.track_peaks(client) as phase:
        workload(client)
    assert len(phase.by_worker) == n_workers
    for address, (used, reserved) in phase.by_worker.items():
        assert used > 0 and reserved >= used, (address, used, reserved)

    state = rows(amd.pool_state(client))
    assert {r["resource"] for r in state} == {"AsyncManagedMR"}
    assert all(r["is_current"] and r["reserved_mem_current"] > 0 for r in state), state

    held = wait_until_workers_hold_nothing(client)
    assert not any(held.values()), held
    trimmed = rows(amd.trim_to(client, 0))
    assert len(trimmed) == n_workers
    for r in trimmed:
        assert r["reserved_after"] < r["reserved_before"], r
    return phase


def test_two_workers_on_two_gpus(two_gpus, cuda_cluster):
    client = cuda_cluster(2)
    run_and_check(client, 2)
    moved = client.run(lambda dask_worker: len(dask_worker.transfer_incoming_log))
    assert sum(moved.values()) > 0, moved  # data went from one worker (GPU) to the other


def test_one_worker(cuda_cluster):
    client = cuda_cluster(1)
    run_and_check(client, 1)


def test_nested_phases_each_keep_their_own_peak(cuda_cluster):
    # The inner phase's start resets the workers' marks; the outer phase still reports the
    # 16 MiB it peaked at before (a worker-side peak tracker per phase).
    client = cuda_cluster(1)
    client.register_plugin(amd.AsyncMRPlugin("device", pool="new"))

    def peak(nbytes, dask_worker):  # a block made and freed on the worker
        import cupy

        mr = amd.worker_resource(dask_worker)
        mr.deallocate(mr.allocate(nbytes), nbytes)
        cupy.cuda.Device().synchronize()
        mr.trim_to()  # the reserve falls back too, so the inner reset lowers both marks

    with amd.track_peaks(client) as outer:
        client.run(peak, 16 << 20)
        with amd.track_peaks(client) as inner:
            client.run(peak, 1 << 20)
    (used_outer, reserved_outer), = outer.by_worker.values()
    (used_inner, reserved_inner), = inner.by_worker.values()
    assert used_outer >= 16 << 20 and reserved_outer >= 16 << 20, outer.by_worker  # 1 MiB before
    assert (1 << 20) <= used_inner < 16 << 20, inner.by_worker
    assert rows(outer.table)[0]["used_mem_high"] == used_outer
    # Both phases ended: nothing is left open on the worker.
    assert client.run(lambda dask_worker: len(amd._PHASES)) == {a: 0 for a in outer.by_worker}


def test_a_clusters_histories_are_gathered_into_one_file(cuda_cluster, tmp_path):
    from asyncmr.history import load_many

    client = cuda_cluster(1)
    client.register_plugin(amd.AsyncMRPlugin("device", pool="new"))
    with pytest.raises(ValueError, match="max_events"):
        amd.record_history(client, max_events=0)
    with amd.record_history(client, max_events=4096) as h:
        workload(client)  # on the recorded resource (run_and_check registers another plugin)
        with pytest.raises(RuntimeError, match="already"):
            with amd.record_history(client):
                pass
    assert len(h.histories) == 1
    (address, history), = h.histories.items()
    assert history.header["worker"] == address and len(history) > 0
    assert any(e["action"] in ("alloc", "cache_hit") for e in history.events)
    path = tmp_path / "cluster.json.gz"
    h.save(path)
    back = load_many(path)
    assert list(back) == [address] and back[address].events == history.events
    with amd.record_history(client):  # the outer one stopped cleanly: a new one starts
        pass


async def _start_nanny(address):
    from distributed import Nanny

    return await Nanny(address, nthreads=1, silence_logs=40)


def test_a_worker_joining_during_a_recording_and_a_phase_loses_no_ones_results(cuda_cluster):
    # Both used to end on every worker there was at the end: the one that joined had nothing
    # open, and its LookupError threw away every other worker's history (already stopped).
    client = cuda_cluster(1)
    client.register_plugin(amd.AsyncMRPlugin("device", pool="new"))
    first, = client.scheduler_info()["workers"]

    def touch(nbytes, dask_worker):
        mr = amd.worker_resource(dask_worker)
        mr.deallocate(mr.allocate(nbytes), nbytes)

    with amd.record_history(client) as h, amd.track_peaks(client) as phase:
        client.run(touch, 4 << 20)
        nanny = client.sync(_start_nanny, client.scheduler.address)
        try:
            client.wait_for_workers(2, timeout=180)
            joined = set(client.scheduler_info()["workers"]) - {first}
            client.run(touch, 1 << 20)  # the new worker has the plugin's resource too
        except BaseException:
            client.sync(nanny.close)
            raise
    try:
        assert len(joined) == 1
        assert list(h.histories) == [first] and h.failed == {}, (h.histories, h.failed)
        assert any(e["action"] == "alloc" and e["bytes"] == 4 << 20
                   for e in h.histories[first].events)
        assert list(phase.by_worker) == [first] and phase.failed == {}, phase.failed
        assert phase.by_worker[first][0] >= 4 << 20, phase.by_worker
        # Nothing was left open anywhere, the new worker included.
        assert set(client.run(lambda dask_worker: len(amd._RECORDINGS) + len(amd._PHASES))
                   .values()) == {0}
    finally:
        client.sync(nanny.close)


def test_rmm_pool_size_conflicts_unless_replaced(cuda_cluster):
    client = cuda_cluster(1, rmm_pool_size="256MiB")
    with pytest.raises(amd.ResourceConflictError, match="rmm_pool_size") as info:
        client.register_plugin(amd.AsyncMRPlugin("managed"))
    assert "PoolMemoryResource" in str(info.value)

    def current(dask_worker):
        import rmm

        return type(rmm.mr.get_current_device_resource()).__name__

    assert set(client.run(current).values()) == {"PoolMemoryResource"}  # left as it was

    # Same name: replaces the refused plugin. The pool resource is kept for the teardown.
    client.register_plugin(amd.AsyncMRPlugin("managed", replace_existing=True))
    assert set(client.run(current).values()) == {"AsyncManagedMR"}
    client.unregister_worker_plugin("asyncmr")
    assert set(client.run(current).values()) == {"PoolMemoryResource"}
