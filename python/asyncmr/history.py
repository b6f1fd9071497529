# SPDX-License-Identifier: Apache-2.0
"""Allocation history: what a resource's recorder saw, as data to query, save (JSON), export to
PyTorch's memory viewer and plot.

A history is a header (the pool, its device, the ring's size, how many events it dropped, the
phases) and a list of events: each allocation and free, front-cache hit and put, pool growth
and trim, and failed allocation, with the pool's reserved and used bytes and the cache's bytes
after it. ``mr.record_history()`` makes them; this module reads them. The format, what PyTorch's
viewer shows of a driver pool and what it cannot show are in docs/HISTORY.md.

    python -m asyncmr plot HISTORY [-o timeline.png] [--title T]
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from asyncmr import _validate
from asyncmr._history_files import (FORMAT, VERSION, document, many_document, out_of_memory,
                                    read_document, write_document, write_torch_snapshot)

__all__ = ["ACTIONS", "FORMAT", "KINDS", "VERSION", "History", "gather", "load", "load_many",
           "main", "plot", "save_many"]

KINDS = ("pinned", "device", "managed")
ACTIONS = ("alloc", "free", "cache_hit", "cache_put", "grow", "trim", "oom")
STACKS = ("none", "python")
_MAKES_LIVE = frozenset({"alloc", "cache_hit"})
_ENDS_LIVE = frozenset({"free", "cache_put"})
_EVENT_INTS = ("time_ns", "address", "bytes", "stream", "reserved", "used", "cached")
_UINT64_MAX = 2**64 - 1
_MAX_DEVICE = 2**16 - 1  # the snapshot holds a trace list per device up to the pool's
_Event = dict[str, Any]
_Step = tuple[str, _Event, _Event]  # ("alloc" | "free" | "oom", event, block): see _replay
# Blocks closer together than this share one segment of the snapshot. A display choice (the
# driver does not say how it lays out a pool): alignment padding and small holes between
# neighbours should not cut a segment into slivers.
_SEGMENT_GAP = 2 << 20
_LARGE_SEGMENT = 1 << 20  # PyTorch calls a segment above 1 MiB "large"


# ---- checks: a ValueError names the field for a bad value, a TypeError for a wrong type ---------

def _type_error(where: str, what: str, value: object) -> TypeError:
    return TypeError(f"asyncmr: {where} must be {what}, got {type(value).__name__}")


def _get(where: str, record: Mapping[str, Any], key: str) -> Any:
    try:
        return record[key]
    except KeyError:
        raise ValueError(f"asyncmr: {where} has no {key!r}") from None


def _int(where: str, value: object, minimum: int = 0, maximum: int = _UINT64_MAX) -> int:
    """An int in [minimum, maximum]: every field is a uint64 in C++ unless said otherwise (a
    value past that came from nowhere asyncmr writes, and would overflow what reads it)."""
    if (plain := _validate.integer(value)) is None:  # NumPy's integers too; no bool, no float
        raise _type_error(where, "an int", value)
    if plain < minimum:
        raise ValueError(f"asyncmr: {where} must be >= {minimum}, got {value}")
    if plain > maximum:
        raise ValueError(f"asyncmr: {where} must be <= {maximum}, got {value}")
    return plain  # a plain int (of a subclass, an IntEnum member, too), which saves as one


def _str(where: str, value: object) -> str:
    if not isinstance(value, str):
        raise _type_error(where, "a str", value)
    return str.__str__(value)  # the plain str of a subclass (a NumPy str)


def _choice(where: str, value: object, choices: Sequence[str]) -> str:
    if (text := _str(where, value)) not in choices:
        raise ValueError(f"asyncmr: {where} is {value!r}; expected one of "
                         f"{', '.join(map(repr, choices))}")
    return text


def _typed(where: str, value: Any, types: type | tuple[type, ...], what: str) -> Any:
    if isinstance(value, types):
        return value
    raise _type_error(where, what, value)


def _check_header(header: object) -> dict[str, Any]:
    h = _typed("header", header, Mapping, "a dict")
    out = dict(h)  # keys this version does not know are kept; those it knows, as plain values
    out["version"] = version = _int("header['version']", _get("header", h, "version"))
    if version != VERSION:
        raise ValueError(f"asyncmr: header['version'] is {version}; this asyncmr reads "
                         f"version {VERSION}")
    out["kind"] = kind = _choice("header['kind']", _get("header", h, "kind"), KINDS)
    out["pool"] = _int("header['pool']", _get("header", h, "pool"), 1)
    device = _get("header", h, "device")
    if device is not None:  # a CUDA device ordinal
        out["device"] = device = _int("header['device']", device, maximum=_MAX_DEVICE)
    if (kind == "device") != (device is not None) and kind != "managed":
        raise ValueError(f"asyncmr: header['device'] is {device} for a {kind} pool: a device "
                         f"pool's memory is on a device (an int), a pinned pool's on the host "
                         f"(None)")
    for key in ("max_events", "dropped"):
        out[key] = _int(f"header[{key!r}]", _get("header", h, key))
    out["stacks"] = _choice("header['stacks']", _get("header", h, "stacks"), STACKS)
    phases = []
    listed = _typed("header['phases']", _get("header", h, "phases"), (list, tuple), "a list")
    for i, phase in enumerate(listed):
        where = f"header['phases'][{i}]"
        p = dict(_typed(where, phase, Mapping, "a dict"))
        p["name"] = _str(f"{where}['name']", _get(where, p, "name"))
        p["start_ns"] = start = _int(f"{where}['start_ns']", _get(where, p, "start_ns"))
        if (end := _get(where, p, "end_ns")) is not None:
            p["end_ns"] = end = _int(f"{where}['end_ns']", end)
        if end is not None and end < start:
            raise ValueError(f"asyncmr: {where}['end_ns'] ({end}) is before its start_ns "
                             f"({start})")
        for peak in ("used_high", "reserved_high"):  # a track_peak phase's peaks, in bytes
            if peak in p:
                p[peak] = _int(f"{where}['{peak}']", p[peak])
        phases.append(p)
    out["phases"] = phases
    if (worker := _get("header", h, "worker")) is not None:
        out["worker"] = _str("header['worker']", worker)
    return out


def _check_event(i: int, event: object, stacks: str) -> dict[str, Any]:
    where = f"events[{i}]"
    e = _typed(where, event, Mapping, "a dict")
    out = dict(e)
    out["action"] = action = _choice(f"{where}['action']", _get(where, e, "action"), ACTIONS)
    for key in _EVENT_INTS:  # names the field only for a value that fails the quick test
        if type(value := _get(where, e, key)) is not int or not 0 <= value <= _UINT64_MAX:
            out[key] = _int(f"{where}[{key!r}]", value)
    frames = _typed(f"{where}['frames']", _get(where, e, "frames"), (list, tuple), "a list")
    if frames and stacks != "python":
        raise ValueError(f"asyncmr: {where}['frames'] is not empty, but header['stacks'] is "
                         f"{stacks!r}")
    if frames and action not in _MAKES_LIVE:
        raise ValueError(f"asyncmr: {where}['frames']: only alloc and cache_hit events carry "
                         f"frames, this one is {action!r}")
    checked = []
    for j, f in enumerate(frames):
        if not (type(f) is dict and type(f.get("filename")) is str and type(f.get("name")) is str
                and type(line := f.get("line")) is int and line >= 0):
            fw = f"{where}['frames'][{j}]"
            f = _typed(fw, f, Mapping, "a dict")
            f = {"filename": _str(f"{fw}['filename']", _get(fw, f, "filename")),
                 "line": _int(f"{fw}['line']", _get(fw, f, "line")),
                 "name": _str(f"{fw}['name']", _get(fw, f, "name"))}
        checked.append({"filename": f["filename"], "line": f["line"], "name": f["name"]})
    out["frames"] = checked
    return out


# ---- the history ---------------------------------------------------------------------------------

class History:
    """One resource's recorded allocation history: a header and its events, oldest first.

    Parameters
    ----------
    header : Mapping[str, Any]
        ``version`` (1), ``kind`` ("pinned", "device" or "managed"), ``pool`` (the pool's
        handle), ``device`` (the GPU the pool's memory is on; None for host pools),
        ``max_events`` (the ring's size), ``dropped`` (events the ring lost), ``stacks``
        ("none" or "python"), ``phases`` (``{"name", "start_ns", "end_ns"}``, ``end_ns`` None
        while open) and ``worker`` (a Dask worker's address, or None). Keys beyond these are
        kept as they are.
    events : Iterable[Mapping[str, Any]]
        Each ``{"time_ns", "action", "address", "bytes", "stream", "reserved", "used",
        "cached", "frames"}``; sizes in bytes, ``reserved``/``used`` the pool's bytes and
        ``cached`` the front cache's bytes right after the event, ``frames`` the Python stack
        of an alloc or cache_hit (innermost call first) when ``stacks`` is "python".

    Raises
    ------
    TypeError, ValueError
        A field of the wrong type; a missing field or a value out of range (the message names
        the field).

    Notes
    -----
    Events keep the recorder's order, in which threads can be a few ns out of time order (it
    reads the clock before taking a slot). ``header`` is a copy; ``events`` are the History's
    own dicts (do not modify them).
    """

    __slots__ = ("_header", "_events")

    def __init__(self, header: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> None:
        self._header = _check_header(header)
        if isinstance(events, (str, bytes, Mapping)) or not isinstance(events, Iterable):
            raise _type_error("events", "a list of event dicts", events)
        stacks = self._header["stacks"]
        self._events = tuple(_check_event(i, e, stacks) for i, e in enumerate(events))

    @property
    def header(self) -> dict[str, Any]:
        """A copy of the header."""
        return {**self._header, "phases": [dict(p) for p in self._header["phases"]]}

    @property
    def events(self) -> tuple[dict[str, Any], ...]:
        """The events, in the recorder's order (oldest first)."""
        return self._events

    @property
    def dropped(self) -> int:
        """How many events the recorder lost (its ring was full, or a slot was busy)."""
        return int(self._header["dropped"])

    def __len__(self) -> int:
        return len(self._events)

    def __repr__(self) -> str:
        h = self._header
        where = f" on device {h['device']}" if h["device"] is not None else ""
        worker = f" of {h['worker']}" if h["worker"] is not None else ""
        return (f"<History: {h['kind']} pool {h['pool']:#x}{where}{worker}, "
                f"{len(self._events)} events, {h['dropped']} dropped>")

    def outstanding(self, now_ns: int | None = None) -> list[dict[str, Any]]:
        """The allocations live at the end of the history, largest first (ties: oldest first).

        A block is live from its alloc or cache_hit until a free or cache_put of its address;
        a block in the front cache is not live (the pool still counts it used).

        Parameters
        ----------
        now_ns : int, optional
            The steady-clock time, in ns, that ages are measured to; by default the latest
            event's time. It must not be earlier than that.

        Returns
        -------
        list[dict[str, Any]]
            ``{"address", "bytes", "stream", "age_s", "frames"}`` per block; ``bytes`` in
            bytes, ``age_s`` in seconds.
        """
        latest = max((e["time_ns"] for e in self._events), default=0)
        if now_ns is None:
            now_ns = latest
        elif (now_ns := _int("now_ns", now_ns)) < latest:
            raise ValueError(f"asyncmr: now_ns ({now_ns}) is before the history's latest event "
                             f"({latest})")
        _, live = _replay(self._events)
        blocks = sorted(live.values(), key=lambda e: (-e["bytes"], e["time_ns"]))
        return [{"address": e["address"], "bytes": e["bytes"], "stream": e["stream"],
                 "age_s": (now_ns - e["time_ns"]) / 1e9, "frames": [dict(f) for f in e["frames"]]}
                for e in blocks]

    def snapshot(self) -> dict[str, Any]:
        """The history as a PyTorch memory snapshot (the layout of
        ``torch.cuda.memory._snapshot()``), which https://pytorch.org/memory_viz and
        ``torch.cuda._memory_viz`` open.

        Returns
        -------
        dict[str, Any]
            ``segments`` (the address ranges the history's blocks covered, live blocks as
            "active_allocated" blocks, the rest "inactive") and ``device_traces`` (one list per
            device index, this history's at ``header["device"]``, at 0 for a host pool). Pool
            growth and trims are not in the trace: PyTorch's segment events name an address
            range, a driver pool reports only a size (see docs/HISTORY.md).
        """
        device = self._header["device"]
        index = 0 if device is None else device
        events = self._raw()["events"]  # the trace shares its copies of the frames
        steps, live = _replay(events)
        traces: list[list[dict[str, Any]]] = [[] for _ in range(index + 1)]
        traces[index] = [entry for step in steps for entry in _trace_entries(*step)]
        return {"segments": _segments(events, live, index, self._header["pool"]),
                "device_traces": traces}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the history to ``path`` as asyncmr's JSON history file (docs/HISTORY.md),
        gzip-compressed when the name ends in ``.gz``; :func:`load` reads it back. Raises
        TypeError or ValueError, writing nothing, for a value JSON cannot write (a set, a NaN)
        or a ``.pickle`` or ``.pkl`` name (:meth:`export_torch_snapshot` writes the viewer's
        pickle). An existing file is replaced only once the new one is whole."""
        write_document(path, document(self._raw()))

    def export_torch_snapshot(self, path: str | os.PathLike[str]) -> None:
        """Writes :meth:`snapshot` to ``path`` as the pickle PyTorch's memory viewer opens
        (protocol 4, the newest it reads). asyncmr does not read this file back: keep the
        history itself with :meth:`save`."""
        write_torch_snapshot(path, self.snapshot())

    def _raw(self) -> dict[str, Any]:
        return {"header": self.header,
                "events": [{**e, "frames": [dict(f) for f in e["frames"]]} for e in self._events]}


# ---- from events to PyTorch's trace and segments -------------------------------------------------

def _replay(events: Sequence[_Event]) -> tuple[list[_Step], dict[int, _Event]]:
    """Replays the events as the user saw them.

    Returns the steps, each (what, event, block) where what is "alloc", "free" or "oom" (the
    event gives the time and stream, the block its address, size and frames), and the blocks
    live at the end by address.
    """
    live: dict[int, _Event] = {}
    cached: set[int] = set()  # addresses the front cache holds
    # A free is noted after the pool took the block back, so another thread may note the
    # pool's next allocation at that address first: that allocation ends the earlier block, and
    # the late free (or cache_put) that follows is the earlier block's, already replayed.
    late: dict[int, int] = {}
    steps: list[_Step] = []
    born: dict[int, int] = {}  # address: the index of its block's allocation
    for i, e in enumerate(events):
        action, addr = e["action"], e["address"]
        if action == "oom":
            steps.append(("oom", e, e))
        elif action in ("grow", "trim") or e["bytes"] == 0:
            continue  # no trace entry: see History.snapshot; an empty block holds nothing
        elif action in _MAKES_LIVE:
            cached.discard(addr)  # the cache let it go to the pool without an event
            earlier = live.get(addr)
            if earlier is not None:
                late[addr] = late.get(addr, 0) + 1
                steps.append(("free", e, earlier))
            live[addr], born[addr] = e, i
            steps.append(("alloc", e, e))
        elif action in _ENDS_LIVE:
            if late.get(addr):
                late[addr] -= 1
                continue
            block = live.pop(addr, None)
            if block is None and action == "free" and addr in cached:
                cached.discard(addr)  # the cache gave a block the user freed back to the pool
                continue
            if action == "cache_put":
                cached.add(addr)
            # With no block, the allocation is older than the history: the viewer shows such a
            # free as a block that was live from the start.
            steps.append(("free", e, e if block is None else block))
    # Blocks that overlap without sharing an address: the pool joined a freed block with its
    # neighbour and served a newer allocation from both before the free was noted. The newer
    # block is the live one.
    kept: list[_Event] = []
    for e in sorted(live.values(), key=lambda e: e["address"]):
        if kept and e["address"] < kept[-1]["address"] + kept[-1]["bytes"]:
            if born[e["address"]] > born[kept[-1]["address"]]:
                kept[-1] = e
            continue
        kept.append(e)
    return steps, {e["address"]: e for e in kept}


def _trace_entries(what: str, event: _Event, block: _Event) -> list[dict[str, Any]]:
    """PyTorch's trace entries (torch.cuda.memory._snapshot's TraceEntry) for one step."""
    common = {"stream": event["stream"], "time_us": event["time_ns"] // 1000}
    if what == "oom":
        # PyTorch's oom entry has no addr; its device_free is what cudaMemGetInfo said. The
        # recorder does not ask the device; the pool's unused reserve is what it knows.
        return [{"action": "oom", "size": event["bytes"], "frames": [],
                 "device_free": max(event["reserved"] - event["used"], 0), **common}]
    entry = {"addr": block["address"], "size": block["bytes"], "frames": block["frames"], **common}
    if what == "alloc":
        return [{"action": "alloc", **entry}]
    # A stream-ordered free is reusable in stream order at once: requested and completed
    # together (the viewer shows the pair as one "free").
    return [{"action": "free_requested", **entry}, {"action": "free_completed", **entry}]


def _segments(events: Sequence[_Event], live: dict[int, _Event], device: int,
              pool: int) -> list[dict[str, Any]]:
    """One segment per address range the history's blocks covered (blocks closer than
    _SEGMENT_GAP joined), tiled by its live blocks and the gaps between them, as PyTorch's viewer
    reads segments: a block's address is the segment's plus the sizes of the blocks before it."""
    ranges = sorted((e["address"], e["address"] + e["bytes"], i)
                    for i, e in enumerate(events)
                    if e["bytes"] and e["action"] in _MAKES_LIVE | _ENDS_LIVE)
    merged: list[list[int]] = []  # [start, end, index of the range's first event]
    for start, end, i in ranges:
        if merged and start - merged[-1][1] < _SEGMENT_GAP:
            merged[-1][1] = max(merged[-1][1], end)
            merged[-1][2] = min(merged[-1][2], i)
        else:
            merged.append([start, end, i])
    blocks = sorted(live.values(), key=lambda e: e["address"])  # do not overlap (_replay)
    out: list[dict[str, Any]] = []
    k = 0
    for start, end, first in merged:
        pieces: list[tuple[int, int, _Event | None]] = []  # (address, size, live block or None)
        cursor = start
        while k < len(blocks) and blocks[k]["address"] < end:
            b = blocks[k]
            if b["address"] > cursor:
                pieces.append((cursor, b["address"] - cursor, None))
            pieces.append((b["address"], b["bytes"], b))
            cursor, k = b["address"] + b["bytes"], k + 1
        if cursor < end:
            pieces.append((cursor, end - cursor, None))
        tiles = [{"address": a, "size": n, "requested_size": n if b else 0,
                  "state": "active_allocated" if b else "inactive",
                  "frames": b["frames"] if b else []} for a, n, b in pieces]
        active = sum(n for _, n, b in pieces if b)
        out.append({"device": device, "address": start, "total_size": end - start,
                    "allocated_size": active, "active_size": active, "requested_size": active,
                    "stream": events[first]["stream"],
                    "segment_type": "large" if end - start > _LARGE_SEGMENT else "small",
                    "segment_pool_id": (0, pool), "is_expandable": False, "frames": [],
                    "blocks": tiles})
    return out


# ---- files ---------------------------------------------------------------------------------------

def _from_raw(raw: object, version: int) -> History:
    r = _typed("a history", raw, Mapping, "an object")
    header = _typed("header", _get("a history", r, "header"), Mapping, "an object")
    return History({"version": version, **header}, _get("a history", r, "events"))


def _read(path: str | os.PathLike[str]) -> History | dict[str, History]:
    """The history in a file from History.save, or the histories in one from save_many."""
    doc = read_document(path)
    name, where = os.fspath(path), ""
    one, many = "header" in doc or "events" in doc, "histories" in doc
    if one == many:
        both, also = ("both", "and") if one else ("neither", "nor")
        raise ValueError(f"asyncmr: {name} is not a history file: it has {both} \"header\"/"
                         f"\"events\" (one history) {also} \"histories\" (many)")
    try:
        if not many:
            return _from_raw(doc, doc["version"])
        out = {}
        for worker, raw in _typed("'histories'", doc["histories"], Mapping, "an object").items():
            where = f"histories[{worker!r}]: "
            h = _from_raw(raw, doc["version"])
            if h.header["worker"] != worker:
                raise ValueError(f"asyncmr: its header names worker {h.header['worker']!r}")
            out[worker] = h
        return out
    except (TypeError, ValueError) as e:
        raise ValueError(f"asyncmr: {name} holds a malformed history: "
                         f"{where}{str(e).removeprefix('asyncmr: ')}") from None
    except MemoryError:  # the checks copy every event: more than parsing took
        raise out_of_memory("checking", name, os.path.getsize(name)) from None


def load(path: str | os.PathLike[str]) -> History:
    """Reads a history written by :meth:`History.save` (JSON, gzip-compressed or not).

    Raises
    ------
    ValueError
        The file is not an asyncmr history file (not JSON, a pickle, another format or version),
        holds a malformed history, or several (read those with :func:`load_many`); the message
        names the file and what is wrong. OSError: it cannot be read. MemoryError: it is too
        large for the memory left (the message names the file, its size and the step).
    """
    data = _read(path)
    if not isinstance(data, History):
        raise ValueError(f"asyncmr: {os.fspath(path)} holds {len(data)} histories (written by "
                         f"save_many); read it with load_many")
    return data


def gather(histories: Mapping[str, History]) -> dict[str, Any]:
    """The document :func:`save_many` writes: ``{"format": "asyncmr-history", "version": 1,
    "units": {...}, "histories": {worker: {"header", "events"}}}``, each header's ``worker``
    set to its key (a header in a file has no ``version``: the document's is its).

    Parameters
    ----------
    histories : Mapping[str, History]
        One history per Dask worker, by the worker's address (``client.run`` returns them so).

    Raises
    ------
    TypeError, ValueError
        A key is not a str or a value not a History; a header names another worker than its key.
    """
    if not isinstance(histories, Mapping):
        raise _type_error("histories", "a dict of worker name to History", histories)
    out: dict[str, Any] = {}
    for name, history in histories.items():
        _str("a worker name", name)
        if not isinstance(history, History):
            raise _type_error(f"histories[{name!r}]", "a History", history)
        raw = history._raw()
        worker = raw["header"]["worker"]
        if worker is not None and worker != name:
            raise ValueError(f"asyncmr: histories[{name!r}] holds the history of worker {worker!r}")
        raw["header"]["worker"] = name
        out[name] = raw
    return many_document(out)


def save_many(path: str | os.PathLike[str], histories: Mapping[str, History]) -> None:
    """Writes :func:`gather` of ``histories`` to ``path`` as JSON, gzip-compressed when the name
    ends in ``.gz``; raises as :meth:`History.save` does, writing nothing.

    PyTorch's viewer opens one history's snapshot (one trace per device, not per worker):
    ``load_many(path)[worker].export_torch_snapshot(p)`` writes one worker's.
    """
    write_document(path, gather(histories))


def load_many(path: str | os.PathLike[str]) -> dict[str, History]:
    """Reads the histories written by :func:`save_many`, by worker name.

    Raises
    ------
    ValueError
        As :func:`load` does, and for a file of one history (from :meth:`History.save`: read it
        with :func:`load`). OSError, MemoryError: as :func:`load`.
    """
    data = _read(path)
    if isinstance(data, History):
        raise ValueError(f"asyncmr: {os.fspath(path)} holds one history (written by "
                         f"History.save); read it with load")
    return data


# ---- the timeline --------------------------------------------------------------------------------

def plot(history_or_many: History | Mapping[str, History], out_path: str | os.PathLike[str],
         title: str | None = None) -> Path:
    """Draws reserved, used and cached bytes over time, with the phases as shaded spans, to a PNG.

    One lane per history (per worker when given many), each in seconds from its own first
    event (steady clocks of different hosts share no origin). Needs matplotlib (imported here;
    drawn on an Agg canvas of its own, pyplot's state untouched).

    Parameters
    ----------
    history_or_many : History or Mapping[str, History]
        One history, or many by worker name (as :func:`load_many` returns them).
    out_path : str or os.PathLike
        The PNG to write.
    title : str, optional
        The figure's title; by default it says what was recorded.

    Returns
    -------
    pathlib.Path
        ``out_path``.

    Raises
    ------
    ImportError
        matplotlib is not installed.
    TypeError, ValueError
        A title or worker name not a str; no histories, or more than 64 lanes (plot fewer).
    """
    from asyncmr._plot import draw

    return draw(history_or_many, Path(out_path), title)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m asyncmr plot HISTORY [-o timeline.png] [--title T]`` (``argv``: what follows it).
    Returns 0; 2: a file unreadable, no history or too big for memory; 4: no matplotlib; 1: no
    PNG written."""
    from asyncmr._cli import plot_parser

    args = plot_parser().parse_args(argv)
    if not args.output:
        print("asyncmr plot: -o needs a file name", file=sys.stderr)
        return 2
    try:
        data = _read(args.history)
    except OSError as e:
        print(f"asyncmr plot: cannot read {args.history}: {e.strerror or e}", file=sys.stderr)
        return 2
    except (ValueError, MemoryError) as e:  # MemoryError: it names the file, size and step
        print(f"asyncmr plot: {str(e).removeprefix('asyncmr: ')}", file=sys.stderr)
        return 2
    if os.path.exists(args.output) and os.path.samefile(args.history, args.output):
        print(f"asyncmr plot: the output {args.output} is the same file as the history it "
              "draws (give another -o)", file=sys.stderr)
        return 2
    try:
        out = plot(data, args.output, title=args.title)
    except ImportError as e:  # no matplotlib
        print(f"asyncmr plot: {str(e).removeprefix('asyncmr: ')}", file=sys.stderr)
        return 4
    except ValueError as e:  # a file of no histories
        print(f"asyncmr plot: {str(e).removeprefix('asyncmr: ')}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"asyncmr plot: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
        return 1
    lanes = 1 if isinstance(data, History) else len(data)
    print(f"asyncmr plot: wrote {out} ({lanes} lane{'s' if lanes != 1 else ''})")
    return 0
