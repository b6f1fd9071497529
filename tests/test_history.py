# SPDX-License-Identifier: Apache-2.0
"""Allocation history (asyncmr.history), on any machine: building a History from events,
what is outstanding, the PyTorch snapshot it makes, its files, the timeline and the command.

The events here are synthetic, shaped like the recorder's (src/pool_history.cpp): the GPU tests
of the recording itself are with the resources' tests."""

import enum
import math
import os
import pickle
import pickletools
import re

import time

import numpy as np
import pytest

from asyncmr import history as hist
from asyncmr._pickle_files import _scan, nesting
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

def test_the_snapshot_has_segments_device_traces_and_the_raw_history():
    snap = make_history().snapshot()
    assert set(snap) == {"segments", "device_traces", "asyncmr"}
    assert set(snap["asyncmr"]) == {"header", "events"}
    again = History(snap["asyncmr"]["header"], snap["asyncmr"]["events"])
    assert again.events == make_history().events


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

# The opcodes MemoryViz.js's unpickle() knows (torch/utils/viz/MemoryViz.js): any other opcode,
# or a protocol above 4, and the viewer throws.
VIEWER_OPCODES = {
    "APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME",
    "LONG1", "LONG_BINGET", "MARK", "MEMOIZE", "PROTO", "SETITEMS", "SHORT_BINUNICODE", "STOP",
    "TUPLE2", "APPEND", "NEWFALSE", "BINPUT", "BINUNICODE", "EMPTY_TUPLE", "NEWTRUE", "NONE",
    "BINFLOAT", "TUPLE", "TUPLE1", "TUPLE3", "LONG_BINPUT", "LIST", "DICT", "SETITEM"}


def test_a_saved_snapshot_uses_only_what_pytorchs_viewer_unpickles(tmp_path):
    path = tmp_path / "snapshot.pickle"
    make_history().save(path)
    ops = list(pickletools.genops(path.read_bytes()))
    assert ops[0][0].name == "PROTO" and 2 <= ops[0][1] <= 4
    assert {op.name for op, _, _ in ops} <= VIEWER_OPCODES


def test_save_and_load_give_the_same_history(tmp_path):
    h = make_history(dropped=5, worker="tcp://w1:1")
    path = tmp_path / "h.pickle"
    h.save(path)
    back = hist.load(path)
    assert back.header == h.header and back.events == h.events
    with open(path, "rb") as f:
        assert pickle.load(f)["device_traces"] == h.snapshot()["device_traces"]


def test_load_of_a_file_that_is_not_a_pickle_names_it(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a pickle")
    with pytest.raises(ValueError, match=r"notes\.txt is not a history file: it does not unpickle"):
        hist.load(path)


def test_load_of_a_foreign_pickle_names_it(tmp_path):
    path = tmp_path / "other.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}))
    with pytest.raises(ValueError, match=r"other\.pickle is a PyTorch memory snapshot without "
                                         r"asyncmr's history \(no 'asyncmr' key\)"):
        hist.load(path)
    path.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(ValueError, match=r"other\.pickle is a pickled list, not an asyncmr"):
        hist.load(path)


def test_load_refuses_a_pickle_that_names_a_class_without_running_it(tmp_path):
    class Evil:  # its pickle calls builtins.ValueError; pickled by its own __reduce__, as
        # distributed's tblib patch (exceptions pickled through tblib) does not reach it
        def __reduce__(self):
            return (ValueError, ("boom",))

    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"asyncmr": Evil()}))
    with pytest.raises(ValueError, match=r"evil\.pickle is not a history file: it holds a "
                                         r"builtins\.ValueError object \(refused"):
        hist.load(path)


DEEP_CHILD = r"""
import sys
from asyncmr import history
for reader in (history.load, history.load_many):
    try:
        reader(sys.argv[1])
    except ValueError as e:
        print("REFUSED", e, flush=True)
"""


@pytest.mark.parametrize("depth, put", [(100_000, b""), (1_000_000, b""),
                                        (1_000_000, b"p 0\n"), (1_000_000, b"p+0\n"),
                                        (1_000_000, b"p0_0\n")])
def test_a_deeply_nested_pickle_is_refused_without_crashing(tmp_path, depth, put):
    # {((...(0,),...),): {}}: a tuple nested `depth` deep as a dict key, a few bytes a level. The
    # C unpickler hashes the key recursively (the interpreter died: SIGSEGV at 1e6 levels), and
    # a message that shows it recursed past Python's limit. Run in a child: a crash must not
    # take the test run with it.
    import subprocess
    import sys

    path = tmp_path / "deep.pickle"
    # `put`: a memo index the unpickler reads and the scan did not (it let such files through).
    path.write_bytes(b"\x80\x02}K\x00" + put + b"\x85" * depth + b"}s.")
    proc = subprocess.run([sys.executable, "-c", DEEP_CHILD, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all(
        line.startswith(f"REFUSED asyncmr: {path} is not a history file: it nests values "
                        f"deeper than") or
        line.startswith(f"REFUSED asyncmr: {path} is not a history file: it does not unpickle")
        for line in lines), proc.stdout


def _nesting_by_genops(data):
    """The reference for history's nesting scan: the same rule on pickletools.genops' reading
    of the opcodes (slow, in Python). Each value built is a node; a memo GET or a DUP pushes the
    node it names, so a container filled after it was put in another deepens every value that
    holds it, and a value that holds itself nests infinitely deep."""
    fills = {"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD", "DUP"}
    mark, children, stack, memo = object(), [], [], {}

    def new_node(items):
        children.append(list(items))
        return len(children) - 1

    for op, arg, _ in pickletools.genops(data):
        if op.name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            memo[arg if op.name != "MEMOIZE" else len(memo)] = stack[-1] if stack else mark
            continue
        if op.name in ("GET", "BINGET", "LONG_BINGET"):
            node = memo.get(arg, mark)
            stack.append(new_node(()) if node is mark else node)
            continue
        items = []
        if pickletools.stackslice in op.stack_before:
            while stack[-1] is not mark:
                items.append(stack.pop())
            stack.pop()
            fixed = op.stack_before.index(pickletools.markobject)
        else:
            fixed = len(op.stack_before)
        below = [stack.pop() for _ in range(fixed)][::-1]
        if not op.stack_after:
            continue  # POP, POP_MARK, STOP: nothing built
        if op.name in fills and below:
            node = below[0]
            children[node] += below[1:] + items
        else:
            node = new_node(below + items)
        for item in op.stack_after:
            stack.append(mark if item is pickletools.markobject else node)

    depth, on_path = {}, set()

    def depth_of(node):
        if node in on_path:
            return math.inf
        if node not in depth:
            on_path.add(node)
            depth[node] = 1 + max(map(depth_of, children[node])) if children[node] else 0
            on_path.discard(node)
        return depth[node]

    return max(map(depth_of, range(len(children))), default=0)


def _first_hashed_by_genops(data):
    """The reference for the scan's other answer: the offset of the first opcode that hashes (as
    a dict key or set item) a value no str, bytes, None, bool or 4-byte int opcode pushed, or -1.
    A memo GET or a DUP pushes what it names; a value True is such an atom."""
    hashable = {"str", "bytes", "bytes_or_str", "None", "bool"}
    every = {"SETITEM": 2, "SETITEMS": 2, "DICT": 2, "ADDITEMS": 1, "FROZENSET": 1}
    mark, stack, memo = object(), [], {}
    for op, arg, pos in pickletools.genops(data):
        if op.name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            memo[arg if op.name != "MEMOIZE" else len(memo)] = bool(stack) and stack[-1] is True
            continue
        if op.name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo.get(arg, False))
            continue
        items = []
        if pickletools.stackslice in op.stack_before:
            while stack[-1] is not mark:
                items.insert(0, stack.pop())
            stack.pop()
            fixed = op.stack_before.index(pickletools.markobject)
        else:
            fixed = len(op.stack_before)
        below = [stack.pop() for _ in range(fixed)][::-1]
        if op.name in every:
            filled = op.name in ("SETITEM", "SETITEMS", "ADDITEMS")  # below[0]: the container
            values = (below[1:] if filled else below) + items
            if any(v is not True for v in values[::every[op.name]]):
                return pos
        pushed = (op.name in ("BININT", "BININT1", "BININT2") or
                  [a.name for a in op.stack_after] in ([h] for h in hashable))
        for item in op.stack_after:
            stack.append(mark if item is pickletools.markobject else
                         below[0] if op.name == "DUP" else pushed)
    return -1


def _random_value(rng, depth):
    if depth == 0 or rng.random() < 0.3:
        return rng.choice([None, True, 7, -(2**70), 1.5, "s", "ü" * 300, b"b", b"x" * 300])
    kind = rng.choice(["tuple", "list", "dict", "set", "frozenset"])
    n = rng.randrange(0, 4)
    if kind in ("set", "frozenset"):
        values = {rng.choice([1, 2, "a", (1, (2,))]) for _ in range(n)}
        return set(values) if kind == "set" else frozenset(values)
    children = [_random_value(rng, depth - 1) for _ in range(n)]
    if children and rng.random() < 0.3:
        children.append(children[0])  # shared: read back through the memo
    if kind == "dict":  # keys the scan takes, and ones it does not (hashed past their bytes)
        return {rng.choice([f"k{i}", i, -i, 2**40 + i, i + 0.5, (i,), ()]): c
                for i, c in enumerate(children)}
    return tuple(children) if kind == "tuple" else children


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_the_nesting_scan_agrees_with_pickletools(protocol):
    import random

    rng = random.Random(protocol)
    for _ in range(300):
        data = pickle.dumps(_random_value(rng, rng.randrange(0, 9)), protocol=protocol)
        assert nesting(data) == _nesting_by_genops(data), pickletools.dis(data)
        assert _scan(data)[1] == _first_hashed_by_genops(data), pickletools.dis(data)
        with pytest.raises(ValueError):
            nesting(data[:-1])  # no STOP
    for bad in (b"", b"\xff", b"K", b"X\xff\xff\xff\x7f", b"e."):  # unknown op, short, no mark
        with pytest.raises(ValueError):
            nesting(bad)


# Pickles whose containers are filled after another container took them (read back through the
# memo or a DUP): what a crafted file can do, and pickle.dumps does only for a value that holds
# itself. Each takes how many levels to build and nests at least that deep.
_OP = {op.name: op.code.encode("latin-1") for op in pickletools.opcodes}


def _asm(*parts):
    return b"".join(_OP[p] if isinstance(p, str) else p for p in parts)


def _u4(i):
    return i.to_bytes(4, "little")


def _lists_memoized_empty(n):
    # L0 = []; each L_k memoized empty, then given L_k-1 from the memo: L_n nests n deep.
    parts = ["PROTO", b"\x02", "EMPTY_LIST", "LONG_BINPUT", _u4(0), "POP"]
    for k in range(1, n + 1):
        parts += ["EMPTY_LIST", "LONG_BINPUT", _u4(k), "LONG_BINGET", _u4(k - 1), "APPEND", "POP"]
    return _asm(*parts, "LONG_BINGET", _u4(n), "STOP")


def _dicts_filled_after_they_are_set(n):
    # D0 = {}; each D_k set in D_k-1 while empty, then filled itself: D0 nests n deep.
    parts = ["PROTO", b"\x04", "EMPTY_DICT", "MEMOIZE"]
    for k in range(1, n + 1):
        parts += ["LONG_BINGET", _u4(k - 1), "BININT1", b"\x00", "EMPTY_DICT", "MEMOIZE",
                  "SETITEM", "POP"]
    return _asm(*parts, "STOP")


def _tuples_of_lists_filled_later(n):
    # T_k = (L_k,) built while L_k is empty, then L_k = [T_k-1]: T_n nests 2n + 1 deep.
    parts = ["PROTO", b"\x04"]
    for k in range(n + 1):
        parts += ["EMPTY_LIST", "MEMOIZE", "TUPLE1", "MEMOIZE", "POP"]  # memo 2k: L_k, 2k+1: T_k
        if k:
            parts += ["LONG_BINGET", _u4(2 * k), "LONG_BINGET", _u4(2 * k - 1), "APPEND", "POP"]
    return _asm(*parts, "LONG_BINGET", _u4(2 * n + 1), "STOP")


def _a_set_filled_after_it_is_appended(n):
    # [S], then S gets a tuple nested n - 2 deep: n deep (a set holds only what hashes).
    parts = ["PROTO", b"\x04", "EMPTY_LIST", "EMPTY_SET", "MEMOIZE", "APPEND",
             "BINGET", b"\x00", "MARK", "NONE", *["TUPLE1"] * (n - 2), "ADDITEMS", "POP"]
    return _asm(*parts, "STOP")


def _depth_of_value(value):
    """How deep `value` nests (math.inf when it holds itself), read off the value; a walk of
    its own, not a recursion, for values deeper than Python recurses."""
    def items(v):
        if isinstance(v, dict):
            return [*v.keys(), *v.values()]
        return list(v) if isinstance(v, (list, tuple, set, frozenset)) else []

    depth, on_path, todo = {}, set(), [(value, False)]
    while todo:
        v, children_done = todo.pop()
        if children_done:
            on_path.discard(id(v))
            depth[id(v)] = max((depth[id(i)] + 1 for i in items(v)), default=0)
        elif id(v) in on_path:
            return math.inf  # reached again below itself
        elif id(v) not in depth:
            on_path.add(id(v))
            todo.append((v, True))
            todo += [(i, False) for i in items(v)]
    return depth[id(value)]


FILLED_LATER = [_lists_memoized_empty, _dicts_filled_after_they_are_set,
                _tuples_of_lists_filled_later, _a_set_filled_after_it_is_appended]


@pytest.mark.parametrize("build", FILLED_LATER)
def test_a_container_filled_after_another_took_it_is_counted_at_its_depth(build):
    # The unpickler builds the value; its depth is what the scan must report, not the depth the
    # container had when it was memoized or put in another.
    data = build(20)
    depth = _depth_of_value(pickle.loads(data))
    assert depth >= 20
    assert _nesting_by_genops(data) == depth
    assert nesting(data) == depth


def _holds_itself_through_a_dup():
    # l = [(l,)]: DUP pushes the list twice, a tuple takes one, the other is filled with it.
    return _asm("PROTO", b"\x02", "EMPTY_LIST", "DUP", "TUPLE1", "APPEND", "STOP")


def _a_list_in_itself():
    v = []
    v.append(v)
    return pickle.dumps(v, protocol=4)


def _a_dict_in_itself():
    v = {}
    v["self"] = [v]
    return pickle.dumps(v, protocol=4)


@pytest.mark.parametrize("make", [*(lambda build=build: build(200) for build in FILLED_LATER[:3]),
                                  lambda: _a_set_filled_after_it_is_appended(65),
                                  _holds_itself_through_a_dup, _a_list_in_itself,
                                  _a_dict_in_itself],
                         ids=[*(b.__name__ for b in FILLED_LATER[:3]), "a set one past the limit",
                              "through a dup", "a list in itself", "a dict in itself"])
def test_a_pickle_nesting_deeper_through_containers_filled_later_is_refused(tmp_path, make):
    # A value that holds itself nests without end. The unpickler builds each of these from a
    # few bytes a level; the set nests MAX_NESTING + 1.
    from asyncmr._pickle_files import MAX_NESTING

    data = make()
    assert _depth_of_value(pickle.loads(data)) > MAX_NESTING
    path = tmp_path / "deep.pickle"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=f"deep.pickle is not a history file: it nests values "
                                         f"deeper than {MAX_NESTING} levels"):
        hist.load(path)


def test_a_value_nested_to_the_limit_and_shared_at_every_level_is_read(tmp_path):
    # Each level holds the one below twice: pickle.dumps writes the second through the memo,
    # after it is complete. The scan counts it once at its depth, no deeper.
    from asyncmr._pickle_files import MAX_NESTING, read_plain_pickle

    value = None
    for _ in range(MAX_NESTING):
        value = [value, value]
    path = tmp_path / "shared.pickle"
    path.write_bytes(pickle.dumps(value, protocol=4))
    assert nesting(path.read_bytes()) == MAX_NESTING
    back = read_plain_pickle(path, "a test file", "a test")[0]
    for _ in range(MAX_NESTING):  # not ==: it would compare 2**64 paths
        assert back[0] is back[1]
        back = back[0]
    assert back is None


@pytest.mark.parametrize("save", [
    lambda target: make_history().save(target),
    lambda target: hist.save_many(target, {"w": make_history(worker="w")}),
])
def test_a_file_descriptor_is_not_taken_for_a_path(save):
    # open() takes an int as a descriptor: a save wrote the pickle to it and closed it, a load
    # read from it and closed it (standard input, for 0).
    import os

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


def test_load_of_a_malformed_history_names_the_file_and_the_field(tmp_path):
    path = tmp_path / "bad.pickle"
    snap = make_history().snapshot()
    snap["asyncmr"]["events"][2]["action"] = "malloc"
    path.write_bytes(pickle.dumps(snap))
    with pytest.raises(ValueError, match=r"bad\.pickle holds a malformed history: "
                                         r"events\[2\]\['action'\] is 'malloc'"):
        hist.load(path)


def test_one_and_many_files_each_point_to_their_reader(tmp_path):
    one, many = tmp_path / "one.pickle", tmp_path / "many.pickle"
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
    assert set(gathered) == {"asyncmr_histories"}
    assert {w: r["header"]["worker"] for w, r in gathered["asyncmr_histories"].items()} == {
        w: w for w in histories}
    path = tmp_path / "cluster.pickle"
    hist.save_many(path, histories)
    back = hist.load_many(path)
    assert list(back) == list(histories)
    for worker, h in histories.items():
        assert back[worker].events == h.events
        assert back[worker].header == {**h.header, "worker": worker}


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
    path, out = tmp_path / "h.pickle", tmp_path / "t.png"
    hist.save_many(path, {"w1": make_history(), "w2": make_history()})
    assert hist.main([str(path), "-o", str(out), "--title", "cluster"]) == 0
    assert _is_png(out)
    assert capsys.readouterr().out == f"asyncmr plot: wrote {out} (2 lanes)\n"


def test_main_exits_2_naming_a_file_of_no_histories(tmp_path, capsys):
    path = tmp_path / "none.pickle"
    hist.save_many(path, {})  # a cluster whose workers recorded nothing
    assert hist.main([str(path), "-o", str(tmp_path / "t.png")]) == 2
    assert capsys.readouterr().err == "asyncmr plot: no histories to plot\n"


def test_main_exits_2_for_more_lanes_than_a_timeline_draws(tmp_path, capsys):
    # Each lane is a subplot: their cost grows faster than the file (a 17.6 kB file of 300 empty
    # histories took 116 s and drew an 84 100-pixel PNG), so a file of more is refused at once.
    path, out = tmp_path / "many.pickle", tmp_path / "t.png"
    hist.save_many(path, {f"w{i}": make_history() for i in range(65)})
    started = time.monotonic()
    assert hist.main([str(path), "-o", str(out)]) == 2
    assert time.monotonic() - started < 5
    assert capsys.readouterr().err == (
        "asyncmr plot: 65 histories are more lanes than one timeline draws (64): plot a "
        "selection of them with asyncmr.history.plot\n")
    assert not out.exists()


def test_main_exits_2_naming_a_file_that_is_not_a_history(tmp_path, capsys):
    path = tmp_path / "x.pickle"
    path.write_bytes(b"\x00garbage")
    assert hist.main([str(path), "-o", str(tmp_path / "t.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"asyncmr plot: {path} is not a history file: it does not unpickle")
    assert not (tmp_path / "t.png").exists()


@pytest.mark.parametrize("twice, named, values", [
    (["-o", "a.png", "-o", "b.png"], "-o/--output", ("a.png", "b.png")),
    (["--output", "a.png", "-o", "b.png"], "-o/--output", ("a.png", "b.png")),
    (["--output=a.png", "-ob.png"], "-o/--output", ("a.png", "b.png")),
    (["--title", "first", "--title", "second"], "--title", ("first", "second")),
])
def test_main_refuses_an_option_given_twice_naming_it(tmp_path, capsys, monkeypatch, twice,
                                                       named, values):
    path = tmp_path / "h.pickle"
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
    assert hist.main([str(tmp_path / "nothing.pickle")]) == 2
    assert capsys.readouterr().err == (f"asyncmr plot: cannot read {tmp_path / 'nothing.pickle'}: "
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
    """docs/images/demo-history.pickle is the demo's recording from the H200: it loads as a
    History, shows what the README says (four 32 MiB grows, one trim of all 128 MiB, nothing
    allocated at the end), and the plot draws it."""
    pytest.importorskip("matplotlib", reason="the timeline needs matplotlib")
    from pathlib import Path
    recording = Path(__file__).resolve().parent.parent / "docs" / "images" / "demo-history.pickle"
    h = hist.load(recording)
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


# ---- files that are small on disk and huge or endless when read ---------------------------------

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


def _load_bounded(path):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", BOUNDED_LOAD, str(path)], capture_output=True,
                          text=True, timeout=120)


def test_a_file_of_shared_events_and_frames_is_refused_not_expanded(tmp_path):
    # Pickle's memo lets one event and one frame list be named 20,000 times each: under 100 kB
    # on disk, 4e8 frame dicts (~80 GB) once History copies every event's frames.
    n = 20_000
    frames = [{"filename": "a.py", "line": 1, "name": "f"}] * n
    path = tmp_path / "bomb.pickle"
    with open(path, "wb") as f:
        pickle.dump({"asyncmr": {"header": _plain_header(),
                                 "events": [_plain_event(frames=frames)] * n}}, f, protocol=4)
    assert path.stat().st_size < 100_000
    run = _load_bounded(path)
    assert run.returncode == 3, (run.returncode, run.stderr[-500:])
    assert "shares values, expanding past the file's size" in run.stdout


def test_a_file_of_shared_event_keys_is_refused_not_expanded(tmp_path):
    # One event of 20,000 keys named 20,000 times: each reference is copied whole.
    n = 20_000
    event = _plain_event(**{f"k{i}": None for i in range(n)})
    path = tmp_path / "bomb.pickle"
    with open(path, "wb") as f:
        pickle.dump({"asyncmr": {"header": _plain_header(), "events": [event] * n}}, f,
                    protocol=4)
    run = _load_bounded(path)
    assert run.returncode == 3, (run.returncode, run.stderr[-500:])
    assert "shares values, expanding past the file's size" in run.stdout


def test_a_history_asyncmr_wrote_is_within_its_own_budget(tmp_path):
    # Every event its own frames (as save() writes them): far fewer values than bytes.
    events = [_plain_event(time_ns=i + 1, address=4096 * (i + 1),
                           frames=[{"filename": f"m{j}.py", "line": j, "name": "f"}
                                   for j in range(32)]) for i in range(2000)]
    path = tmp_path / "real.pickle"
    History(_plain_header(max_events=2000), events).save(path)
    assert len(hist.load(path).events) == 2000


def test_plot_of_a_fifo_exits_2_instead_of_waiting_for_a_writer(tmp_path, capsys):
    import os
    import threading

    fifo = tmp_path / "h.pickle"
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
    run = _load_bounded("/dev/zero")
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
    path = tmp_path / "large.pickle"
    with open(path, "wb") as f:
        if content is None:
            f.truncate(2 << 30)
        else:
            f.write(content)
    return path, path.stat().st_size


@pytest.mark.skipif(not os.path.exists("/proc/self/status"),
                    reason="the child reads its mapped size from Linux's /proc/self/status")
@pytest.mark.parametrize("content, steps", [
    (None, "reading"),  # a 2 GiB sparse file: read() asks for all of it at once
    (b"\x80\x02" + b"]" * (16 << 20) + b".", "unpickling"),  # 16 Mi empty lists
    (b"\x80\x02" + b"]" * (64 << 20) + b".", "unpickling"),  # the scan's stack too
], ids=["sparse-2GiB", "lists-16Mi", "lists-64Mi"])
def test_a_file_too_large_for_memory_is_a_memory_error_naming_it(tmp_path, content, steps):
    # CPython's MemoryError says nothing, and the unpickler's was reported as 'it does not
    # unpickle ()', a history it might be: the error names the file, its size and the step.
    path, size = _large_file(tmp_path, content)
    run = _run_bounded(["-c", OUT_OF_MEMORY_CHILD, str(path)], seconds=120)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert re.fullmatch(rf"MemoryError asyncmr: out of memory ({steps}) {re.escape(str(path))} "
                        rf"\({size} bytes\) as a history file\n", run.stdout), run.stdout


@pytest.mark.skipif(not os.path.exists("/proc/self/status"),
                    reason="the child reads its mapped size from Linux's /proc/self/status")
@pytest.mark.parametrize("content, step", [
    (None, "reading"),  # a 2 GiB sparse file
    (b"\x80\x02" + b"]" * (16 << 20) + b".", "unpickling"),  # 16 Mi empty lists
], ids=["sparse-2GiB", "lists-16Mi"])
def test_plot_of_a_file_too_large_for_memory_exits_2_in_one_line(tmp_path, content, step):
    # As for a file that cannot be read or is no history: the reason on one line, no traceback.
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
def test_a_history_that_loads_but_not_its_checks_is_a_memory_error_naming_it(tmp_path):
    # Past the unpickler, the history's checks copy every event: with memory for the unpickling
    # but not for them, load raised a MemoryError with no message and plot printed an empty
    # reason. Every try of the search must load or name the file, its size and the step.
    path = tmp_path / "many.pickle"
    History(_plain_header(stacks="none", max_events=30_000),
            [_plain_event(time_ns=i + 1) for i in range(30_000)]).save(path)
    size = path.stat().st_size
    run = _run_bounded(["-c", OUT_OF_MEMORY_SEARCH, str(path)], seconds=120)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    tries = run.stdout.splitlines()
    assert "LOADED" in tries and any(t != "LOADED" for t in tries), run.stdout
    named = re.compile(rf"MemoryError asyncmr: out of memory (reading|unpickling|checking) "
                       rf"{re.escape(str(path))} \({size} bytes\) as a history file")
    wrong = sorted({t for t in tries if t != "LOADED" and not named.fullmatch(t)})
    assert not wrong, wrong


def test_plot_refuses_to_draw_over_the_history_it_reads(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "h.pickle"
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
    path = tmp_path / "h.pickle"
    History(_plain_header(stacks="none"), [_plain_event()]).save(path)
    assert hist.main([str(path), "-o", ""]) == 2
    assert "asyncmr plot: -o needs a file name" in capsys.readouterr().err


# ---- files whose keys cost the unpickler without end to hash -------------------------------------

def _shared_tuples_hashed_as(use, n):
    # T0 = (), T_k = (T_k-1, T_k-1) through the memo: n + 1 levels (within the nesting limit for
    # n = 60) but 2**n paths, and CPython caches no tuple's hash: hashing T_n, as the unpickler
    # does for a dict key or a set item, takes 2**n steps inside the C unpickler.
    parts = ["PROTO", b"\x04", {"a dict key": "EMPTY_DICT", "a set item": "EMPTY_SET"}.get(use, "")]
    parts += ["EMPTY_TUPLE", "MEMOIZE", "POP"]
    for k in range(n):
        parts += ["LONG_BINGET", _u4(k), "LONG_BINGET", _u4(k), "TUPLE2", "MEMOIZE", "POP"]
    parts += {"a dict key": ["LONG_BINGET", _u4(n), "BININT1", b"\x01", "SETITEM"],
              "a set item": ["MARK", "LONG_BINGET", _u4(n), "ADDITEMS"],
              "a frozenset item": ["MARK", "LONG_BINGET", _u4(n), "FROZENSET"]}[use]
    return _asm(*[p for p in parts if p], "STOP")


def _colliding_int_keys(n):
    # {k * (2**61 - 1): 1 for k in 1..n}: CPython hashes an int modulo 2**61 - 1, so every key
    # hashes to 0 and each insertion probes all the keys before it (16,000 keys, 223 kB: 1.9 s;
    # the time grows with the square of the file's size).
    parts = ["PROTO", b"\x04", "EMPTY_DICT", "MARK"]
    for k in range(1, n + 1):
        v = k * (2**61 - 1)
        b = v.to_bytes(v.bit_length() // 8 + 1, "little", signed=True)
        parts += ["LONG1", bytes([len(b)]), b, "BININT1", b"\x01"]
    return _asm(*parts, "SETITEMS", "STOP")


HASHED_CHILD = """
import sys
from asyncmr import history
for reader in (history.load, history.load_many):
    try:
        reader(sys.argv[1])
    except ValueError as e:
        print("REFUSED", e, flush=True)
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


HASH_REFUSAL = ("is not a history file: it has a dict key or set item that is not a str, bytes, "
                "bool, None or int of at most 4 bytes")


@pytest.mark.parametrize("make", [
    lambda: _shared_tuples_hashed_as("a dict key", 60),
    lambda: _shared_tuples_hashed_as("a set item", 60),
    lambda: _shared_tuples_hashed_as("a frozenset item", 60),
    lambda: _colliding_int_keys(80_000),
], ids=["dict key of 2**60 paths", "set item of 2**60 paths", "frozenset item of 2**60 paths",
        "80,000 int keys of one hash"])
def test_a_key_whose_hash_costs_more_than_its_bytes_is_refused_before_unpickling(tmp_path, make):
    # The first, written with BINGET for LONG_BINGET, is 432 bytes: it hung load() and plot.
    path = tmp_path / "hashed.pickle"
    path.write_bytes(make())
    run = _run_bounded(["-c", HASHED_CHILD, str(path)])
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    lines = run.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith(f"REFUSED asyncmr: {path} {HASH_REFUSAL}")
                                   for line in lines), run.stdout


def test_plot_of_a_file_whose_key_hashes_without_end_exits_2(tmp_path):
    path = tmp_path / "hashed.pickle"
    path.write_bytes(_shared_tuples_hashed_as("a dict key", 60))
    run = _run_bounded(["-m", "asyncmr", "plot", str(path), "-o", str(tmp_path / "t.png")])
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert f"asyncmr plot: {path} {HASH_REFUSAL}" in run.stderr


def test_a_history_with_a_shared_value_in_a_key_it_keeps_loads_without_walking_it(tmp_path):
    # Keys beyond a history's own are kept as they are, never hashed, compared, printed or walked
    # by load, save or plot: a value of 2**60 paths there costs its bytes. A reader that walked
    # it (a deep copy, ==, a recursive check) would not end, and this test would time out.
    pytest.importorskip("matplotlib")
    dag = ()
    for _ in range(60):
        dag = (dag, dag)
    path = tmp_path / "shared.pickle"
    History(_plain_header(note=dag, stacks="none"), [_plain_event(note=dag)]).save(path)
    assert path.stat().st_size < 10_000
    child = ("import sys\nfrom asyncmr import history\nh = history.load(sys.argv[1])\n"
             "h.save(sys.argv[1] + '.again')\n"
             "print(history.main([sys.argv[1] + '.again', '-o', sys.argv[1] + '.png']))\n")
    run = _run_bounded(["-c", child, str(path)])
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.splitlines()[-1] == "0", run.stdout


def test_the_committed_demo_recording_has_only_str_keys_and_no_sets():
    # What the key rule relies on: asyncmr's files key every dict by a str and hold no set.
    from pathlib import Path

    data = (Path(__file__).resolve().parent.parent / "docs" / "images" /
            "demo-history.pickle").read_bytes()
    names = {op.name for op, _, _ in pickletools.genops(data)}
    assert not names & {"EMPTY_SET", "ADDITEMS", "FROZENSET"}
    todo, seen = [pickle.loads(data)], set()
    while todo:
        v = todo.pop()
        if id(v) not in seen:
            seen.add(id(v))
            if isinstance(v, dict):
                assert all(type(k) is str for k in v), list(v)
                todo += v.values()
            elif isinstance(v, (list, tuple)):
                todo += v
    assert hist.load(Path(__file__).resolve().parent.parent / "docs" / "images" /
                     "demo-history.pickle").events


MEMO_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # the test's host survives a failure
from asyncmr import history
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    history.load(sys.argv[1])
    print("LOADED")
except ValueError as e:
    print("REFUSED", e)
print("GREW", (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


@pytest.mark.parametrize("put", [
    b"r" + (1 << 26).to_bytes(4, "little"),        # LONG_BINPUT: 1 GiB of memo, loaded
    b"r" + (2**31 - 1).to_bytes(4, "little"),      # LONG_BINPUT: 32 GiB
    b"p4294967295\n",                              # PUT, decimal: 64 GiB
], ids=["LONG_BINPUT 2**26", "LONG_BINPUT 2**31-1", "PUT 2**32-1"])
def test_a_memo_index_past_the_files_size_is_refused_before_unpickling(tmp_path, put):
    # CPython's unpickler grows its memo to twice the index a PUT names, as an array: a history
    # with one LONG_BINPUT of 2**31 - 1 (5 bytes) made it allocate 32 GiB. A pickler numbers its
    # memo from 0, one entry per value written, so an index past the file's size is none of ours.
    body = pickle.dumps({"asyncmr": {"header": _plain_header(), "events": [_plain_event()]}},
                        protocol=2)
    assert body.startswith(b"\x80\x02")
    path = tmp_path / "memo.pickle"
    path.write_bytes(body[:2] + b"N" + put + b"0" + body[2:])  # None, memoized, popped
    run = _run_bounded(["-c", MEMO_CHILD, str(path)], seconds=60)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    lines = run.stdout.splitlines()
    assert lines[0].startswith(f"REFUSED asyncmr: {path} is not a history file: it names memo "
                               f"index "), run.stdout
    assert "past the file's size" in lines[0], run.stdout
    # The peak's growth while loading, MiB: nothing near the index's size (the peak itself is the
    # import's on a GPU host: 1376 MiB on an H100, where asyncmr loads the CUDA libraries).
    assert int(lines[1].split()[1]) < 256, run.stdout


def test_a_save_that_fails_leaves_the_file_it_would_replace_as_it_was(tmp_path):
    # A value pickle cannot write, in a key the history keeps as it is: the save raised after
    # it had cut the file it replaced to its first 64 kB frame, a history no longer.
    path = tmp_path / "h.pickle"
    events = [_plain_event(time_ns=t) for t in range(1, 2001)]
    History(_plain_header(stacks="none"), events).save(path)
    before = path.read_bytes()
    with pytest.raises(Exception) as failed:
        History(_plain_header(stacks="none", note=lambda: 0), events).save(path)
    assert len(path.read_bytes()) == len(before) and path.read_bytes() == before
    assert failed.type is TypeError and "asyncmr: " in str(failed.value), failed.value
    assert "function" in str(failed.value), failed.value
    assert len(hist.load(path)) == 2000
    with pytest.raises(TypeError, match=r"function"):
        hist.save_many(tmp_path / "many.pickle",
                       {"w": History(_plain_header(stacks="none", note=print), events)})
    assert not (tmp_path / "many.pickle").exists()


class Ordinal(enum.IntEnum):  # at module level: pickle writes it by name
    gpu0 = 0


@pytest.mark.parametrize("where", ["header", "event"])
def test_save_refuses_a_value_its_own_load_would_refuse(tmp_path, where):
    # A key beyond the format's keeps its value as it is, and pickle writes an int or str
    # subclass or a NumPy scalar by its class, which load refuses to import: save wrote a file
    # no asyncmr could read back.
    np = pytest.importorskip("numpy")
    for value, type_name in ((Ordinal.gpu0, "Ordinal"), (np.str_("x"), "str_"),
                             (np.float64(0.5), "float64")):
        h = (History(_plain_header(note=value), [_plain_event()]) if where == "header" else
             History(_plain_header(), [_plain_event(note=value)]))
        path = tmp_path / "h.pickle"
        with pytest.raises(TypeError, match=rf"asyncmr: .*{type_name}"):
            h.save(path)
        assert not path.exists()


class Count(int):  # an int subclass, as NumPy's and enum's are: pickle writes it by name
    pass


def test_a_fields_int_or_str_subclass_is_kept_as_the_plain_int_or_str(tmp_path):
    # An IntEnum member, an int subclass or a NumPy str passes as the int or str a field must be
    # (the recorder passes a NumPy str given as stacks= or a phase's name straight in); the
    # History keeps the plain value, which saves and loads back, where it kept the subclass
    # (which save now refuses: a file load refused).
    np = pytest.importorskip("numpy")
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
    path = tmp_path / "h.pickle"
    h.save(path)
    back = hist.load(path)
    assert back.header == h.header and back.events == h.events


def test_a_save_the_disk_cannot_hold_leaves_the_file_it_would_replace_whole(tmp_path):
    # A write that fails part way (a full disk, a quota: here the file-size limit of a child
    # process, RLIMIT_FSIZE) cut the file save replaced short: it was opened for writing, and so
    # emptied, before the first byte went out. The old file must stay whole, and no temporary
    # file stay behind.
    import subprocess
    import sys

    path = tmp_path / "history.pickle"
    old = make_history()
    old.save(path)
    before = path.read_bytes()
    code = f"""
import resource, signal, sys
sys.path.insert(0, {str(os.path.dirname(__file__))!r})
from test_history import Recorder, make_header, A
from asyncmr.history import History
r = Recorder()
for i in range(20000):
    r("alloc", A + 4096 * i, 4096)
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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.pickle"]
