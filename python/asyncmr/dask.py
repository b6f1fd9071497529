# SPDX-License-Identifier: Apache-2.0
"""asyncmr on Dask(-CUDA) workers: a worker plugin and cluster-wide pool helpers.

::

    from dask_cuda import LocalCUDACluster
    from distributed import Client
    import asyncmr.dask

    cluster = LocalCUDACluster(n_workers=2)          # no rmm_* options: see below
    client = Client(cluster)
    client.register_plugin(asyncmr.dask.AsyncMRPlugin("managed"))
    with asyncmr.dask.track_peaks(client) as phase:
        result = work.compute()
    print(phase.table)                               # per-worker peaks of this phase
    print(asyncmr.dask.pool_state(client))           # every worker's pool attributes
    asyncmr.dask.trim_to(client, 0)                  # every worker gives unused memory back

Each worker makes its resource on its current device. dask-cuda starts every worker with
``CUDA_VISIBLE_DEVICES`` rotated so that the worker's own GPU comes first ("0,1" for the
first worker of two, "1,0" for the second), so that device is device 0 there.

Order on a worker, and dask-cuda's ``rmm_*`` options
----------------------------------------------------
A worker runs, in this order: its preloads (``--preload``), the plugins it was built with
(dask-cuda's ``RMMSetup``, which applies ``rmm_pool_size``, ``rmm_maximum_pool_size``,
``rmm_managed_memory``, ``rmm_async``, ``rmm_release_threshold``, ``rmm_log_directory`` and
``rmm_track_allocations``), then the plugins registered through the scheduler
(``client.register_plugin``), on the workers present and on each worker that joins later.
:class:`AsyncMRPlugin` therefore comes last. If by then RMM's current device resource is no
longer RMM's untouched default (a ``CudaMemoryResource``), someone configured it (usually
those ``rmm_*`` options), and the plugin refuses with :class:`ResourceConflictError`, naming
the resource it found and the options that set it; ``client.register_plugin`` raises that
error. Leave those options out, or pass ``replace_existing=True`` to put the asyncmr resource
in front anyway (the previous resource is kept alive, and restored when the plugin is removed
with ``client.unregister_worker_plugin``). ``rmm_allocator_external_lib_list`` does not
conflict: it only routes CuPy or PyTorch through RMM.

Importing this module imports ``distributed``; ``import asyncmr`` does not.
"""

from __future__ import annotations

import os
import uuid

try:
    from distributed import WorkerPlugin
except ImportError as _missing:  # pragma: no cover - depends on the environment
    raise ImportError(
        "asyncmr.dask needs Dask's distributed (pip install dask-cuda, which brings it)") from _missing

from asyncmr._exceptions import AsyncMRError
from asyncmr._validate import choice as _choice
from asyncmr._validate import size as _size
from asyncmr._validate import type_name as _type_name

__all__ = [
    "AsyncMRPlugin",
    "ClusterHistory",
    "PhasePeaks",
    "ResourceConflictError",
    "peaks",
    "pool_state",
    "record_history",
    "reset_peaks",
    "track_peaks",
    "trim_to",
    "worker_resource",
]

KINDS = ("managed", "device")
POOLS = ("default", "current", "new")
DEFAULT_NAME = "asyncmr"

# dask-cuda's RMMSetup attribute -> the LocalCUDACluster / `dask cuda worker` option behind it.
_RMM_SETUP_OPTIONS = (
    ("initial_pool_size", "rmm_pool_size"),
    ("maximum_pool_size", "rmm_maximum_pool_size"),
    ("managed_memory", "rmm_managed_memory"),
    ("async_alloc", "rmm_async"),
    ("release_threshold", "rmm_release_threshold"),
    ("log_directory", "rmm_log_directory"),
    ("rmm_track_allocations", "rmm_track_allocations"),
)


class ResourceConflictError(AsyncMRError):
    """RMM's current device resource on a worker was already configured by someone else
    (dask-cuda's ``rmm_*`` options, a preload, another plugin)."""


def _name(name) -> str:
    """A plugin's name: a non-empty str (TypeError for another type, ValueError for "")."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a non-empty str, got {_type_name(name)}")
    if not name:
        raise ValueError("name must be a non-empty str, got ''")
    return name


def _threshold(value):
    if isinstance(value, str):
        from dask.utils import parse_bytes

        text = value
        try:
            if not text.strip():
                raise ValueError("it is empty")
            value = parse_bytes(text)
        except (ValueError, OverflowError) as e:  # OverflowError: "1e400" is infinite
            raise ValueError(f"release_threshold {text!r} is not a byte count: {e}") from None
    return _size("release_threshold", value)


class AsyncMRPlugin(WorkerPlugin):
    """Puts an asyncmr resource under RMM on every worker; register it with
    ``client.register_plugin(AsyncMRPlugin(...))``.

    Parameters
    ----------
    kind : {"managed", "device"}
        ``AsyncManagedMR`` or ``AsyncDeviceMR`` on the worker's current device (its GPU under
        dask-cuda). Pinned memory is not offered: RMM's device resource is the wrong door for
        it (copies that name a direction, which Dask's CuPy serialization makes, fail on pool
        pinned memory).
    pool : {"default", "current", "new"}
        Which pool of that device each worker uses (handles and MemPool objects do not cross
        processes). "default" and "current" are shared with everything else in the worker
        process; "new" is owned by the resource.
    release_threshold : int or str, optional
        Bytes (``"4GiB"`` is parsed by ``dask.utils.parse_bytes``); as for the resource.
    cupy : bool, default True
        Also route the worker's CuPy allocations through RMM
        (``cupy.cuda.set_allocator(rmm.allocators.cupy.rmm_cupy_allocator)``).
    replace_existing : bool, default False
        Replace a device resource someone else configured (see the module notes) instead of
        refusing with :class:`ResourceConflictError`.
    name : str, default "asyncmr"
        The plugin's name; registering another plugin under the same name replaces this one,
        and the helpers find the resource by it.

    Process-wide effects on each worker: RMM's current device resource (and CuPy's allocator
    with ``cupy=True``) change for the worker process, and the resource's own effects apply
    (a shared pool's release threshold of 0 is raised to the maximum). Removing the plugin
    (``client.unregister_worker_plugin(name)``) restores both. The plugin keeps the resource
    alive while it is installed.
    """

    idempotent = False

    def __init__(self, kind="managed", *, pool="default", release_threshold=None, cupy=True,
                 replace_existing=False, name=DEFAULT_NAME):
        if isinstance(kind, str) and kind == "pinned":
            raise ValueError(
                "kind='pinned' is not offered: as RMM's device resource, pool pinned memory "
                "fails every copy that names a direction (Dask moves CuPy data with those); "
                "use asyncmr.cupy.set_pinned_allocator or asyncmr.pinned_empty on the "
                "worker for pinned staging")
        _choice(f"kind must be one of {KINDS}", kind, KINDS)
        if not isinstance(pool, str):
            raise TypeError(
                f"pool must be one of {POOLS} (handles and MemPool objects do not cross "
                f"processes), got {type(pool).__name__}")
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
        for flag, value in (("cupy", cupy), ("replace_existing", replace_existing)):
            if not isinstance(value, bool):
                raise TypeError(f"{flag} must be a bool, got {type(value).__name__}")
        _name(name)
        self.kind = kind
        self.pool = pool
        self.release_threshold = _threshold(release_threshold)
        self.cupy = cupy
        self.replace_existing = replace_existing
        self.name = name
        # Worker-side state; underscored so that tools which pickle a worker's plugin
        # settings (dask-cuda's get_worker_config) leave it out.
        self._mr = None
        self._previous_mr = None
        self._previous_cupy = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(_mr=None, _previous_mr=None, _previous_cupy=None)
        return state

    def __repr__(self):
        return (f"AsyncMRPlugin({self.kind!r}, pool={self.pool!r}, "
                f"release_threshold={self.release_threshold!r}, cupy={self.cupy}, "
                f"replace_existing={self.replace_existing}, name={self.name!r})")

    def _make_resource(self):
        import asyncmr

        cls = asyncmr.AsyncManagedMR if self.kind == "managed" else asyncmr.AsyncDeviceMR
        return cls(pool=self.pool, release_threshold=self.release_threshold)

    def setup(self, worker=None):
        import asyncmr
        import rmm

        asyncmr.device_count()  # NoDeviceError, with asyncmr's reason, on a worker without CUDA
        current = rmm.mr.get_current_device_resource()
        plugins = list(getattr(worker, "plugins", {}).values()) if worker is not None else []
        conflict = conflict_message(type(current).__name__, _rmm_setup(plugins),
                                    getattr(worker, "address", None))
        if conflict is not None and not self.replace_existing:
            raise ResourceConflictError(conflict)
        mr = self._make_resource()
        if self.cupy:
            import cupy
            from rmm.allocators.cupy import rmm_cupy_allocator

            self._previous_cupy = cupy.cuda.get_allocator()
        rmm.mr.set_current_device_resource(mr)
        if self.cupy:
            cupy.cuda.set_allocator(rmm_cupy_allocator)
        self._previous_mr = current
        self._mr = mr

    def teardown(self, worker=None):
        if self._mr is None:
            return
        import rmm

        if self.cupy and self._previous_cupy is not None:
            import cupy

            cupy.cuda.set_allocator(self._previous_cupy)
        # Memory still allocated from the resource keeps it alive (RMM buffers hold their
        # resource), so dropping the plugin's reference is safe.
        rmm.mr.set_current_device_resource(self._previous_mr)
        self._mr = self._previous_mr = self._previous_cupy = None


def _rmm_setup(plugins):
    for plugin in plugins:
        if type(plugin).__name__ == "RMMSetup":
            return plugin
    return None


def conflict_message(resource_type: str, rmm_setup=None, worker: str | None = None):
    """Why the plugin refuses to replace RMM's current device resource, or None if that
    resource is RMM's untouched default (``resource_type`` "CudaMemoryResource").

    ``rmm_setup`` is dask-cuda's ``RMMSetup`` plugin of the worker, if it has one: the
    message names the ``rmm_*`` options that configured the resource.
    """
    if resource_type == "CudaMemoryResource":
        return None
    where = f" on worker {worker}" if worker else ""
    text = (f"asyncmr.dask.AsyncMRPlugin: RMM's current device resource{where} is already "
            f"configured (a {resource_type})")
    options = []
    if rmm_setup is not None:
        for attribute, option in _RMM_SETUP_OPTIONS:
            value = getattr(rmm_setup, attribute, None)
            if value is not None and value is not False:
                options.append(f"{option}={value!r}")
    if options:
        text += (", by dask-cuda's RMMSetup from the LocalCUDACluster / dask cuda worker "
                 f"options {', '.join(options)}")
    else:
        text += ", by a preload, another plugin or code that ran on the worker"
    return (text + ". Leave those out so that the plugin installs an asyncmr resource, or "
            "pass AsyncMRPlugin(..., replace_existing=True) to replace it (the previous "
            "resource is kept and restored when the plugin is removed).")


# ---- helpers that run on the workers -----------------------------------------------------

def worker_resource(worker=None, name: str = DEFAULT_NAME):
    """The asyncmr resource the plugin ``name`` installed on ``worker`` (default: the worker
    this runs on, from inside a task or ``client.run``)."""
    _name(name)
    if worker is None:
        from distributed import get_worker

        worker = get_worker()
    plugin = worker.plugins.get(name)
    if not isinstance(plugin, AsyncMRPlugin) or plugin._mr is None:
        raise LookupError(f"no asyncmr plugin named {name!r} is set up on worker "
                          f"{worker.address} (client.register_plugin(AsyncMRPlugin(...)))")
    return plugin._mr


def _device_facts() -> dict:
    from asyncmr.pinned import current_device
    from cuda.bindings import runtime

    device = current_device()
    err, bus_id = runtime.cudaDeviceGetPCIBusId(32, device)
    bus = bus_id.split(b"\0", 1)[0].decode() if int(err) == 0 else None
    return {"device": device, "pci_bus_id": bus,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def _state_on_worker(name, dask_worker):
    import rmm

    mr = worker_resource(dask_worker, name)
    row = {"worker": dask_worker.address, "name": dask_worker.name, **_device_facts(),
           "resource": type(mr).__name__,
           "is_current": rmm.mr.get_current_device_resource() is mr,
           "pool_handle": mr.pool_handle, "owns_pool": mr.owns_pool}
    row.update(mr.attributes.as_dict())
    return row


def _reset_on_worker(name, dask_worker):
    attributes = worker_resource(dask_worker, name).attributes
    attributes.used_mem_high = 0
    attributes.reserved_mem_high = 0


# The peak phases open in this worker process, by (worker address, plugin name, phase id): each a
# PeakTracker, so phases nested or running at once each keep their own peak.
_PHASES: dict = {}


def _open_phase_on_worker(name, phase, dask_worker):
    tracker = worker_resource(dask_worker, name).track_peak()
    tracker.__enter__()
    _PHASES[(dask_worker.address, name, phase)] = tracker
    return dask_worker.address


def _close_phase_on_worker(name, phase, dask_worker):
    tracker = _PHASES.pop((dask_worker.address, name, phase), None)
    if tracker is None:
        raise LookupError(f"asyncmr: worker {dask_worker.address} has no open phase {phase!r}")
    tracker.__exit__(None, None, None)
    return {"worker": dask_worker.address, **_device_facts(),
            "used_mem_high": tracker.used, "reserved_mem_high": tracker.reserved}


def _peaks_on_worker(name, dask_worker):
    attributes = worker_resource(dask_worker, name).attributes
    return {"worker": dask_worker.address, **_device_facts(),
            "used_mem_high": attributes.used_mem_high,
            "reserved_mem_high": attributes.reserved_mem_high}


def _trim_on_worker(name, keep, dask_worker):
    from cuda.bindings import runtime

    mr = worker_resource(dask_worker, name)
    before = mr.attributes.reserved_mem_current
    # Frees queued on streams count as used until the streams reach them.
    err, = runtime.cudaDeviceSynchronize()
    if int(err) != 0:
        raise AsyncMRError(f"cudaDeviceSynchronize failed on {dask_worker.address}: {err.name}")
    pool = mr.pool
    pool.trim_to(keep)
    attributes = mr.attributes
    return {"worker": dask_worker.address, **_device_facts(),
            "reserved_before": before, "reserved_after": attributes.reserved_mem_current,
            "used": attributes.used_mem_current}


# The recordings running in this worker process, by (worker address, plugin name).
_RECORDINGS: dict = {}


def _start_history_on_worker(name, max_events, stacks, dask_worker):
    key = (dask_worker.address, name)
    if key in _RECORDINGS:
        raise RuntimeError(f"asyncmr: worker {dask_worker.address} is recording a history of "
                           f"{name!r} already (one at a time)")
    recorder = worker_resource(dask_worker, name).record_history(max_events=max_events,
                                                                 stacks=stacks)
    recorder.__enter__()
    _RECORDINGS[key] = recorder
    return dask_worker.address


def _stop_history_on_worker(name, dask_worker, missing_ok=False):
    recorder = _RECORDINGS.pop((dask_worker.address, name), None)
    if recorder is None:
        if missing_ok:
            return None
        raise LookupError(f"asyncmr: worker {dask_worker.address} records no history of {name!r}")
    recorder.__exit__(None, None, None)
    history = recorder.history()
    return {"header": {**history.header, "worker": dask_worker.address},
            "events": list(history.events)}


# ---- client-side helpers -----------------------------------------------------------------

def _table(rows: list[dict]):
    """A pandas DataFrame if pandas is importable, else the list of dicts."""
    rows = sorted(rows, key=lambda r: str(r.get("worker")))
    try:
        import pandas
    except ImportError:
        return rows
    return pandas.DataFrame(rows)


def _run(client, function, *args, workers=None):
    # distributed passes the worker as the keyword `dask_worker`, after these args.
    return list(client.run(function, *args, workers=workers).values())


def pool_state(client, *, name: str = DEFAULT_NAME, workers=None):
    """Every worker's pool: one row per worker with its device (ordinal, PCI bus id,
    ``CUDA_VISIBLE_DEVICES``), the resource type, whether it is RMM's current device resource,
    the pool handle, and every pool attribute the driver answers (bytes for sizes). A pandas
    DataFrame if pandas is importable, else a list of dicts."""
    return _table(_run(client, _state_on_worker, _name(name), workers=workers))


def reset_peaks(client, *, name: str = DEFAULT_NAME, workers=None) -> None:
    """Reset the used and reserved high-water marks of every worker's pool (the start of a
    phase). A shared pool's marks count every user in that worker process."""
    _run(client, _reset_on_worker, _name(name), workers=workers)


def peaks(client, *, name: str = DEFAULT_NAME, workers=None):
    """Every worker's ``used_mem_high`` and ``reserved_mem_high`` (bytes) since the last
    :func:`reset_peaks`, one row per worker."""
    return _table(_run(client, _peaks_on_worker, _name(name), workers=workers))


def _open_on_workers(client, workers, start, stop, *args, stop_args=None) -> list[str]:
    """Runs ``start(*args)`` on the workers (all of them: None) and returns the addresses where
    it ran. If it failed anywhere, ``stop(*stop_args)`` (default: ``args``) undoes it where it
    ran, and only there (another phase or recording may be open on the others), so a retry
    starts clean; then the first error is raised."""
    got = client.run(start, *args, workers=workers, on_error="return")
    opened = [a for a, r in got.items() if not isinstance(r, BaseException)]
    errors = [r for r in got.values() if isinstance(r, BaseException)]
    if errors:
        if opened:
            client.run(stop, *(args if stop_args is None else stop_args), workers=opened)
        raise errors[0]
    return opened


def _close_on_workers(client, opened, stop, *args) -> tuple[dict, dict]:
    """Runs ``stop(*args)`` on exactly the workers ``_open_on_workers`` opened (a worker that
    joined since has nothing open): (its answers, its errors), each by address. A worker that
    left since is among the errors; the others' answers are kept."""
    if not opened:
        return {}, {}
    got = client.run(stop, *args, workers=opened, on_error="return")
    answers = {a: r for a, r in got.items() if not isinstance(r, BaseException)}
    errors = {a: r for a, r in got.items() if isinstance(r, BaseException)}
    errors.update({a: LookupError(f"asyncmr: worker {a} left the cluster")
                   for a in opened if a not in got})
    return answers, errors


class PhasePeaks:
    """``with track_peaks(client) as phase: ...``; afterwards ``phase.table`` holds each
    worker's peaks of the phase (see :func:`peaks`) and ``phase.by_worker`` maps a worker's
    address to ``(used_mem_high, reserved_mem_high)``. The phase is the workers' that opened
    it: one that joins during it is not asked, one that fails to close it (it left the
    cluster) is in ``phase.failed`` with the error, the others are reported.

    Each worker holds a peak tracker for the phase (``mr.track_peak()``), so phases may be
    nested or run at once from several clients: each reports its own peak, an outer one at least
    an inner one's (see :class:`asyncmr.PeakTracker`)."""

    def __init__(self, client, name: str = DEFAULT_NAME, workers=None):
        self._client, self._name, self._workers = client, _name(name), workers
        self._phase = uuid.uuid4().hex
        self._open: list[str] = []
        self.table = None
        self.by_worker: dict[str, tuple[int, int]] = {}
        self.failed: dict[str, BaseException] = {}

    def __enter__(self):
        if self._open or self.table is not None:
            raise RuntimeError("asyncmr: a phase is used once; make another with "
                               "track_peaks(client)")
        self._open = _open_on_workers(self._client, self._workers, _open_phase_on_worker,
                                      _close_phase_on_worker, self._name, self._phase)
        return self

    def __exit__(self, *exc):
        opened, self._open = self._open, []
        got, self.failed = _close_on_workers(self._client, opened, _close_phase_on_worker,
                                             self._name, self._phase)
        rows = list(got.values())
        self.by_worker = {r["worker"]: (r["used_mem_high"], r["reserved_mem_high"])
                          for r in rows}
        self.table = _table(rows)
        return False


def track_peaks(client, *, name: str = DEFAULT_NAME, workers=None) -> PhasePeaks:
    """Per-phase peaks across workers: a peak tracker on every worker for the ``with`` block
    (see :class:`PhasePeaks`); phases may be nested."""
    return PhasePeaks(client, name, workers)


def trim_to(client, min_bytes_to_keep: int = 0, *, name: str = DEFAULT_NAME, workers=None):
    """Synchronize every worker's device and trim its pool down to ``min_bytes_to_keep``
    reserved bytes; returns a row per worker with ``reserved_before`` / ``reserved_after``.

    Only memory nothing holds is released: drop your futures and persisted collections first.
    On a shared pool this trims for every user in the worker process.
    """
    keep = _size("min_bytes_to_keep", min_bytes_to_keep, optional=False)
    return _table(_run(client, _trim_on_worker, _name(name), keep, workers=workers))


class ClusterHistory:
    """``with record_history(client) as h: ...``; afterwards ``h.histories`` maps each worker's
    address to its :class:`asyncmr.history.History`, and ``h.save(path)`` writes them into one
    JSON file (gzip-compressed for a ``.gz`` name) that ``python -m asyncmr plot`` draws one
    lane per worker. The recording is the
    workers' that started it: one that joins during it records nothing, one whose history could
    not be gathered (it left the cluster) is in ``h.failed`` with the error, and the others'
    histories are kept."""

    def __init__(self, client, name: str, workers, max_events: int, stacks: str):
        from asyncmr._recorder import check_arguments

        max_events = check_arguments(max_events, stacks)
        self._client, self._name, self._workers = client, _name(name), workers
        self._max_events, self._stacks = max_events, stacks
        self._open: list[str] = []
        self.histories: dict = {}
        self.failed: dict[str, BaseException] = {}

    def __enter__(self):
        if self._open:
            raise RuntimeError("asyncmr: this recording is running already")
        self._open = _open_on_workers(self._client, self._workers, _start_history_on_worker,
                                      _stop_history_on_worker, self._name, self._max_events,
                                      self._stacks, stop_args=(self._name,))
        return self

    def __exit__(self, *exc):
        from asyncmr.history import History

        opened, self._open = self._open, []
        got, self.failed = _close_on_workers(self._client, opened, _stop_history_on_worker,
                                             self._name)
        self.histories = {address: History(data["header"], data["events"])
                          for address, data in sorted(got.items())}
        return False

    def save(self, path) -> None:
        """One JSON file with every worker's history (``asyncmr.history.save_many``)."""
        from asyncmr.history import save_many

        save_many(path, self.histories)


def record_history(client, *, max_events: int = 65536, stacks: str = "none",
                   name: str = DEFAULT_NAME, workers=None) -> ClusterHistory:
    """Records the allocation history of every worker's asyncmr resource (the plugin ``name``)
    for the ``with`` block, and gathers them (see :class:`ClusterHistory` and
    ``_PoolResource.record_history``). ``max_events`` is per worker."""
    return ClusterHistory(client, name, workers, max_events, stacks)
