# SPDX-License-Identifier: Apache-2.0
"""A resource's allocation history on the GPU: ``mr.record_history()`` records what each call
did, with the pool's state; bad input is refused before anything is recorded; recording is safe
from several threads and during a capture; a recorded CuPy pipeline's snapshot opens in
PyTorch's memory viewer."""

import os
import pickle
import threading
import time

import pytest
from rmm.pylibrmm.stream import Stream

import asyncmr
from asyncmr import AsyncDeviceMR, AsyncManagedMR, AsyncPinnedMR

from gpu_helpers import require_module, rmm_cupy

KiB, MiB = 1 << 10, 1 << 20


def calls(history):
    """The calls' own events (growth and trims are the driver's choice of moment)."""
    return [e["action"] for e in history.events if e["action"] not in ("grow", "trim")]


@pytest.mark.parametrize("make", [AsyncDeviceMR, AsyncManagedMR, AsyncPinnedMR])
def test_a_cached_resource_records_allocations_hits_puts_and_growth(gpu, make):
    cupy = require_module("cupy")
    mr = make(pool="new", cache=64 * MiB)
    cs = cupy.cuda.Stream(non_blocking=True)
    s = Stream(obj=cs)
    with mr.record_history(max_events=1024) as h:
        p = mr.allocate(4 * KiB, s)
        mr.deallocate(p, 4 * KiB, s)
        q = mr.allocate(4 * KiB, s)
        mr.deallocate(q, 4 * KiB, s)
    history = h.history()
    assert calls(history) == ["alloc", "cache_put", "cache_hit", "cache_put"]
    first = history.events[0]
    assert first["action"] == "grow" and first["bytes"] >= 4 * KiB, history.events
    alloc = next(e for e in history.events if e["action"] == "alloc")
    assert alloc["address"] == p and alloc["bytes"] == 4 * KiB
    assert alloc["stream"] == cs.ptr
    assert alloc["reserved"] >= 4 * KiB and alloc["used"] >= 4 * KiB
    assert history.header["kind"] in ("device", "managed", "pinned")
    assert history.dropped == 0
    s.synchronize()


def test_an_uncached_resource_records_frees_and_a_trim(gpu):
    mr = AsyncPinnedMR(pool="new")
    s = Stream()
    with mr.record_history() as h:
        p = mr.allocate(MiB, s)
        mr.deallocate(p, MiB, s)
        s.synchronize()
        mr.trim_to(0)
    events = h.history().events
    assert calls(h.history()) == ["alloc", "free"]
    assert events[-1]["action"] == "trim" and events[-1]["reserved"] == 0, events


def test_python_stacks_name_the_allocating_function(gpu):
    mr = AsyncDeviceMR(pool="new")
    s = Stream()

    def allocate_here():
        return mr.allocate(64 * KiB, s)

    with mr.record_history(stacks="python") as h:
        p = allocate_here()
        live = h.outstanding()
    assert live and live[0]["address"] == p
    names = [f["name"] for f in live[0]["frames"]]
    # Innermost first: the function that called allocate, then its caller; no asyncmr frame.
    assert names[:2] == ["allocate_here", "test_python_stacks_name_the_allocating_function"], names
    package = os.path.dirname(asyncmr.__file__)
    assert not any(f["filename"].startswith(package) for f in live[0]["frames"]), names
    mr.deallocate(p, 64 * KiB, s)
    s.synchronize()


def frame_names(event):
    return [f["name"] for f in event["frames"]]


def test_a_python_stack_goes_to_its_own_allocation_not_to_rmms_at_the_same_address(gpu):
    # RMM's own allocation (a DeviceBuffer) takes the block a Python allocation freed, and a
    # later Python allocation takes it back: each event has the stack of the call that made it,
    # and RMM's, which has no Python stack, has none.
    import rmm

    mr = AsyncDeviceMR(pool="new", cache=64 * MiB)
    s = Stream()

    def allocate_first():
        return mr.allocate(4 * KiB, s)

    def allocate_again():
        return mr.allocate(4 * KiB, s)

    with mr.record_history(stacks="python") as h:
        p = allocate_first()
        mr.deallocate(p, 4 * KiB, s)
        buffer = rmm.DeviceBuffer(size=4 * KiB, stream=s, mr=mr)
        assert buffer.ptr == p, "the cache hands the block back (else nothing is shared)"
        del buffer
        q = allocate_again()
        assert q == p
        mr.deallocate(q, 4 * KiB, s)
    made = [e for e in h.history().events if e["action"] in ("alloc", "cache_hit")]
    assert [e["address"] for e in made] == [p, p, p], made
    assert frame_names(made[0])[:1] == ["allocate_first"], made[0]
    assert made[1]["frames"] == [], "RMM's allocation has no Python stack"
    assert frame_names(made[2])[:1] == ["allocate_again"], made[2]
    s.synchronize()


def test_python_stacks_stay_with_their_allocations_when_the_ring_drops_older_ones(gpu):
    # The ring keeps only the newest events: the allocations it kept have their own stacks, not
    # those of the dropped ones at the same address.
    mr = AsyncDeviceMR(pool="new", cache=64 * MiB)
    s = Stream()

    def allocate_first():
        return mr.allocate(4 * KiB, s)

    def allocate_later():
        return mr.allocate(4 * KiB, s)

    with mr.record_history(max_events=8, stacks="python") as h:
        p = allocate_first()
        mr.deallocate(p, 4 * KiB, s)
        for _ in range(4):  # cache hits at the same address: the ring's 8 events are theirs
            q = allocate_later()
            assert q == p
            mr.deallocate(q, 4 * KiB, s)
    history = h.history()
    assert history.dropped >= 2, history.header
    made = [e for e in history.events if e["action"] in ("alloc", "cache_hit")]
    assert 1 <= len(made) <= 4 and {e["address"] for e in made} == {p}, history.events
    assert [frame_names(e)[:1] for e in made] == [["allocate_later"]] * len(made), made
    s.synchronize()


def test_python_stacks_from_several_threads_go_to_their_own_allocations(gpu):
    # Two threads allocate on one stream of an uncached pool, first in turn (each one's block is
    # the block the other just freed: the pool reuses a block freed on the same stream), then at
    # once: every allocation has the stack of the thread that made it (the size says which).
    import sys

    mr = AsyncDeviceMR(pool="new")
    mr.release_gil = "always"  # the threads' allocations run at once
    s = Stream()
    n = 300
    turns = [threading.Semaphore(1), threading.Semaphore(0)]  # in turn: 4096 first

    def allocate_4096():
        return mr.allocate(4096, s)

    def allocate_4000():
        return mr.allocate(4000, s)

    def in_turn(me, allocate, size):
        for _ in range(n):
            assert turns[me].acquire(timeout=30), "the other thread stopped"
            mr.deallocate(allocate(), size, s)
            turns[1 - me].release()

    def at_once(allocate, size):
        for _ in range(n):
            mr.deallocate(allocate(), size, s)

    def run(work, args):
        ts = [threading.Thread(target=work, args=a) for a in args]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over often
    try:
        with mr.record_history(max_events=1 << 16, stacks="python") as h:
            run(in_turn, [(0, allocate_4096, 4096), (1, allocate_4000, 4000)])
            run(at_once, [(allocate_4096, 4096), (allocate_4000, 4000)])
    finally:
        sys.setswitchinterval(interval)
    made = [e for e in h.history().events if e["action"] in ("alloc", "cache_hit")]
    assert len(made) == 4 * n
    sizes_at = {}
    for e in made[:2 * n]:
        sizes_at.setdefault(e["address"], set()).add(e["bytes"])
    assert any(len(sizes) == 2 for sizes in sizes_at.values()), "no block went between the threads"
    wrong = [e for e in made if frame_names(e)[:1] != [f"allocate_{e['bytes']}"]]
    assert wrong == [], wrong[:3]
    s.synchronize()


def test_phases_are_spans_around_their_events(gpu):
    mr = AsyncDeviceMR(pool="new")
    s = Stream()
    with mr.record_history() as h:
        with h.phase("load"):
            p = mr.allocate(MiB, s)
        with h.phase("free"):
            mr.deallocate(p, MiB, s)
    history = h.history()
    (load, free) = history.header["phases"]
    alloc = next(e for e in history.events if e["action"] == "alloc")
    assert load["name"] == "load" and load["start_ns"] <= alloc["time_ns"] <= load["end_ns"]
    assert free["start_ns"] >= load["end_ns"]
    with pytest.raises(ValueError, match="name"):
        with h.phase(""):
            pass
    s.synchronize()


def test_a_named_track_peak_is_a_phase_of_the_recording_with_its_peaks(gpu):
    mr = AsyncDeviceMR(pool="new")
    s = Stream()
    with mr.record_history() as h:
        with mr.track_peak(name="big") as big:
            p = mr.allocate(8 * MiB, s)
            mr.deallocate(p, 8 * MiB, s)
        with mr.track_peak() as unnamed:  # no name: measured, not a phase
            q = mr.allocate(MiB, s)
            mr.deallocate(q, MiB, s)
    history = h.history()
    (phase,) = history.header["phases"]
    assert phase["name"] == big.name == "big" and unnamed.name is None
    assert phase["used_high"] == big.used >= 8 * MiB
    assert phase["reserved_high"] == big.reserved >= 8 * MiB
    alloc = next(e for e in history.events if e["action"] == "alloc")
    assert phase["start_ns"] <= alloc["time_ns"] <= phase["end_ns"]
    # Outside a recording a name only names the tracker.
    with mr.track_peak(name="alone") as alone:
        r = mr.allocate(MiB, s)
        mr.deallocate(r, MiB, s)
    assert alone.name == "alone" and alone.used >= MiB
    assert h.history().header["phases"] == history.header["phases"]
    s.synchronize()


@pytest.mark.parametrize("bad", ["", 3, b"load"])
def test_a_bad_phase_name_is_refused_and_the_peaks_stay(gpu, bad):
    mr = AsyncDeviceMR(pool="new")
    s = Stream()
    p = mr.allocate(4 * MiB, s)
    mr.deallocate(p, 4 * MiB, s)
    s.synchronize()
    high = mr.pool.attributes.used_mem_high
    error = ValueError if bad == "" else TypeError
    with mr.record_history() as h:
        with pytest.raises(error, match="a phase needs a non-empty name|a phase's name must be"):
            mr.track_peak(name=bad)
        with pytest.raises(error, match="a phase needs a non-empty name|a phase's name must be"):
            mr.pool.track_peak(name=bad)
    assert mr.pool.attributes.used_mem_high == high >= 4 * MiB, "refused before any reset"
    assert h.history().header["phases"] == []


def test_an_allocation_whose_stack_cannot_be_noted_is_freed_not_leaked(gpu):
    # Noting the allocation's stack can fail (a MemoryError in traceback.extract_stack, a
    # KeyboardInterrupt): the caller then gets the exception and never the address, so the
    # block must go back to the pool, not stay allocated for good.
    mr = AsyncDeviceMR(pool="new")
    s = Stream()
    with mr.record_history(max_events=1024, stacks="python") as h:
        def fail(*args):
            raise KeyboardInterrupt("while noting the stack")

        h.note_allocation = fail
        with pytest.raises(KeyboardInterrupt, match="while noting the stack"):
            mr.allocate(64 * KiB, s)
        del h.note_allocation
    s.synchronize()
    assert mr.attributes.used_mem_current == 0, "the block stayed allocated"
    assert calls(h.history()) == ["alloc", "free"]


def test_outstanding_lists_the_largest_first(gpu):
    mr = AsyncDeviceMR(pool="new")
    s = Stream()
    with mr.record_history() as h:
        blocks = [(mr.allocate(n, s), n) for n in (4 * KiB, MiB, 64 * KiB)]
        mr.deallocate(blocks[0][0], 4 * KiB, s)
        live = h.outstanding()
    assert [a["bytes"] for a in live] == [MiB, 64 * KiB]
    for p, n in blocks[1:]:
        mr.deallocate(p, n, s)
    s.synchronize()


def test_out_of_memory_while_recording_names_the_largest_outstanding(gpu):
    mr = AsyncDeviceMR(pool="new")
    s = Stream()
    with mr.record_history() as h:
        p = mr.allocate(MiB, s)
        with pytest.raises(MemoryError, match=r"largest outstanding allocations.*1048576 bytes"):
            mr.allocate(1 << 50, s)
    assert calls(h.history())[-1] == "oom"
    mr.deallocate(p, MiB, s)
    s.synchronize()


@pytest.mark.parametrize("bad,error", [(0, ValueError), (-1, ValueError), (1 << 27, ValueError),
                                       (True, TypeError), ("64", TypeError), (1.5, TypeError)])
def test_a_bad_max_events_is_refused_and_nothing_records(gpu, bad, error):
    mr = AsyncDeviceMR(pool="new")
    with pytest.raises(error, match="max_events"):
        mr.record_history(max_events=bad)
    with mr.record_history(max_events=8) as h:  # the resource is as it was
        pass
    assert len(h.history()) == 0


def test_max_events_of_any_integer_type_is_checked_and_kept_as_an_int():
    # NumPy integers pass the check (as every integer argument of asyncmr's does); what the
    # recorder keeps, and its history's header says, is the int.
    np = pytest.importorskip("numpy")
    from asyncmr._recorder import check_arguments
    got = check_arguments(np.int64(1024), "none")
    assert got == 1024 and type(got) is int


def test_a_numpy_max_events_records(gpu):
    np = pytest.importorskip("numpy")
    mr = AsyncDeviceMR(pool="new")
    s = Stream()
    with mr.record_history(max_events=np.int64(1024)) as h:
        mr.deallocate(mr.allocate(MiB, s), MiB, s)
    header = h.history().header
    assert header["max_events"] == 1024 and type(header["max_events"]) is int
    s.synchronize()


def test_an_unknown_stacks_mode_is_refused(gpu):
    with pytest.raises(ValueError, match="stacks"):
        AsyncDeviceMR(pool="new").record_history(stacks="java")


def test_one_recording_at_a_time_and_the_first_goes_on(gpu):
    mr = AsyncDeviceMR(pool="new")
    s = Stream()
    with mr.record_history() as h:
        with pytest.raises(RuntimeError, match="already"):
            with mr.record_history():
                pass
        p = mr.allocate(4 * KiB, s)
    assert calls(h.history()) == ["alloc"]
    with pytest.raises(RuntimeError, match="used already"):
        with h:
            pass
    mr.deallocate(p, 4 * KiB, s)
    s.synchronize()


def test_a_full_ring_keeps_the_newest_and_counts_the_dropped(gpu):
    mr = AsyncDeviceMR(pool="new", cache=64 * MiB)
    s = Stream()
    with mr.record_history(max_events=16) as h:
        for _ in range(100):
            mr.deallocate(mr.allocate(4 * KiB, s), 4 * KiB, s)
    history = h.history()
    assert len(history) == 16
    assert history.dropped == history.header["dropped"] >= 100 * 2 - 16
    s.synchronize()


def test_recording_from_many_threads_loses_nothing(gpu):
    mr = AsyncDeviceMR(pool="new", cache=64 * MiB)
    n, threads = 500, 4

    def work():
        s = Stream()
        for _ in range(n):
            mr.deallocate(mr.allocate(4 * KiB, s), 4 * KiB, s)
        s.synchronize()

    with mr.record_history(max_events=1 << 16) as h:
        ts = [threading.Thread(target=work) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    got = calls(h.history())
    assert len(got) == 2 * n * threads and h.history().dropped == 0
    assert got.count("alloc") + got.count("cache_hit") == n * threads


def test_allocations_racing_the_end_of_a_recording_never_fail(gpu):
    # A recording that ends while another thread allocates without the GIL: the allocation
    # returns its block (it is never lost to a recorder that went away meanwhile).
    mr = AsyncDeviceMR(pool="new")
    mr.release_gil = "always"
    stop, failures = threading.Event(), []

    def work():
        s = Stream()
        while not stop.is_set():
            try:
                p = mr.allocate(4 * KiB, s)
            except Exception as e:  # noqa: BLE001 - what the test reports
                failures.append(f"{type(e).__name__}: {e}")
                continue
            mr.deallocate(p, 4 * KiB, s)
        s.synchronize()

    t = threading.Thread(target=work)
    t.start()
    try:
        for _ in range(1000):
            # The sleeps hand the GIL over: a recording ends as the worker's allocation runs
            # without it (the main thread takes the GIL when the worker lets it go).
            with mr.record_history(max_events=64):
                time.sleep(0.0002)
            time.sleep(0.0002)
    finally:
        stop.set()
        t.join()
    assert failures == []


def test_reading_a_recording_while_threads_allocate_with_stacks_never_fails(gpu):
    # The reader walks the allocations' stacks while other threads add to them.
    import sys

    mr = AsyncDeviceMR(pool="new", cache=64 * MiB)
    stop = threading.Event()

    def work():
        s = Stream()
        while not stop.is_set():
            mr.deallocate(mr.allocate(4 * KiB, s), 4 * KiB, s)
        s.synchronize()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over often, as a busy process does
    with mr.record_history(max_events=4096, stacks="python") as h:
        workers = [threading.Thread(target=work) for _ in range(2)]
        for t in workers:
            t.start()
        try:
            for _ in range(300):
                h.history()
        finally:
            stop.set()
            for t in workers:
                t.join()
            sys.setswitchinterval(interval)


def test_a_subclass_of_a_resource_records_as_the_kind_it_is(gpu):
    # The kind comes from what the resource is, not from its class's name.
    class Traced(AsyncDeviceMR):
        pass

    class PinnedStagingDeviceMR(AsyncDeviceMR):  # a name that says "pinned"
        pass

    for cls in (Traced, PinnedStagingDeviceMR):
        mr = cls(pool="new")
        with mr.record_history() as h:
            mr.deallocate(mr.allocate(4 * KiB), 4 * KiB)
        header = h.history().header
        assert header["kind"] == "device" and header["device"] == 0, (cls.__name__, header)


def test_recording_during_a_capture_keeps_it_valid(gpu):
    cupy = require_module("cupy")
    mr = AsyncDeviceMR(pool="new")
    cs = cupy.cuda.Stream(non_blocking=True)
    rs = Stream(obj=cs)
    with mr.record_history() as h:
        with cs:
            cs.begin_capture(cupy.cuda.runtime.streamCaptureModeGlobal)
            g = mr.allocate(MiB, rs)  # a graph allocation node; the recorder reads the pool
            mr.deallocate(g, MiB, rs)
            graph = cs.end_capture()
        graph.launch(cs)
        cs.synchronize()
    assert calls(h.history()) == ["alloc", "free"]


def test_a_recorded_cupy_pipeline_opens_in_pytorchs_memory_viewer(gpu, tmp_path):
    cupy = require_module("cupy")
    viz = require_module("torch.cuda._memory_viz", "PyTorch's memory viewer renders the snapshot")
    from asyncmr.history import load

    mr = AsyncDeviceMR(pool="new", cache=64 * MiB)
    with rmm_cupy(mr):
        with mr.record_history() as h:
            x = cupy.arange(1 << 20, dtype=cupy.float32)
            y = (x * 2).sum()
            del x
            float(y)
        h.save(tmp_path / "history.json.gz")
        h.export_torch_snapshot(tmp_path / "snapshot.pickle")
    history = load(tmp_path / "history.json.gz")
    assert len(history) >= 4
    snapshot = pickle.loads((tmp_path / "snapshot.pickle").read_bytes())  # the file just written
    assert snapshot == history.snapshot()
    assert "<html" in viz.trace_plot(snapshot).lower()
    assert "<html" in viz.segment_plot(snapshot).lower()


def test_the_demo_records_its_owned_pool_and_writes_the_history_and_timeline(gpu, tmp_path):
    import importlib.util
    import json
    import subprocess
    import sys

    from asyncmr.history import load

    require_module("cupy")
    proc = subprocess.run([sys.executable, "-m", "asyncmr", "demo", "--elements", str(1 << 18),
                           "--history", str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "demo-history.json") as f:
        assert json.load(f)["format"] == "asyncmr-history"
    history = load(tmp_path / "demo-history.json")
    actions = {e["action"] for e in history.events}
    assert {"alloc", "free", "grow", "trim"} <= actions, actions
    assert [p["name"] for p in history.header["phases"]] == ["load", "compute", "release"]
    assert history.events[-1]["reserved"] == 0, "trim_to(0) gave the pool's memory back"
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "demo-timeline.png").stat().st_size > 0
    else:
        assert "no timeline" in proc.stderr
