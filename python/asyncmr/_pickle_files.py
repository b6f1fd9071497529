# SPDX-License-Identifier: Apache-2.0
"""The pickle files asyncmr.history writes and reads: written with the protocol PyTorch's memory
viewer reads, read back as plain values only, after a check that they do not nest deeper than
a history does (CPython's C unpickler hashes a dict key, and Python prints and compares values,
recursively: a tuple nested a million deep killed the interpreter) and that every value the
unpickler hashes is one whose hash costs its bytes (a tuple of shared tuples, 61 levels deep,
hashes in 2**60 steps; ints chosen to share a hash make a dict quadratic), and that no memo
index it puts is past its size (the unpickler's memo is an array as long as twice the index:
5 bytes asked for 32 GiB)."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import pickletools
import stat
import tempfile
from collections.abc import Mapping
from typing import Any

from asyncmr._validate import type_name

# PyTorch's viewer (torch/utils/viz/MemoryViz.js, unpickle) reads pickle protocols 2 to 4 only;
# Python 3.14 writes 5 by default.
PICKLE_PROTOCOL = 4
# How deep a file may nest its values: a history nests six levels (the snapshot's segments,
# blocks, frames).
MAX_NESTING = 64


class _Refused(pickle.UnpicklingError):
    pass


class _PlainUnpickler(pickle.Unpickler):
    """Reads only plain values (dicts, lists, tuples, str, int, float, bool, None): a history
    holds nothing else, and a pickle that names a class could run code when loaded."""

    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"{module}.{name}")


def checked_path(path: object) -> str | os.PathLike[str]:
    """A file's path: open() would take an int as a descriptor (and close it after)."""
    if isinstance(path, (str, os.PathLike)):
        return path
    raise TypeError(f"asyncmr: a history path must be a str or an os.PathLike, got "
                    f"{type(path).__name__}")


def _opcode_table() -> bytes:
    """What each pickle opcode takes and does to the stack, from pickletools' descriptions, as
    the rows _core._pickle_nesting reads (python/asyncmr/_pickle_scan.hpp): argument kind,
    what (0 plain, 1 fills a container it leaves on the stack, 2 memo put, 3 memoize, 4 memo
    get, 5 stop, 6 pushes an atom, 7 pushes an atom that may be hashed), values popped below the
    mark (or all), pops to a mark, values pushed, pushes a mark, how a memo index is written (0
    none, 1 decimal text, 2 one byte, 3 four bytes), which values put in it the unpickler hashes
    (0 none, 1 every other one, the keys, 2 all)."""
    arg_kinds = {pickletools.UP_TO_NEWLINE: -1, pickletools.TAKEN_FROM_ARGUMENT1: -2,
                 pickletools.TAKEN_FROM_ARGUMENT4: -3, pickletools.TAKEN_FROM_ARGUMENT4U: -4,
                 pickletools.TAKEN_FROM_ARGUMENT8U: -5}
    fills = {"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD", "DUP"}
    what = {"PUT": 2, "BINPUT": 2, "LONG_BINPUT": 2, "MEMOIZE": 3, "GET": 4, "BINGET": 4,
            "LONG_BINGET": 4, "STOP": 5}
    memo_arg = {"PUT": 1, "GET": 1, "BINPUT": 2, "BINGET": 2, "LONG_BINPUT": 3, "LONG_BINGET": 3}
    # Values that hold nothing and take nothing in (a bytearray takes ints; a buffer is the
    # caller's object): the scan need not follow them through the memo.
    atoms = {"int", "int_or_bool", "bool", "float", "str", "bytes", "bytes_or_str", "None"}
    # Atoms whose hash costs their bytes and which a file cannot make share a hash: str and bytes
    # hash with a key of the process's own; None, bools and 4-byte ints hash to themselves. A
    # longer int or a float hashes modulo 2**61 - 1: a file can write thousands of one hash.
    hashable = {"str", "bytes", "bytes_or_str", "None", "bool", "BININT", "BININT1", "BININT2"}
    hashes = {"SETITEM": 1, "SETITEMS": 1, "DICT": 1, "ADDITEMS": 2, "FROZENSET": 2}
    rows = bytearray([(-100) & 0xFF, 0, 0, 0, 0, 0, 0, 0] * 256)
    for op in pickletools.opcodes:
        if op.arg is None:
            arg = 0
        elif op.arg.name == "stringnl_noescape_pair":
            arg = -6
        else:
            arg = op.arg.n if op.arg.n >= 0 else arg_kinds[op.arg.n]
        before, after = op.stack_before, op.stack_after
        to_mark = pickletools.stackslice in before
        fixed = before.index(pickletools.markobject) if to_mark else len(before)
        if op.name in what:
            kind = what[op.name]
        elif op.name in fills:
            kind = 1
        elif len(after) == 1 and after[0].name in atoms:
            kind = 7 if hashable & {op.name, after[0].name} else 6
        else:
            kind = 0
        code = ord(op.code)
        rows[8 * code:8 * code + 8] = bytes([
            arg & 0xFF, kind, fixed, int(to_mark), len(after),
            int(pickletools.markobject in after), memo_arg.get(op.name, 0),
            hashes.get(op.name, 0)])
    return bytes(rows)


_OPCODES = _opcode_table()


def _scan(data: bytes) -> tuple[int, int, int]:
    """nesting(data); the offset of the first opcode that hashes a value other than a str,
    bytes, a bool, None or an int of at most 4 bytes (a dict key, a set item), or -1; and the
    offset of the first memo put of an index not below len(data), or -1."""
    from asyncmr._core import _pickle_nesting

    deepest, hashed_at, memo_at = _pickle_nesting(data, _OPCODES, MAX_NESTING)
    if deepest < 0:
        raise ValueError("not a pickle")
    return int(deepest), int(hashed_at), int(memo_at)


def _memo_index(data: bytes, at: int) -> int:
    """The index the memo put (PUT, BINPUT or LONG_BINPUT) at offset `at` names."""
    if data[at:at + 1] == pickle.BINPUT:
        return data[at + 1]
    if data[at:at + 1] == pickle.LONG_BINPUT:
        return int.from_bytes(data[at + 1:at + 5], "little")
    digits = data[at + 1:data.index(b"\n", at)]  # PUT: ASCII digits (the scan checked them)
    return int(digits) if len(digits) <= 30 else 10**30


def nesting(data: bytes) -> int:
    """How deep the pickle `data` nests its values (an atom or an empty container 0, a
    container one more than the deepest value in it), read off its opcodes without building any,
    at C speed, stopping once past MAX_NESTING. Raises ValueError for bytes that are not a
    pickle. Exact, also for a container filled after the memo or a DUP handed it to another (a
    crafted file's way to nest deeper than its opcodes look); a value that holds itself nests
    without end (past MAX_NESTING)."""
    return _scan(data)[0]


def _unreadable(raw: bytes) -> str:
    """Why the scan could not read `raw`, as pickletools' reading of its opcodes says."""
    try:
        for _ in pickletools.genops(raw):
            pass
    except Exception as e:  # noqa: BLE001 - its words are the reason
        return " ".join(str(e).split())
    return "an opcode argument asyncmr does not read, or no STOP"


# What a history file holds, for read_plain_pickle's refusals (history.load).
HISTORY_WHY = "a history holds only plain values, nesting six levels, keyed by str"


def check_history_cost(where: str, raw: object, budget: int) -> int:
    """Counts what History walks in `raw` (header items, phases, events, each event's keys and
    frames; a value the file names twice, twice) against `budget`, the file's bytes: returns
    what is left, or raises ValueError past it. A history asyncmr writes names each container
    once and holds fewer values than bytes; one frame list named by 20,000 events of a 100 kB
    file would expand to gigabytes."""
    def size(v: object) -> int:
        return len(v) if isinstance(v, (Mapping, list, tuple)) else 0

    r: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    header: Mapping[str, Any] = r["header"] if isinstance(r.get("header"), Mapping) else {}
    phases, events = (v if isinstance(v, (list, tuple)) else ()
                      for v in (header.get("phases"), r.get("events")))
    budget -= size(header) + len(phases) + sum(map(size, phases)) + len(events)
    for e in events:
        if budget < 0:
            break
        budget -= size(e) + (size(e.get("frames")) if isinstance(e, Mapping) else 0)
    if budget < 0:
        raise ValueError(f"asyncmr: {where} shares values, expanding past the file's size")
    return budget


class _PlainPickler(pickle.Pickler):
    """Writes only plain values, what _PlainUnpickler reads back: pickle writes any other value
    by its class (an IntEnum member, a NumPy str or float too, which pass for an int, a str or a
    float), into a file load refuses."""

    def reducer_override(self, obj: Any) -> Any:
        # Called for every value but None, bools and exact ints, floats, str, bytes, dicts,
        # lists, tuples, sets and frozensets (pickle's own fast path).
        raise TypeError(f"asyncmr: a history file holds only plain values (dict, list, tuple, "
                        f"str, bytes, int, float, bool, None), got a {type_name(obj)}")


def write_pickle(path: object, data: dict[str, Any]) -> None:
    """Pickles `data` whole before the file is opened: a value that cannot be written raises
    TypeError with the file untouched (writing as it pickled cut a file it replaced short); the
    file is then written as `_replace_file` says."""
    path = checked_path(path)
    buffer = io.BytesIO()
    _PlainPickler(buffer, protocol=PICKLE_PROTOCOL).dump(data)
    _replace_file(path, buffer.getbuffer())


def _replace_file(path: str | os.PathLike[str], data: memoryview) -> None:
    """Writes `data` as the file `path` names. An existing regular file (through symlinks) is
    replaced by a new one written beside it and renamed over it, its mode kept: a write that
    fails (a full disk, a quota) leaves the old file whole. A new file, anything else (a device,
    a FIFO), or a directory that takes no new file is written in place."""
    target = os.path.realpath(path)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISREG(mode):
        try:
            fd, temporary = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".asyncmr-")
        except OSError:
            fd = None
        if fd is not None:
            try:
                with open(fd, "wb") as f:
                    f.write(data)
                os.chmod(temporary, stat.S_IMODE(mode))
                os.replace(temporary, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
            return
    with open(path, "wb") as f:
        f.write(data)


def read_plain_pickle(path: object, what: str, why: str) -> tuple[Any, int]:
    """The plain values pickled in the file at `path`, and the file's size; ValueError naming
    the file when it is not `what` (a class named, nesting past MAX_NESTING, a dict key or set
    item whose hash could cost more than its bytes, not a pickle, not a regular file: `why` says
    what it should hold). OSError when it cannot be read; MemoryError naming the file, its size
    and the step when the memory left cannot hold it read or unpickled."""
    path = checked_path(path)
    name = os.fspath(path)
    # Non-blocking, so that a FIFO does not wait for a writer; read only a regular file (a FIFO
    # or /dev/zero would never end).
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(21, os.strerror(21), name)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"asyncmr: {name} is not {what}: it is not a regular file")
        with open(fd, "rb", closefd=False) as f:
            try:
                raw = f.read()
            except MemoryError:
                raise out_of_memory("reading", name, st.st_size, what) from None
    finally:
        os.close(fd)
    try:
        return _unpickle_plain(raw, name, what, why), len(raw)
    except MemoryError:  # the scan's or the unpickler's
        raise out_of_memory("unpickling", name, len(raw), what) from None


def out_of_memory(step: str, name: str | os.PathLike[str], size: int, what: str) -> MemoryError:
    """Python's MemoryError says nothing, the scan's only std::bad_alloc: this one names the
    file, its size and the step. The file is not called malformed: it may well be `what`."""
    return MemoryError(f"asyncmr: out of memory {step} {os.fspath(name)} ({size} bytes) as {what}")


def _unpickle_plain(raw: bytes, name: str, what: str, why: str) -> Any:
    """The plain values the pickle `raw` (the file `name`) holds, once the scan let it through;
    ValueError as read_plain_pickle says. A MemoryError goes on as it is."""
    try:
        deepest, hashed_at, memo_at = _scan(raw)
    except ValueError:
        # Never unpickled unscanned (a file the scan cannot read went to the unpickler, which
        # read it, and crashed): pickletools says what is wrong, building nothing.
        raise ValueError(f"asyncmr: {name} is not {what}: it does not unpickle "
                         f"({_unreadable(raw)})") from None
    if deepest > MAX_NESTING:
        raise ValueError(f"asyncmr: {name} is not {what}: it nests values deeper than "
                         f"{MAX_NESTING} levels ({why})")
    if memo_at >= 0:
        # CPython's unpickler grows its memo, an array, to twice the index put.
        index = _memo_index(raw, memo_at)
        shown = f"{index}" if index < 10**30 else "of more than 30 digits"
        raise ValueError(f"asyncmr: {name} is not {what}: it names memo index {shown} at byte "
                         f"{memo_at}, past the file's size ({len(raw)} bytes; a pickler numbers "
                         f"its memo from 0, and the unpickler would allocate memory for every "
                         f"index up to it; {why})")
    if hashed_at >= 0:
        # The unpickler hashes a key as it reads it, in C, before any check here could run.
        raise ValueError(f"asyncmr: {name} is not {what}: it has a dict key or set item that is "
                         f"not a str, bytes, bool, None or int of at most 4 bytes (at byte "
                         f"{hashed_at}: hashed as it is read, at a cost that can be far past the "
                         f"file's size; {why})")
    try:
        return _PlainUnpickler(io.BytesIO(raw)).load()
    except _Refused as e:
        raise ValueError(f"asyncmr: {name} is not {what}: it holds a {e} object (refused, not "
                         f"loaded: {why})") from None
    except MemoryError:
        raise  # the file is too large for this process, not malformed: the caller says so
    except Exception as e:  # noqa: BLE001 - any other failure to unpickle means "not a history"
        raise ValueError(f"asyncmr: {name} is not {what}: it does not unpickle "
                         f"({' '.join(str(e).split())})") from None
