# SPDX-License-Identifier: Apache-2.0
"""Allocation history (asyncmr.history), on any machine: building a History from events,
what is outstanding, the PyTorch snapshot it makes, its files, the timeline and the command.

The events here are synthetic, shaped like the recorder's (src/pool_history.cpp): the GPU tests
of the recording itself are with the resources' tests."""

import enum
import gzip
import json
import os
import pickle
import pickletools
import re
import time

import numpy as np
import pytest

from asyncmr import history as hist
from asyncmr.history import History

MiB = 1 << 20
KiB = 1 << 10
POOL = 0x5A5A0000
S1, S2 = 0x7F00AA00, 0x7F00BB00  # two streams' handle values
BASE = 0x7F4000000000  # where the pool's blocks are
A, B, C, D = BASE, BASE + 1 * MiB, BASE + 2 * MiB, BASE + 4 * MiB
FAR = BASE + (1 << 30)  # a block far from the others: a segment of its own


def frame(name, line=10):
    return {"filename": "train.py", "line": line, "name": name}


class Recorder:
    """Makes events the way the recorder does: each one stamped with the pool's reserved and
    used bytes and the front cache's bytes right after it."""

    def __init__(self, t=1_000_000, reserved=0, used=0):
        self.events, self.t, self.reserved, self.used, self.cached = [], t, reserved, used, 0

    def __call__(self, action, address=0, nbytes=0, stream=S1, frames=(), evicts=False):
        self.t += 1000
        if action == "alloc":
            self.used += nbytes
        elif action == "cache_hit":
            self.cached -= nbytes
        elif action == "cache_put":
            self.cached += nbytes
        elif action == "free":
            self.used -= nbytes
            self.cached -= nbytes if evicts else 0
        elif action == "grow":
            self.reserved += nbytes
        elif action == "trim":
            self.reserved -= nbytes
        self.events.append({"time_ns": self.t, "action": action, "address": address,
                            "bytes": nbytes, "stream": stream, "reserved": self.reserved,
                            "used": self.used, "cached": self.cached, "frames": list(frames)})
        return self.t


def make_events():
    """A few allocs on two streams, a cache_put and its cache_hit, frees, a grow, a trim, an oom,
    and a free of a cached block (the cache giving it back to the pool)."""
    r = Recorder()
    r("grow", 0, 4 * MiB)
    r("alloc", A, 1 * MiB, S1, [frame("load")])
    r("alloc", B, 512 * KiB, S2, [frame("embed")])
    r("alloc", C, 256 * KiB, S1, [frame("batch")])
    r("cache_put", B, 512 * KiB, S2)
    r("cache_hit", B, 512 * KiB, S1, [frame("step", 20)])
    r("free", A, 1 * MiB, S1)
    r("grow", 0, 4 * MiB)
    r("alloc", D, 2 * MiB, S2, [frame("grad")])
    r("oom", 0, 64 * MiB, S1)
    r("cache_put", C, 256 * KiB, S1)
    r("free", C, 256 * KiB, S1, evicts=True)
    r("trim", 0, 2 * MiB)
    return r.events


def make_header(**changes):
    header = {"version": 1, "kind": "device", "pool": POOL, "device": 0, "max_events": 1024,
              "dropped": 0, "stacks": "python",
              "phases": [{"name": "load", "start_ns": 1_001_000, "end_ns": 1_005_000},
                         {"name": "train", "start_ns": 1_005_000, "end_ns": None}],
              "worker": None}
    header.update(changes)
    return header


def make_history(events=None, **changes):
    return History(make_header(**changes), make_events() if events is None else events)


def actions(snapshot, device=0):
    return [(e["action"], e.get("addr")) for e in snapshot["device_traces"][device]]


# ---- building a History --------------------------------------------------------------------------

def test_a_history_holds_the_header_and_the_events_in_order():
    events = make_events()
    h = History(make_header(dropped=3), events)
    assert len(h) == len(events) == 13
    assert isinstance(h.events, tuple)
    assert [e["action"] for e in h.events] == [e["action"] for e in events]
    assert h.dropped == 3 and h.header["kind"] == "device" and h.header["pool"] == POOL


def test_a_history_does_not_change_when_its_inputs_or_copies_do():
    events, header = make_events(), make_header()
    h = History(header, events)
    events[1]["bytes"] = 7
    events[1]["frames"].clear()
    header["phases"].clear()
    h.header["phases"].append({"name": "x", "start_ns": 0, "end_ns": None})
    assert h.events[1]["bytes"] == MiB and h.events[1]["frames"] == [frame("load")]
    assert len(h.header["phases"]) == 2


def test_repr_is_short_and_names_the_pool():
    text = repr(make_history(worker="tcp://10.0.0.1:4000"))
    assert text == ("<History: device pool 0x5a5a0000 on device 0 of tcp://10.0.0.1:4000, "
                    "13 events, 0 dropped>")


def test_events_slightly_out_of_time_order_are_kept():
    # The recorder reads its clock before an event takes its ring slot: two threads can land
    # a few ns out of order. A History must still build (the binding builds one for an OOM).
    events = make_events()
    events[3]["time_ns"] = events[2]["time_ns"] - 5
    assert len(History(make_header(), events)) == 13


# ---- outstanding ---------------------------------------------------------------------------------

def test_outstanding_lists_the_live_blocks_largest_first():
    live = make_history().outstanding()
    assert [(b["address"], b["bytes"], b["stream"]) for b in live] == [
        (D, 2 * MiB, S2), (B, 512 * KiB, S1)]
    assert live[1]["frames"] == [frame("step", 20)]  # the cache hit's stack, not the first alloc's
    assert set(live[0]) == {"address", "bytes", "stream", "age_s", "frames"}


def test_outstanding_breaks_ties_oldest_first():
    r = Recorder()
    r("alloc", A, MiB)
    r("alloc", B, MiB)
    r("alloc", C, 2 * KiB)
    assert [b["address"] for b in History(make_header(), r.events).outstanding()] == [A, B, C]


def test_a_block_in_the_front_cache_is_not_outstanding():
    r = Recorder()
    r("alloc", A, MiB)
    r("cache_put", A, MiB)
    assert History(make_header(), r.events).outstanding() == []


def test_outstanding_ages_are_seconds_to_the_last_event_or_to_now_ns():
    h = make_history()
    last = h.events[-1]["time_ns"]
    d_time = next(e["time_ns"] for e in h.events if e["address"] == D)
    assert h.outstanding()[0]["age_s"] == pytest.approx((last - d_time) / 1e9)
    assert h.outstanding(now_ns=last + 2_000_000_000)[0]["age_s"] == pytest.approx(
        (last + 2_000_000_000 - d_time) / 1e9)
    with pytest.raises(ValueError, match="now_ns .* is before the history's latest event"):
        h.outstanding(now_ns=last - 1)


def test_outstanding_takes_a_numpy_integer_now_ns_and_names_a_wrong_one():
    # max_events= takes a NumPy integer; now_ns= (a time the user may well have in an array)
    # took none: "must be an int, got numpy.int64".
    h = make_history()
    last = h.events[-1]["time_ns"]
    assert h.outstanding(now_ns=np.int64(last + 10**9)) == h.outstanding(now_ns=last + 10**9)
    for bad in (True, 1.5, "5", [1]):
        with pytest.raises(TypeError, match="now_ns"):
            h.outstanding(now_ns=bad)


def test_recording_arguments_of_the_wrong_type_raise_type_error():
    # stacks= of the wrong type raised ValueError ("must be one of ..."), where every other
    # argument of the wrong type raises TypeError; a wrong str stays a ValueError.
    from asyncmr._recorder import check_arguments
    for bad in (None, b"python", ["python"], 1):
        with pytest.raises(TypeError, match=r"stacks must be a str, got "):
            check_arguments(1024, bad)
    with pytest.raises(ValueError, match="stacks must be one of"):
        check_arguments(1024, "pyhton")


def test_an_allocation_at_a_live_address_ends_the_earlier_block():
    # Thread 1 frees A and notes it only after thread 2's allocation, which the pool served at A,
    # was noted: the late free belongs to the earlier block, and the new block stays live.
    r = Recorder()
    r("alloc", A, MiB, S1)
    r("alloc", A, 2 * MiB, S2)
    r("free", A, MiB, S1)
    h = History(make_header(), r.events)
    assert [(b["address"], b["bytes"]) for b in h.outstanding()] == [(A, 2 * MiB)]
    assert actions(h.snapshot()) == [("alloc", A), ("free_requested", A), ("free_completed", A),
                                     ("alloc", A)]


def test_of_two_overlapping_live_blocks_the_newer_is_live():
    # The pool joined A's freed block with its neighbour and served B' from both before A's free
    # was noted (a read while recording): the newer block is the live one, and the snapshot
    # still tiles its segments.
    r = Recorder()
    r("alloc", A, MiB, S1)
    r("alloc", A - 512 * KiB, MiB, S2)
    h = History(make_header(), r.events)
    assert [b["address"] for b in h.outstanding()] == [A - 512 * KiB]
    [seg] = h.snapshot()["segments"]
    assert [(b["address"], b["state"]) for b in seg["blocks"]] == [
        (A - 512 * KiB, "active_allocated"), (A + 512 * KiB, "inactive")]


# ---- the PyTorch snapshot ------------------------------------------------------------------------

def test_the_snapshot_has_pytorchs_segments_and_device_traces_only():
    # The history itself is asyncmr's JSON file: the viewer's snapshot carries no copy of it.
    assert set(make_history().snapshot()) == {"segments", "device_traces"}


def test_actions_map_to_pytorchs_as_the_user_saw_them():
    # cache_put is a free from the user's view; the later free of that cached block (the cache
    # giving it back to the pool) is not; grow and trim are not trace entries.
    assert actions(make_history().snapshot()) == [
        ("alloc", A), ("alloc", B), ("alloc", C),
        ("free_requested", B), ("free_completed", B),  # cache_put
        ("alloc", B),  # cache_hit
        ("free_requested", A), ("free_completed", A),
        ("alloc", D),
        ("oom", None),
        ("free_requested", C), ("free_completed", C),  # cache_put
    ]


def test_a_free_is_requested_and_completed_at_once():
    # MemoryViz.js joins a free_requested directly followed by its free_completed into "free".
    trace = make_history().snapshot()["device_traces"][0]
    for i, e in enumerate(trace):
        if e["action"] == "free_requested":
            assert trace[i + 1]["action"] == "free_completed"
            assert trace[i + 1]["addr"] == e["addr"] and trace[i + 1]["time_us"] == e["time_us"]


def test_every_trace_entry_has_the_keys_pytorchs_viewer_reads():
    for e in make_history().snapshot()["device_traces"][0]:
        if e["action"] == "oom":
            assert set(e) == {"action", "size", "stream", "time_us", "frames", "device_free"}
        else:
            assert set(e) == {"action", "addr", "size", "stream", "time_us", "frames"}
        # A "category" key makes the viewer's timeline look up snapshot.categores (sic) and fail.
        assert "category" not in e


def test_trace_times_are_microseconds_of_the_events():
    h = make_history()
    trace = h.snapshot()["device_traces"][0]
    assert trace[0]["time_us"] == h.events[1]["time_ns"] // 1000
    assert all(isinstance(e["time_us"], int) for e in trace)


def test_a_free_carries_the_stack_of_its_allocation():
    trace = make_history().snapshot()["device_traces"][0]
    free_a = next(e for e in trace if e["action"] == "free_completed" and e["addr"] == A)
    assert free_a["frames"] == [frame("load")] and free_a["size"] == MiB


def test_an_oom_entry_says_what_was_asked_and_the_pools_unused_reserve():
    oom = next(e for e in make_history().snapshot()["device_traces"][0] if e["action"] == "oom")
    assert oom["size"] == 64 * MiB and oom["stream"] == S1
    assert oom["device_free"] == 8 * MiB - (512 * KiB + 256 * KiB + 2 * MiB)


@pytest.mark.parametrize("device, kind, index", [(2, "device", 2), (None, "pinned", 0),
                                                 (1, "managed", 1)])
def test_the_trace_is_at_the_pools_device_index(device, kind, index):
    traces = make_history(device=device, kind=kind).snapshot()["device_traces"]
    assert len(traces) == index + 1
    assert all(t == [] for t in traces[:index]) and len(traces[index]) == 12
    assert {s["device"] for s in make_history(device=device, kind=kind).snapshot()["segments"]} == {
        index}


def test_live_blocks_are_the_active_blocks_of_the_segments():
    snap = make_history().snapshot()
    active = {(b["address"], b["size"], tuple(f["name"] for f in b["frames"]))
              for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
    assert active == {(D, 2 * MiB, ("grad",)), (B, 512 * KiB, ("step",))}


def test_segments_are_tiled_by_their_blocks_as_the_viewer_reads_them():
    # The viewer ignores a block's address: it is the segment's plus the sizes before it.
    keys = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
            "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
    for seg in make_history().snapshot()["segments"]:
        assert set(seg) == keys
        offset = seg["address"]
        for b in seg["blocks"]:
            assert set(b) == {"address", "size", "requested_size", "state", "frames"}
            assert b["address"] == offset and b["size"] > 0
            offset += b["size"]
        assert offset == seg["address"] + seg["total_size"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"]
                                            if b["state"] == "active_allocated")


def test_every_traced_block_lies_in_a_segment():
    # The viewer's "Allocator State History" replays the trace backwards over the segments and
    # fails on a block outside every segment; the trace has no segment events, so the final
    # segments must hold every block the trace names.
    events = make_events()
    r = Recorder(t=events[-1]["time_ns"], reserved=events[-1]["reserved"], used=MiB)
    r("free", FAR, MiB)  # allocated before the history began
    events += r.events
    snap = History(make_header(), events).snapshot()
    spans = [(s["address"], s["address"] + s["total_size"]) for s in snap["segments"]]
    for e in snap["device_traces"][0]:
        assert not e["action"].startswith("segment")
        if "addr" in e:
            assert any(lo <= e["addr"] and e["addr"] + e["size"] <= hi for lo, hi in spans), e


def test_blocks_far_apart_are_separate_segments():
    r = Recorder()
    r("alloc", A, MiB)
    r("alloc", FAR, 3 * MiB, S2)
    segs = History(make_header(), r.events).snapshot()["segments"]
    assert [(s["address"], s["total_size"], s["stream"], s["segment_type"]) for s in segs] == [
        (A, MiB, S1, "small"), (FAR, 3 * MiB, S2, "large")]


def test_a_free_whose_allocation_is_older_than_the_history_is_traced():
    # The viewer draws a free with no alloc before it as a block live from the start.
    r = Recorder(reserved=2 * MiB, used=MiB)
    r("free", A, MiB)
    assert actions(History(make_header(), r.events).snapshot()) == [
        ("free_requested", A), ("free_completed", A)]


def test_empty_allocations_are_left_out_of_the_snapshot():
    r = Recorder()
    r("alloc", 0, 0)
    r("alloc", A, MiB)
    snap = History(make_header(), r.events).snapshot()
    assert actions(snap) == [("alloc", A)]
    assert [s["address"] for s in snap["segments"]] == [A]


# ---- files ---------------------------------------------------------------------------------------

EVENT_KEYS = {"time_ns", "action", "address", "bytes", "stream", "reserved", "used", "cached",
              "frames"}


def test_a_history_file_is_json_the_standard_library_reads(tmp_path):
    # The documented layout (docs/HISTORY.md, "The file"), read with json alone.
    h = make_history(dropped=5)
    path = tmp_path / "run.json"
    h.save(path)
    with open(path) as f:
        doc = json.load(f)
    assert list(doc) == ["format", "version", "units", "header", "events"]
    assert doc["format"] == "asyncmr-history" == hist.FORMAT
    assert doc["version"] == 1 == hist.VERSION
    assert doc["units"] == {"time": "ns", "size": "bytes"}
    assert doc["header"] == {k: v for k, v in h.header.items() if k != "version"}
    assert doc["events"] == list(h.events)
    assert all(set(e) == EVENT_KEYS for e in doc["events"])
    # One event a line, so that the file reads, greps and diffs an event at a time.
    lines = path.read_text().splitlines()
    assert [json.loads(line.strip().rstrip(",")) for line in lines[3:-1]] == doc["events"]


def test_save_and_load_give_the_same_history(tmp_path):
    h = make_history(dropped=5, worker="tcp://w1:1", note={"run": [1, "a", None, 0.5, True]})
    for name in ("h.json", "h.json.gz"):
        h.save(tmp_path / name)
        back = hist.load(tmp_path / name)
        assert back.header == h.header and back.events == h.events
        assert back.snapshot() == h.snapshot()


def test_empty_and_unicode_histories_round_trip(tmp_path):
    # A lone surrogate is how Python holds a file name's undecodable bytes: JSON escapes it.
    frames = [{"filename": "/données/\udcff.py", "line": 3, "name": "λ"}]
    for events in ([], [{**make_events()[1], "frames": frames}]):
        h = History(make_header(phases=[{"name": "état", "start_ns": 1, "end_ns": None}]), events)
        h.save(tmp_path / "u.json")
        back = hist.load(tmp_path / "u.json")
        assert back.header == h.header and back.events == h.events


def test_a_gz_name_compresses_and_load_reads_either_by_its_content(tmp_path):
    h = make_history()
    plain, packed = tmp_path / "h.json", tmp_path / "h.json.gz"
    h.save(plain)
    h.save(packed)
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()
    assert packed.stat().st_size < plain.stat().st_size / 2
    h.save(tmp_path / "again.json.GZ")
    assert (tmp_path / "again.json.GZ").read_bytes() == packed.read_bytes(), "the same bytes"
    # A renamed file still reads: gzip is known by its magic bytes, not the name.
    os.rename(packed, tmp_path / "renamed.json")
    os.rename(plain, tmp_path / "renamed.gz")
    for name in ("renamed.json", "renamed.gz"):
        assert hist.load(tmp_path / name).events == h.events


def test_save_refuses_a_pickle_name_writing_nothing(tmp_path):
    # A script that saved "run.pickle" for PyTorch's viewer would write JSON the viewer cannot
    # open: it is told where the viewer's file comes from instead.
    for name in ("run.pickle", "RUN.PKL"):
        with pytest.raises(ValueError, match=r"a history file is JSON, not a pickle .* "
                                             r"History\.export_torch_snapshot\(path\)"):
            make_history().save(tmp_path / name)
        with pytest.raises(ValueError, match="not a pickle"):
            hist.save_many(tmp_path / name, {"w": make_history()})
    assert not list(tmp_path.iterdir())


# The opcodes MemoryViz.js's unpickle() knows (torch/utils/viz/MemoryViz.js): any other opcode,
# or a protocol above 4, and the viewer throws.
VIEWER_OPCODES = {
    "APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME",
    "LONG1", "LONG_BINGET", "MARK", "MEMOIZE", "PROTO", "SETITEMS", "SHORT_BINUNICODE", "STOP",
    "TUPLE2", "APPEND", "NEWFALSE", "BINPUT", "BINUNICODE", "EMPTY_TUPLE", "NEWTRUE", "NONE",
    "BINFLOAT", "TUPLE", "TUPLE1", "TUPLE3", "LONG_BINPUT", "LIST", "DICT", "SETITEM"}


class Count(int):  # an int subclass, as NumPy's and enum's are: pickle writes it by its class
    pass


def test_the_torch_export_uses_only_what_pytorchs_viewer_unpickles(tmp_path):
    # Fields given as int and str subclasses are written as the plain values the viewer reads:
    # pickle writes a subclass by its class (GLOBAL, REDUCE), which the viewer cannot.
    events = make_events()
    events[1] = {**events[1], "bytes": Count(events[1]["bytes"]), "action": np.str_("alloc")}
    h = History(make_header(pool=Count(POOL)), events)
    path = tmp_path / "snapshot.pickle"
    h.export_torch_snapshot(path)
    ops = list(pickletools.genops(path.read_bytes()))
    assert ops[0][0].name == "PROTO" and 2 <= ops[0][1] <= 4
    assert {op.name for op, _, _ in ops} <= VIEWER_OPCODES
    assert pickle.loads(path.read_bytes()) == h.snapshot()  # a file this test wrote


def test_load_refuses_a_pickle_without_unpickling_it(tmp_path):
    # asyncmr reads no pickle, its own export included; one that would run code as it loads
    # (here, create a file) is refused the same way, before anything in it runs.
    export = tmp_path / "snapshot.pickle"
    make_history().export_torch_snapshot(export)
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    evil = tmp_path / "evil.json"
    evil.write_bytes(pickle.dumps({"format": "asyncmr-history", "x": Evil()}, protocol=4))
    packed = tmp_path / "evil.json.gz"
    packed.write_bytes(gzip.compress(evil.read_bytes()))
    for path in (export, evil, packed):
        for reader in (hist.load, hist.load_many):
            with pytest.raises(ValueError, match=rf"{re.escape(str(path))} is a pickle, not a "
                                                 r"history file: .* reads no pickle"):
                reader(path)
    assert not marker.exists()


def _doc(**changes):
    doc = hist.gather({"w": make_history(worker="w")})
    doc.pop("histories")
    doc.update({"header": {k: v for k, v in make_header().items() if k != "version"},
                "events": make_events()})
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not ...}


E = re.escape
NOT_A_HISTORY = [
    (b"", E("it is not JSON (Expecting value: line 1 column 1 (char 0))")),
    (b"not json", E("it is not JSON (Expecting value")),
    (b'{"format": "asyncmr-history", "version": 1', E("it is not JSON (Expecting")),
    (b"\xff\xfe{", E("it is not JSON (")),
    (b"[1, 2]", E('it is a JSON array without "format": "asyncmr-history"')),
    (b'"asyncmr-history"', E('it is a JSON string without "format"')),
    (b"null", E('it is JSON\'s null without "format"')),
    (json.dumps({"segments": [], "device_traces": [[]]}).encode(),
     E('it is an object without "format": "asyncmr-history"')),
    (json.dumps(_doc(format="torch-snapshot")).encode(), E('it is an object without "format"')),
    (json.dumps(_doc(version=2)).encode(),
     E("it is version 2 of the asyncmr-history format; this asyncmr reads version 1")),
    (json.dumps(_doc(version="1")).encode(), E('its "version" is "1", not an int')),
    (json.dumps(_doc(version=1.0)).encode(), E('its "version" is 1.0, not an int')),
    (json.dumps(_doc(version=...)).encode(), E('its "version" is null, not an int')),
    (json.dumps(_doc(units={"time": "us", "size": "bytes"})).encode(),
     E('its "units" are {"time": "us", "size": "bytes"}; version 1 records')),
    (json.dumps(_doc(units=...)).encode(), E('its "units" are null')),
    (json.dumps(_doc(header=..., events=...)).encode(),
     E('it has neither "header"/"events" (one history) nor "histories" (many)')),
    (json.dumps(_doc(histories={})).encode(), E('it has both "header"/"events"')),
    (b'{"format": "asyncmr-history", "version": 1, "units": {"time": "ns", "size": "bytes"}, '
     b'"header": {}, "events": [], "x": NaN}', E("it is not JSON (NaN is not a JSON number)")),
    (b'{"version": ' + b"9" * 5000 + b"}", E("it is not JSON (Exceeds the limit")),
    (b"\x1f\x8b\x08\x00garbage", E("its gzip data is damaged")),
    (gzip.compress(b'{"format": "asyncmr-history"}')[:-12], E("its gzip data is damaged")),
]


@pytest.mark.parametrize("content, why", NOT_A_HISTORY)
def test_load_of_a_file_that_is_not_a_history_names_the_file_and_what_is_wrong(tmp_path, content,
                                                                              why):
    path = tmp_path / "x.json"
    path.write_bytes(content)
    for reader in (hist.load, hist.load_many):
        with pytest.raises(ValueError, match=rf"^asyncmr: {E(str(path))} is not a history "
                                             rf"file: {why}"):
            reader(path)


MALFORMED = [
    (_doc(header=[]), r"header must be an object, got list"),
    (_doc(events={}), r"events must be a list of event dicts, got dict"),
    (_doc(events=...), r"a history has no 'events'"),
    (_doc(header={**_doc()["header"], "kind": "host"}), r"header\['kind'\] is 'host'"),
    (_doc(header={**_doc()["header"], "version": 2}), r"header\['version'\] is 2"),
    (_doc(events=[{**make_events()[0], "bytes": 1.5}]),
     r"events\[0\]\['bytes'\] must be an int, got float"),
    (_doc(events=[*make_events()[:2], {**make_events()[2], "action": "malloc"}]),
     r"events\[2\]\['action'\] is 'malloc'"),
    ({**_doc(header=..., events=...), "histories": []}, r"'histories' must be an object"),
    ({**_doc(header=..., events=...), "histories": {"w": 5}}, r"histories\['w'\]: a history "
                                                              r"must be an object, got int"),
    ({**_doc(header=..., events=...), "histories": {"w": {"header": make_header(worker="v"),
                                                          "events": []}}},
     r"histories\['w'\]: its header names worker 'v'"),
]


@pytest.mark.parametrize("doc, why", MALFORMED)
def test_load_of_a_malformed_history_names_the_file_and_the_field(tmp_path, doc, why):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    reader = hist.load_many if "histories" in doc else hist.load
    with pytest.raises(ValueError, match=rf"^asyncmr: {re.escape(str(path))} holds a malformed "
                                         rf"history: {why}"):
        reader(path)


DEEP_CHILD = r"""
import sys
from asyncmr import history
for reader in (history.load, history.load_many):
    try:
        reader(sys.argv[1])
    except ValueError as e:
        print("REFUSED", e, flush=True)
"""


@pytest.mark.parametrize("opening", [b"[", b'{"a":'])
def test_a_deeply_nested_file_is_refused_without_crashing(tmp_path, opening):
    # A million levels: json's parser recurses once a level, and stops at Python's recursion
    # limit with RecursionError. Run in a child: a crash must not take the test run with it.
    import subprocess
    import sys

    path = tmp_path / "deep.json"
    path.write_bytes(b'{"format": "asyncmr-history", "version": 1, "x": ' +
                     opening * 1_000_000 + b"0" + (b"]" if opening == b"[" else b"}") * 1_000_000
                     + b"}")
    proc = subprocess.run([sys.executable, "-c", DEEP_CHILD, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.splitlines() == [
        f"REFUSED asyncmr: {path} is not a history file: it nests JSON values deeper than "
        f"Python's recursion limit (a history file nests seven levels)"] * 2, proc.stdout


@pytest.mark.parametrize("save", [
    lambda target: make_history().save(target),
    lambda target: make_history().export_torch_snapshot(target),
    lambda target: hist.save_many(target, {"w": make_history(worker="w")}),
])
def test_a_file_descriptor_is_not_taken_for_a_path(save):
    # open() takes an int as a descriptor: a save wrote to it and closed it, a load read from it
    # and closed it (standard input, for 0).
    r, w = os.pipe()
    try:
        with pytest.raises(TypeError, match="path must be a str or an os.PathLike, got int"):
            save(w)
        for reader in (hist.load, hist.load_many):
            with pytest.raises(TypeError, match="path must be a str or an os.PathLike, got int"):
                reader(r)
        os.fstat(r), os.fstat(w)  # both still open
        os.set_blocking(r, False)
        with pytest.raises(BlockingIOError):
            os.read(r, 1)  # and nothing was written to the pipe
    finally:
        os.close(r)
        os.close(w)


def test_one_and_many_files_each_point_to_their_reader(tmp_path):
    one, many = tmp_path / "one.json", tmp_path / "many.json"
    make_history().save(one)
    hist.save_many(many, {"w1": make_history()})
    with pytest.raises(ValueError, match="holds 1 histories .* read it with load_many"):
        hist.load(many)
    with pytest.raises(ValueError, match="holds one history .* read it with load"):
        hist.load_many(one)


@pytest.mark.parametrize("change, exc, match", [
    ({"version": 2}, ValueError, r"header\['version'\] is 2; this asyncmr reads version 1"),
    ({"kind": "host"}, ValueError, r"header\['kind'\] is 'host'; expected one of"),
    ({"kind": 3}, TypeError, r"header\['kind'\] must be a str, got int"),
    ({"pool": 0}, ValueError, r"header\['pool'\] must be >= 1"),
    ({"pool": "0x1"}, TypeError, r"header\['pool'\] must be an int, got str"),
    ({"device": None}, ValueError, r"header\['device'\] is None for a device pool"),
    ({"kind": "pinned"}, ValueError, r"header\['device'\] is 0 for a pinned pool"),
    ({"device": -1}, ValueError, r"header\['device'\] must be >= 0"),
    ({"device": 2**16}, ValueError, r"header\['device'\] must be <= 65535, got 65536"),
    ({"pool": 2**64}, ValueError, r"header\['pool'\] must be <= 18446744073709551615"),
    ({"max_events": 10**30}, ValueError, r"header\['max_events'\] must be <= "),
    ({"dropped": True}, TypeError, r"header\['dropped'\] must be an int, got bool"),
    ({"stacks": "all"}, ValueError, r"header\['stacks'\] is 'all'"),
    ({"phases": {}}, TypeError, r"header\['phases'\] must be a list"),
    ({"phases": [{"name": "a", "start_ns": 5, "end_ns": 4}]}, ValueError,
     r"header\['phases'\]\[0\]\['end_ns'\] \(4\) is before its start_ns \(5\)"),
    ({"phases": [{"name": "a", "end_ns": 4}]}, ValueError,
     r"header\['phases'\]\[0\] has no 'start_ns'"),
    ({"worker": 7}, TypeError, r"header\['worker'\] must be a str"),
    ({"phases": [{"name": "a", "start_ns": 1, "end_ns": 2, "used_high": 10**400}]}, ValueError,
     r"header\['phases'\]\[0\]\['used_high'\] must be <= 18446744073709551615"),
    ({"phases": [{"name": "a", "start_ns": 1, "end_ns": 2, "reserved_high": -1}]}, ValueError,
     r"header\['phases'\]\[0\]\['reserved_high'\] must be >= 0"),
    ({"phases": [{"name": "a", "start_ns": 1, "end_ns": 2, "used_high": 1.5}]}, TypeError,
     r"header\['phases'\]\[0\]\['used_high'\] must be an int, got float"),
])
def test_a_bad_header_is_refused_naming_the_field(change, exc, match):
    with pytest.raises(exc, match=match):
        History(make_header(**change), make_events())


def test_a_header_without_a_field_is_refused_naming_it():
    header = make_header()
    del header["max_events"]
    with pytest.raises(ValueError, match=r"header has no 'max_events'"):
        History(header, [])
    with pytest.raises(TypeError, match=r"header must be a dict, got list"):
        History([], [])


@pytest.mark.parametrize("index, change, exc, match", [
    (1, {"action": "malloc"}, ValueError, r"events\[1\]\['action'\] is 'malloc'"),
    (1, {"bytes": -1}, ValueError, r"events\[1\]\['bytes'\] must be >= 0"),
    (1, {"bytes": 2**64}, ValueError, r"events\[1\]\['bytes'\] must be <= 18446744073709551615"),
    (2, {"reserved": 10**400}, ValueError, r"events\[2\]\['reserved'\] must be <= "),
    (2, {"time_ns": 2**64}, ValueError, r"events\[2\]\['time_ns'\] must be <= "),
    (2, {"stream": 1.0}, TypeError, r"events\[2\]\['stream'\] must be an int, got float"),
    (3, {"frames": None}, TypeError, r"events\[3\]\['frames'\] must be a list"),
    (6, {"frames": [frame("f")]}, ValueError,
     r"events\[6\]\['frames'\]: only alloc and cache_hit events carry frames, this one is 'free'"),
    (1, {"frames": [{"filename": "a.py", "line": "3", "name": "f"}]}, TypeError,
     r"events\[1\]\['frames'\]\[0\]\['line'\] must be an int"),
])
def test_a_bad_event_is_refused_naming_the_field(index, change, exc, match):
    events = make_events()
    events[index].update(change)
    with pytest.raises(exc, match=match):
        History(make_header(), events)


def test_an_event_without_a_field_or_frames_without_stacks_is_refused():
    events = make_events()
    del events[4]["used"]
    with pytest.raises(ValueError, match=r"events\[4\] has no 'used'"):
        History(make_header(), events)
    with pytest.raises(ValueError, match=r"events\[1\]\['frames'\] is not empty, but "
                                         r"header\['stacks'\] is 'none'"):
        History(make_header(stacks="none"), make_events())
    with pytest.raises(TypeError, match="events must be a list of event dicts, got dict"):
        History(make_header(), {})


# ---- many workers --------------------------------------------------------------------------------

def test_gather_save_many_and_load_many_keep_each_workers_history(tmp_path):
    histories = {"tcp://10.0.0.1:4000": make_history(),
                 "tcp://10.0.0.2:4000": make_history(kind="managed", device=1)}
    gathered = hist.gather(histories)
    assert list(gathered) == ["format", "version", "units", "histories"]
    assert {w: r["header"]["worker"] for w, r in gathered["histories"].items()} == {
        w: w for w in histories}
    assert not any("version" in r["header"] for r in gathered["histories"].values())
    for name in ("cluster.json", "cluster.json.gz"):
        hist.save_many(tmp_path / name, histories)
        back = hist.load_many(tmp_path / name)
        assert list(back) == list(histories)
        for worker, h in histories.items():
            assert back[worker].events == h.events
            assert back[worker].header == {**h.header, "worker": worker}
    with open(tmp_path / "cluster.json") as f:
        assert json.load(f) == gathered


def test_gather_refuses_a_history_under_another_workers_name():
    with pytest.raises(ValueError, match=r"histories\['w2'\] holds the history of worker 'w1'"):
        hist.gather({"w2": make_history(worker="w1")})
    with pytest.raises(TypeError, match=r"histories\['w1'\] must be a History"):
        hist.gather({"w1": make_history().snapshot()})


# ---- the timeline and the command ----------------------------------------------------------------

def _is_png(path):
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(b"\x89PNG\r\n\x1a\n")


def test_plot_writes_a_png_of_one_history(tmp_path):
    pytest.importorskip("matplotlib", reason="the timeline needs matplotlib")
    out = hist.plot(make_history(), tmp_path / "one.png", title="one pool")
    assert out == tmp_path / "one.png" and _is_png(out)


def test_plot_draws_phase_names_and_titles_as_text_not_mathtext(tmp_path):
    # matplotlib reads $...$ as math: "$\\foo$" ended the plot with a ParseFatalException.
    pytest.importorskip("matplotlib", reason="the timeline needs matplotlib")
    phases = [{"name": r"cost $\foo$ 50%", "start_ns": 1_001_000, "end_ns": 1_005_000}]
    out = hist.plot(make_history(phases=phases), tmp_path / "t.png", title=r"run $\bar$")
    assert _is_png(out)


def test_plot_writes_a_png_of_many_workers_one_lane_each(tmp_path):
    pytest.importorskip("matplotlib", reason="the timeline needs matplotlib")
    many = {"w1": make_history(), "w2": make_history(dropped=4), "w3": make_history(events=[])}
    assert _is_png(hist.plot(many, tmp_path / "many.png"))


def test_a_timeline_is_in_gib_from_a_gib_and_in_mib_below():
    from asyncmr._plot import unit_for

    assert unit_for(3 << 30) == ("GiB", 1 << 30)
    assert unit_for((1 << 30) - 1) == ("MiB", 1 << 20)


@pytest.mark.parametrize("title", [5, b"run", ["run"], True])
def test_plot_refuses_a_title_that_is_not_a_str(title, tmp_path):
    # It was drawn as str(title) ("5", "b'run'"), where the signature says str or None.
    with pytest.raises(TypeError, match=r"plot's title must be a str or None, got "):
        hist.plot(make_history(), tmp_path / "t.png", title=title)
    assert not (tmp_path / "t.png").exists()


def test_plot_refuses_worker_names_that_are_not_str(tmp_path):
    # {1: h, "1": h} drew two lanes both titled "1"; a worker's name is a str (Dask's addresses,
    # load_many's keys).
    with pytest.raises(TypeError, match=r"a worker's name must be a str, got int"):
        hist.plot({1: make_history(), "1": make_history()}, tmp_path / "m.png")
    assert not (tmp_path / "m.png").exists()


def test_main_plots_a_saved_history_and_exits_0(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the timeline needs matplotlib")
    path, out = tmp_path / "h.json.gz", tmp_path / "t.png"
    hist.save_many(path, {"w1": make_history(), "w2": make_history()})
    assert hist.main([str(path), "-o", str(out), "--title", "cluster"]) == 0
    assert _is_png(out)
    assert capsys.readouterr().out == f"asyncmr plot: wrote {out} (2 lanes)\n"


def test_main_exits_2_naming_a_file_of_no_histories(tmp_path, capsys):
    path = tmp_path / "none.json"
    hist.save_many(path, {})  # a cluster whose workers recorded nothing
    assert hist.main([str(path), "-o", str(tmp_path / "t.png")]) == 2
    assert capsys.readouterr().err == "asyncmr plot: no histories to plot\n"


def test_main_exits_2_for_more_lanes_than_a_timeline_draws(tmp_path, capsys):
    # Each lane is a subplot: their cost grows faster than the file (a 17.6 kB file of 300 empty
    # histories took 116 s and drew an 84 100-pixel PNG), so a file of more is refused at once.
    path, out = tmp_path / "many.json", tmp_path / "t.png"
    hist.save_many(path, {f"w{i}": make_history() for i in range(65)})
    started = time.monotonic()
    assert hist.main([str(path), "-o", str(out)]) == 2
    assert time.monotonic() - started < 5
    assert capsys.readouterr().err == (
        "asyncmr plot: 65 histories are more lanes than one timeline draws (64): plot a "
        "selection of them with asyncmr.history.plot\n")
    assert not out.exists()


def test_main_exits_2_naming_a_file_that_is_not_a_history(tmp_path, capsys):
    path = tmp_path / "x.json"
    path.write_bytes(b"\x00garbage")
    assert hist.main([str(path), "-o", str(tmp_path / "t.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"asyncmr plot: {path} is not a history file: it is not JSON (")
    assert err.count("\n") == 1, err
    assert not (tmp_path / "t.png").exists()


@pytest.mark.parametrize("twice, named, values", [
    (["-o", "a.png", "-o", "b.png"], "-o/--output", ("a.png", "b.png")),
    (["--output", "a.png", "-o", "b.png"], "-o/--output", ("a.png", "b.png")),
    (["--output=a.png", "-ob.png"], "-o/--output", ("a.png", "b.png")),
    (["--title", "first", "--title", "second"], "--title", ("first", "second")),
])
def test_main_refuses_an_option_given_twice_naming_it(tmp_path, capsys, monkeypatch, twice,
                                                       named, values):
    path = tmp_path / "h.json"
    make_history().save(path)
    monkeypatch.chdir(tmp_path)  # the default and the relative outputs land here
    with pytest.raises(SystemExit) as exit:
        hist.main([str(path), *twice])
    assert exit.value.code == 2
    first, then = values
    assert (f"error: argument {named}: given twice (first {first!r}, then {then!r})"
            in capsys.readouterr().err)
    assert not list(tmp_path.glob("*.png"))  # nothing was drawn


def test_main_exits_2_for_a_missing_file(tmp_path, capsys):
    assert hist.main([str(tmp_path / "nothing.json")]) == 2
    assert capsys.readouterr().err == (f"asyncmr plot: cannot read {tmp_path / 'nothing.json'}: "
                                       "No such file or directory\n")


# ---- PyTorch's own tools -------------------------------------------------------------------------

def test_pytorchs_memory_viz_renders_the_snapshot():
    """Not a GPU test (no CUDA is used): it needs only the torch package, which the GPU host has
    and this project's CPU machines may not; there it skips, naming why."""
    pytest.importorskip("torch", reason="torch is not installed here; the GPU host has it")
    from torch.cuda import _memory_viz

    snap = make_history().snapshot()
    for html in (_memory_viz.trace_plot(snap), _memory_viz.segment_plot(snap)):
        assert "<html>" in html and "MemoryViz.js" in html
    # segsum asserts that each segment's blocks add up to it; trace reads every entry's keys.
    assert "total_allocated: 2.5MiB" in _memory_viz.segsum(snap)
    text = _memory_viz.trace(snap)
    assert "raise OutOfMemoryError # 64.0MiB requested" in text, text


# ---- the README's timeline --------------------------------------------------------------------

def test_the_readme_timeline_is_drawn_from_its_committed_h200_recording(tmp_path):
    """docs/images/demo-history.json is the demo's recording on a GPU: json reads it, it
    loads as a History, shows what the README says (four 32 MiB grows, one trim of all
    128 MiB, nothing allocated at the end), and the plot draws it."""
    pytest.importorskip("matplotlib", reason="the timeline needs matplotlib")
    from pathlib import Path
    recording = Path(__file__).resolve().parent.parent / "docs" / "images" / "demo-history.json"
    with open(recording) as f:
        assert json.load(f)["format"] == "asyncmr-history"
    h = hist.load(recording)
    h.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == recording.read_bytes(), "as save writes it"
    grows = [e["bytes"] for e in h.events if e["action"] == "grow"]
    trims = [e["bytes"] for e in h.events if e["action"] == "trim"]
    assert grows == [32 << 20] * 4 and trims == [128 << 20]
    assert [p["name"] for p in h.header["phases"]] == ["load", "compute", "release"]
    assert h.outstanding() == [] and h.events[-1]["reserved"] == 0
    out = hist.plot(h, tmp_path / "t.png")
    assert Path(out).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_phase_with_its_peak_is_labelled_with_it():
    from asyncmr._plot import phase_label
    assert phase_label({"name": "load", "start_ns": 0, "end_ns": 1}) == "load"
    assert phase_label({"name": "load", "start_ns": 0, "end_ns": 1,
                        "used_high": 96 << 20}) == "load (peak 96.0 MiB)"
    assert phase_label({"name": "join", "used_high": 3 << 30}) == "join (peak 3.0 GiB)"
    assert phase_label({"name": "x", "used_high": "lots"}) == "x", "a non-int peak is not shown"


@pytest.mark.parametrize("bad, error", [("", ValueError), (None, TypeError), (3, TypeError),
                                        (b"load", TypeError), (True, TypeError)])
def test_a_phase_name_must_be_a_non_empty_str(bad, error):
    # A name of the wrong type is a TypeError naming the type, as every argument's is; an empty
    # str a ValueError (both were ValueError).
    from asyncmr._attributes import check_phase_name
    with pytest.raises(error, match="a phase needs a non-empty name" if error is ValueError
                       else r"a phase's name must be a str, got "):
        check_phase_name(bad)
    if bad is None:
        assert check_phase_name(bad, allow_none=True) is None
    assert check_phase_name("load") == "load"


@pytest.mark.parametrize("span_ns, unit", [(2_000_000_000, "s"), (1_000_000_000, "s"),
                                           (1_300_000, "ms"), (999_999, "us"), (0, "us")])
def test_the_timeline_picks_a_time_unit_its_span_reads_in(span_ns, unit):
    from asyncmr._plot import time_unit_for
    assert time_unit_for(span_ns)[0] == unit


# ---- files that are huge or endless when read, and saves that fail -------------------------------

def _plain_header(**changes):
    h = {"version": 1, "kind": "device", "pool": 1, "device": 0, "max_events": 1,
         "dropped": 0, "stacks": "python", "phases": [], "worker": None}
    h.update(changes)
    return h


def _plain_event(**changes):
    e = {"time_ns": 1, "action": "alloc", "address": 4096, "bytes": 8, "stream": 0,
         "reserved": 8, "used": 8, "cached": 0, "frames": []}
    e.update(changes)
    return e


BOUNDED_LOAD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # the test's host survives a failure
from asyncmr import history
try:
    history.load(sys.argv[1])
except ValueError as e:
    print("REFUSED", e)
    sys.exit(3)
"""


def _run_bounded(args, seconds=20):
    import subprocess
    import sys

    if os.environ.get("ASYNCMR_UNDER_SANITIZER") == "1":
        seconds *= 10  # compute-sanitizer instruments the child, which loads the CUDA libraries
    try:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              timeout=seconds)
    except subprocess.TimeoutExpired:
        pass  # failed below, outside the handler: the timeout is the whole story
    pytest.fail(f"reading the file did not end within {seconds} s", pytrace=False)


def test_a_large_history_with_stacks_round_trips_compressed(tmp_path):
    # Every event its own frames, as the recorder makes them: gzip takes the repeated keys.
    events = [_plain_event(time_ns=i + 1, address=4096 * (i + 1),
                           frames=[{"filename": f"m{j}.py", "line": j, "name": "f"}
                                   for j in range(32)]) for i in range(2000)]
    h = History(_plain_header(max_events=2000), events)
    h.save(tmp_path / "real.json")
    h.save(tmp_path / "real.json.gz")
    assert (tmp_path / "real.json.gz").stat().st_size * 10 < (tmp_path / "real.json").stat().st_size
    assert hist.load(tmp_path / "real.json.gz").events == h.events


def test_plot_of_a_fifo_exits_2_instead_of_waiting_for_a_writer(tmp_path, capsys):
    import threading

    fifo = tmp_path / "h.json"
    os.mkfifo(fifo)
    result = []
    t = threading.Thread(target=lambda: result.append(
        hist.main([str(fifo), "-o", str(tmp_path / "t.png")])), daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # let the blocked open go, so that the test run can end
        with open(fifo, "wb"):
            pass
        t.join(10)
        pytest.fail("python -m asyncmr plot FIFO waited for a writer")
    assert result == [2]
    assert "is not a history file: it is not a regular file" in capsys.readouterr().err


def test_a_character_device_is_refused_not_read_forever():
    run = _run_bounded(["-c", BOUNDED_LOAD, "/dev/zero"], seconds=120)
    assert run.returncode == 3, (run.returncode, run.stderr[-500:])
    assert "/dev/zero is not a history file: it is not a regular file" in run.stdout


OUT_OF_MEMORY_CHILD = """
import resource, sys
from asyncmr import history
# What this process maps now and 512 MiB more: too little for the file it is given.
with open("/proc/self/status") as f:
    mapped = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (mapped + (512 << 20), mapped + (512 << 20)))
try:
    history.load(sys.argv[1])
    print("LOADED")
except Exception as e:
    print(type(e).__name__, e)
"""


def _large_file(tmp_path, content):
    """The file these tests read, and its size: ``content``, or a 2 GiB sparse file for None."""
    path = tmp_path / "large.json"
    with open(path, "wb") as f:
        if content is None:
            f.truncate(2 << 30)
        else:
            f.write(content)
    return path, path.stat().st_size


LARGE = {
    "sparse-2GiB": (None, "reading"),  # read() asks for all of it at once
    "lists-16Mi": (b"[" + b"[]," * (16 << 20) + b"[]]", "parsing"),  # 48 MiB of empty lists
    # 1 GiB of spaces in 1 MiB of gzip: the bytes decompressed do not fit.
    "gzip-1GiB": (lambda: gzip.compress(b" " * (1 << 30), compresslevel=1), "decompressing"),
}


@pytest.mark.skipif(not os.path.exists("/proc/self/status"),
                    reason="the child reads its mapped size from Linux's /proc/self/status")
@pytest.mark.parametrize("case", list(LARGE))
def test_a_file_too_large_for_memory_is_a_memory_error_naming_it(tmp_path, case):
    # CPython's MemoryError says nothing: the error names the file, its size and the step.
    content, step = LARGE[case]
    path, size = _large_file(tmp_path, content() if callable(content) else content)
    run = _run_bounded(["-c", OUT_OF_MEMORY_CHILD, str(path)], seconds=120)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert re.fullmatch(rf"MemoryError asyncmr: out of memory {step} {re.escape(str(path))} "
                        rf"\({size} bytes\) as a history file\n", run.stdout), run.stdout


@pytest.mark.skipif(not os.path.exists("/proc/self/status"),
                    reason="the child reads its mapped size from Linux's /proc/self/status")
@pytest.mark.parametrize("case", ["sparse-2GiB", "lists-16Mi"])
def test_plot_of_a_file_too_large_for_memory_exits_2_in_one_line(tmp_path, case):
    # As for a file that cannot be read or is no history: the reason on one line, no traceback.
    content, step = LARGE[case]
    path, size = _large_file(tmp_path, content)
    # OUT_OF_MEMORY_CHILD's limit, then the command as `python -m asyncmr plot` runs it.
    child = OUT_OF_MEMORY_CHILD.split("try:")[0] + (
        "sys.exit(history.main([sys.argv[1], '-o', sys.argv[1] + '.png']))\n")
    run = _run_bounded(["-c", child, str(path)], seconds=120)
    assert (run.returncode, run.stdout) == (2, ""), (run.returncode, run.stderr[-2000:])
    assert run.stderr == (f"asyncmr plot: out of memory {step} {path} ({size} bytes) as a "
                          "history file\n"), run.stderr[-2000:]
    assert not os.path.exists(f"{path}.png")

# Finds, by halving, about the least memory past what it maps with which this process loads
# the history it is given, each try in a fork limited to it, and prints what every try got.
OUT_OF_MEMORY_SEARCH = """
import os, resource, sys
from asyncmr import history

def mapped():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize:"))

def attempt(extra):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        limit = mapped() + extra
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            history.load(sys.argv[1])
            out = "LOADED"
        except BaseException as e:
            out = f"{type(e).__name__} {e}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()

lo, hi = 0, 2 << 30
seen = [attempt(hi)]
while hi - lo > (2 << 20):
    mid = (lo + hi) // 2
    out = attempt(mid)
    seen.append(out)
    lo, hi = (lo, mid) if out == "LOADED" else (mid, hi)
for step in range(1, 9):  # just short of it, where the load's largest step runs out
    seen.append(attempt(max(hi - step * (1 << 20), 0)))
print("\\n".join(seen))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status") or not hasattr(os, "fork"),
                    reason="the child reads its mapped size from Linux's /proc/self/status")
@pytest.mark.parametrize("name", ["many.json", "many.json.gz"])
def test_every_step_of_a_load_that_runs_out_of_memory_names_the_file(tmp_path, name):
    # Reading, decompressing, parsing and the history's checks (which copy every event) each
    # need memory: with too little for any one of them, load raises a MemoryError naming the
    # file, its size and the step, never an empty one. Every try of the search loads or does so.
    path = tmp_path / name
    History(_plain_header(stacks="none", max_events=30_000),
            [_plain_event(time_ns=i + 1) for i in range(30_000)]).save(path)
    size = path.stat().st_size
    run = _run_bounded(["-c", OUT_OF_MEMORY_SEARCH, str(path)], seconds=120)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    tries = run.stdout.splitlines()
    assert "LOADED" in tries and any(t != "LOADED" for t in tries), run.stdout
    named = re.compile(rf"MemoryError asyncmr: out of memory (reading|decompressing|parsing|"
                       rf"checking) {re.escape(str(path))} \({size} bytes\) as a history file")
    wrong = sorted({t for t in tries if t != "LOADED" and not named.fullmatch(t)})
    assert not wrong, wrong


def test_plot_refuses_to_draw_over_the_history_it_reads(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "h.json"
    History(_plain_header(stacks="none"), [_plain_event()]).save(path)
    before = path.read_bytes()
    assert hist.main([str(path), "-o", str(path)]) == 2
    assert "is the same file as the history it draws" in capsys.readouterr().err
    assert path.read_bytes() == before


def test_a_device_ordinal_past_any_trace_list_is_refused_at_the_header():
    # A snapshot holds one trace list per device up to the pool's: 2**31 - 1 asked for 2**31.
    with pytest.raises(ValueError, match=r"header\['device'\] must be <= 65535, got 2147483647"):
        History(_plain_header(device=2**31 - 1, stacks="none"), [])


def test_plot_refuses_an_empty_output_name(tmp_path, capsys):
    path = tmp_path / "h.json"
    History(_plain_header(stacks="none"), [_plain_event()]).save(path)
    assert hist.main([str(path), "-o", ""]) == 2
    assert "asyncmr plot: -o needs a file name" in capsys.readouterr().err


@pytest.mark.parametrize("note, error, match", [
    (lambda: 0, TypeError, "Object of type function is not JSON serializable"),
    ({1, 2}, TypeError, "Object of type set is not JSON serializable"),
    (float("nan"), ValueError, "Out of range float values are not JSON compliant"),
    ({"x": [float("inf")]}, ValueError, "Out of range float values are not JSON compliant"),
])
def test_a_save_that_fails_leaves_the_file_it_would_replace_as_it_was(tmp_path, note, error,
                                                                      match):
    # A value JSON cannot write, in a key the history keeps as it is: the save raises before
    # the file is opened (writing as it encoded would cut a file it replaced short).
    path = tmp_path / "h.json"
    events = [_plain_event(time_ns=t) for t in range(1, 2001)]
    History(_plain_header(stacks="none"), events).save(path)
    before = path.read_bytes()
    for save in (lambda p: History(_plain_header(stacks="none", note=note), events).save(p),
                 lambda p: hist.save_many(p, {"w": History(_plain_header(stacks="none"),
                                                           [_plain_event(note=note)])})):
        with pytest.raises(error, match=rf"^asyncmr: a history file holds only JSON's values "
                                        rf"\(.*\): {match}"):
            save(path)
        assert path.read_bytes() == before
        with pytest.raises(error):
            save(tmp_path / "new.json.gz")
        assert not (tmp_path / "new.json.gz").exists()
    assert len(hist.load(path)) == 2000


class Ordinal(enum.IntEnum):
    gpu0 = 0


def test_a_value_of_a_subclass_in_a_key_beyond_the_format_is_saved_as_its_json_value(tmp_path):
    # A key beyond the format's keeps its value as it is; JSON writes an int, str or float
    # subclass (an IntEnum member, a NumPy str or float) as the plain value, which loads back.
    note = {"ordinal": Ordinal.gpu0, "name": np.str_("x"), "ratio": np.float64(0.5),
            "pair": (1, 2)}
    h = History(_plain_header(note=note), [_plain_event(note=note)])
    path = tmp_path / "h.json"
    h.save(path)
    plain = {"ordinal": 0, "name": "x", "ratio": 0.5, "pair": [1, 2]}  # a tuple is an array
    back = hist.load(path)
    assert back.header["note"] == plain and back.events[0]["note"] == plain
    assert [type(v) for v in back.header["note"].values()] == [int, str, float, list]


def test_a_fields_int_or_str_subclass_is_kept_as_the_plain_int_or_str(tmp_path):
    # An IntEnum member, an int subclass or a NumPy str passes as the int or str a field must be
    # (the recorder passes a NumPy str given as stacks= or a phase's name straight in); the
    # History keeps the plain value, which saves and loads back.
    s = np.str_
    header = _plain_header(
        version=Count(1), kind=s("device"), pool=Count(7), device=Ordinal.gpu0,
        max_events=Count(9), dropped=Count(0), stacks=s("python"), worker=s("tcp://w:1"),
        phases=[{"name": s("load"), "start_ns": Count(1), "end_ns": Count(5),
                 "used_high": Count(8), "reserved_high": Count(8)}])
    frame = {"filename": s("a.py"), "line": Count(3), "name": s("f")}
    event = _plain_event(action=s("alloc"), frames=[frame],
                         **{k: Count(v) for k, v in _plain_event().items() if type(v) is int})
    h = History(header, [event])
    fields = [h.header, *h.header["phases"], h.events[0], *h.events[0]["frames"]]
    assert all(type(v) in (int, str) for d in fields for k, v in d.items()
               if k not in ("phases", "frames")), fields
    path = tmp_path / "h.json"
    h.save(path)
    back = hist.load(path)
    assert back.header == h.header and back.events == h.events


@pytest.mark.parametrize("name", ["history.json", "history.json.gz"])
def test_a_save_the_disk_cannot_hold_leaves_the_file_it_would_replace_whole(tmp_path, name):
    # A write that fails part way (a full disk, a quota: here the file-size limit of a child
    # process, RLIMIT_FSIZE) must not cut the file save replaces short: the old file stays
    # whole, and no temporary file stays behind.
    import subprocess
    import sys

    path = tmp_path / name
    make_history().save(path)
    before = path.read_bytes()
    code = f"""
import os, resource, signal, sys
sys.path.insert(0, {str(os.path.dirname(__file__))!r})
from test_history import Recorder, make_header, A
from asyncmr.history import History
r = Recorder()
for i in range(20000):
    r("alloc", A + 4096 * i, 4096, frames=[{{"filename": os.urandom(8).hex(), "line": i,
                                            "name": "f"}}])
big = History(make_header(), r.events)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({len(before)} * 2, {len(before)} * 2))
try:
    big.save(sys.argv[1])
except OSError as e:
    print("refused:", e.errno)
else:
    print("saved")
"""
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "refused: 27", proc.stdout  # EFBIG
    assert path.read_bytes() == before, f"the old file was cut to {path.stat().st_size} bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
