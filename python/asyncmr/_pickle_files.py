# SPDX-License-Identifier: Apache-2.0
"""The pickle files asyncmr.history writes and reads: written with the protocol PyTorch's memory
viewer reads, read back as plain values only, after a check that they do not nest deeper than
a history does (CPython's C unpickler hashes a dict key, and Python prints and compares values,
recursively: a tuple nested a million deep killed the interpreter)."""

from __future__ import annotations

import io
import os
import pickle
import pickletools
from typing import Any

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
    get, 5 stop), values popped below the mark (or all), pops to a mark, values pushed, pushes a
    mark, how a memo index is written (0 none, 1 decimal text, 2 one byte, 3 four bytes)."""
    arg_kinds = {pickletools.UP_TO_NEWLINE: -1, pickletools.TAKEN_FROM_ARGUMENT1: -2,
                 pickletools.TAKEN_FROM_ARGUMENT4: -3, pickletools.TAKEN_FROM_ARGUMENT4U: -4,
                 pickletools.TAKEN_FROM_ARGUMENT8U: -5}
    fills = {"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD", "DUP"}
    what = {"PUT": 2, "BINPUT": 2, "LONG_BINPUT": 2, "MEMOIZE": 3, "GET": 4, "BINGET": 4,
            "LONG_BINGET": 4, "STOP": 5}
    memo_arg = {"PUT": 1, "GET": 1, "BINPUT": 2, "BINGET": 2, "LONG_BINPUT": 3, "LONG_BINGET": 3}
    rows = bytearray([(-100) & 0xFF, 0, 0, 0, 0, 0, 0] * 256)
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
        code = ord(op.code)
        rows[7 * code:7 * code + 7] = bytes([
            arg & 0xFF, what.get(op.name, 1 if op.name in fills else 0), fixed, int(to_mark),
            len(after), int(pickletools.markobject in after), memo_arg.get(op.name, 0)])
    return bytes(rows)


_OPCODES = _opcode_table()


def nesting(data: bytes) -> int:
    """How deep the pickle `data` nests its values (an atom or an empty container 0, a
    container one more than the deepest value in it), read off its opcodes without building any,
    at C speed, stopping once past MAX_NESTING. Raises ValueError for bytes that are not a
    pickle. Exact for values complete when they are memoized (tuples and frozensets always are:
    what CPython hashes recursively, unguarded); a list or dict filled after it was memoized can
    be deeper than counted, which Python meets with a RecursionError, not a crash."""
    from asyncmr._core import _pickle_nesting

    deepest = _pickle_nesting(data, _OPCODES, MAX_NESTING)
    if deepest < 0:
        raise ValueError("not a pickle")
    return int(deepest)


def _unreadable(raw: bytes) -> str:
    """Why the scan could not read `raw`, as pickletools' reading of its opcodes says."""
    try:
        for _ in pickletools.genops(raw):
            pass
    except Exception as e:  # noqa: BLE001 - its words are the reason
        return " ".join(str(e).split())
    return "an opcode argument asyncmr does not read, or no STOP"


def write_pickle(path: object, data: dict[str, Any]) -> None:
    with open(checked_path(path), "wb") as f:
        pickle.dump(data, f, protocol=PICKLE_PROTOCOL)


def read_plain_pickle(path: object, what: str, why: str) -> Any:
    """The plain values pickled in the file at `path`; ValueError naming the file when it is
    not `what` (a class named, nesting past MAX_NESTING, not a pickle: `why` says what it
    should hold). OSError when it cannot be read."""
    path = checked_path(path)
    with open(path, "rb") as f:
        raw = f.read()
    name = os.fspath(path)
    try:
        deep = nesting(raw) > MAX_NESTING
    except ValueError:
        # Never unpickled unscanned (a file the scan cannot read went to the unpickler, which
        # read it, and crashed): pickletools says what is wrong, building nothing.
        raise ValueError(f"asyncmr: {name} is not {what}: it does not unpickle "
                         f"({_unreadable(raw)})") from None
    if deep:
        raise ValueError(f"asyncmr: {name} is not {what}: it nests values deeper than "
                         f"{MAX_NESTING} levels ({why})")
    try:
        return _PlainUnpickler(io.BytesIO(raw)).load()
    except _Refused as e:
        raise ValueError(f"asyncmr: {name} is not {what}: it holds a {e} object (refused, not "
                         f"loaded: {why})") from None
    except Exception as e:  # noqa: BLE001 - any failure to unpickle means "not a history"
        raise ValueError(f"asyncmr: {name} is not {what}: it does not unpickle "
                         f"({' '.join(str(e).split())})") from None
