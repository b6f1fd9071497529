# SPDX-License-Identifier: Apache-2.0
"""asyncmr's history files, and PyTorch's snapshot pickle.

A history file is a JSON document (gzip-compressed when its name ends in ``.gz``), written and
read with the standard library's ``json`` and ``gzip`` alone: reading one runs nothing the file
names, whoever wrote it. PyTorch's memory viewer reads only pickles, so its snapshot is written
with ``pickle`` for it; asyncmr never reads a pickle. The layout is in docs/HISTORY.md ("The
file").
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import pickle
import stat
import tempfile
import zlib
from collections.abc import Mapping
from typing import Any

#: What a history file says it is: its ``"format"``.
FORMAT = "asyncmr-history"
#: The file layout's version, which is also its histories' ``header["version"]``.
VERSION = 1
UNITS = {"time": "ns", "size": "bytes"}
# PyTorch's viewer (torch/utils/viz/MemoryViz.js, unpickle) reads pickle protocols 2 to 4 only;
# Python 3.14 writes 5 by default.
PICKLE_PROTOCOL = 4
_GZIP_MAGIC = b"\x1f\x8b"
_PICKLE_NAMES = (".pickle", ".pkl")
_WHAT = "a history file"
_ENCODE = json.JSONEncoder(allow_nan=False).encode  # standard JSON: no NaN or Infinity


def checked_path(path: object) -> str | os.PathLike[str]:
    """A file's path: open() would take an int as a descriptor (and close it after)."""
    if isinstance(path, (str, os.PathLike)):
        return path
    raise TypeError(f"asyncmr: a history path must be a str or an os.PathLike, got "
                    f"{type(path).__name__}")


def _stripped(raw: Mapping[str, Any]) -> dict[str, Any]:
    # A header in a file has no "version": the document's is the headers' too.
    header = {k: v for k, v in raw["header"].items() if k != "version"}
    return {"header": header, "events": raw["events"]}


def document(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The file's document for one history's ``{"header", "events"}``."""
    return {"format": FORMAT, "version": VERSION, "units": dict(UNITS), **_stripped(raw)}


def many_document(raws: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The file's document for many histories' ``{"header", "events"}`` by worker name."""
    return {"format": FORMAT, "version": VERSION, "units": dict(UNITS),
            "histories": {name: _stripped(raw) for name, raw in raws.items()}}


# ---- writing -------------------------------------------------------------------------------------

def _history_text(raw: Mapping[str, Any], pad: str) -> str:
    """One history's header on one line and each event on a line of its own, so that the file
    reads (and greps, and diffs) an event a line."""
    events = ",\n".join(f"{pad}  {_ENCODE(e)}" for e in raw["events"])
    listed = f"[\n{events}\n{pad} ]" if events else "[]"
    return f'"header": {_ENCODE(raw["header"])},\n{pad} "events": {listed}'


def encode(doc: Mapping[str, Any]) -> str:
    """The JSON text of a document from :func:`document`. Raises TypeError or ValueError (the
    value JSON cannot write: a set, a function, a float NaN) before anything is written."""
    try:
        head = ", ".join(f"{_ENCODE(k)}: {_ENCODE(doc[k])}" for k in ("format", "version", "units"))
        if "histories" not in doc:
            return f"{{{head},\n {_history_text(doc, '')}}}\n"
        items = ",\n".join(f"  {_ENCODE(name)}: {{{_history_text(raw, '  ')}}}"
                           for name, raw in doc["histories"].items())
        return f'{{{head},\n "histories": {{' + (f"\n{items}\n }}}}\n" if items else "}}\n")
    except (TypeError, ValueError) as e:
        raise type(e)(f"asyncmr: a history file holds only JSON's values (objects keyed by "
                      f"str, arrays, str, int, finite float, bool, None): {e}") from None


def write_document(path: object, doc: Mapping[str, Any]) -> None:
    """Writes ``doc`` as JSON to ``path``, gzip-compressed when its name ends in ``.gz``. The
    text is made whole before the file is opened: a value that cannot be written raises with the
    file untouched; the file is then written as :func:`_replace_file` says."""
    path = checked_path(path)
    name = os.fspath(path)
    if name.lower().endswith(_PICKLE_NAMES):
        raise ValueError(f"asyncmr: {name}: a history file is JSON, not a pickle (name it "
                         f".json, or .json.gz to compress it); the pickle PyTorch's memory "
                         f"viewer opens is History.export_torch_snapshot(path)")
    data = encode(doc).encode("ascii")  # ensure_ascii: every str is escaped to ASCII
    if name.lower().endswith(".gz"):
        data = gzip.compress(data, compresslevel=6, mtime=0)  # mtime 0: the same bytes each time
    _replace_file(path, memoryview(data))


def write_torch_snapshot(path: object, snapshot: Mapping[str, Any]) -> None:
    """Pickles ``snapshot`` (plain values only, as History.snapshot makes it) for PyTorch's
    memory viewer, whole before the file is opened."""
    path = checked_path(path)
    _replace_file(path, memoryview(pickle.dumps(snapshot, protocol=PICKLE_PROTOCOL)))


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


# ---- reading -------------------------------------------------------------------------------------

def out_of_memory(step: str, name: str | os.PathLike[str], size: int) -> MemoryError:
    """Python's MemoryError says nothing: this one names the file, its size and the step. The
    file is not called malformed: it may well be a history."""
    return MemoryError(f"asyncmr: out of memory {step} {os.fspath(name)} ({size} bytes) as "
                       f"{_WHAT}")


def _not_a_history(name: str, why: str) -> ValueError:
    return ValueError(f"asyncmr: {name} is not {_WHAT}: {why}")


def _read_bytes(path: str | os.PathLike[str], name: str) -> bytes:
    # Non-blocking, so that a FIFO does not wait for a writer; read only a regular file (a FIFO
    # or /dev/zero would never end).
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(21, os.strerror(21), name)
        if not stat.S_ISREG(st.st_mode):
            raise _not_a_history(name, "it is not a regular file")
        with open(fd, "rb", closefd=False) as f:
            try:
                return f.read()
            except MemoryError:
                raise out_of_memory("reading", name, st.st_size) from None
    finally:
        os.close(fd)


def _shown(value: object) -> str:
    """A value of the document as JSON, cut short: the message names it, not all of it."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse_constant(constant: str) -> None:
    raise ValueError(f"{constant} is not a JSON number")


_JSON_TYPES = {dict: "a JSON object", list: "a JSON array", str: "a JSON string",
               int: "a JSON number", float: "a JSON number", bool: "JSON's true or false",
               type(None): "JSON's null"}


def read_document(path: object) -> dict[str, Any]:
    """The JSON document in the history file at ``path``, its ``format``, ``version`` and
    ``units`` checked (what it holds under them is the caller's to check).

    Raises ValueError naming the file and what is wrong when it is not a history file (not a
    regular file, damaged gzip data, a pickle, not JSON, JSON of another kind or version);
    OSError when it cannot be read; MemoryError naming the file, its size and the step when
    the memory left cannot hold it read, decompressed or parsed."""
    path = checked_path(path)
    name = os.fspath(path)
    raw = _read_bytes(path, name)
    size = len(raw)
    if raw.startswith(_GZIP_MAGIC):  # by content, not name: a renamed file still reads
        try:
            raw = gzip.decompress(raw)
        except MemoryError:
            raise out_of_memory("decompressing", name, size) from None
        except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
            raise _not_a_history(name, f"its gzip data is damaged ({e})") from None
    if raw.startswith(b"\x80"):  # pickle's PROTO opcode, which protocols 2 and later begin with
        raise ValueError(
            f"asyncmr: {name} is a pickle, not {_WHAT}: asyncmr's history files are JSON and "
            f"asyncmr reads no pickle (a pickle can run code as it loads); docs/HISTORY.md says "
            f"how to turn a pickled history you trust into JSON")
    try:
        doc = json.loads(raw, parse_constant=_refuse_constant)
    except MemoryError:
        raise out_of_memory("parsing", name, size) from None
    except RecursionError:  # arrays or objects nested past Python's recursion limit
        raise _not_a_history(name, "it nests JSON values deeper than Python's recursion "
                                   "limit (a history file nests seven levels)") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an int of too many digits
        raise _not_a_history(name, f"it is not JSON ({' '.join(str(e).split())})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        what = "an object" if isinstance(doc, dict) else _JSON_TYPES[type(doc)]
        raise _not_a_history(name, f"it is {what} without \"format\": \"{FORMAT}\"")
    version = doc.get("version")
    if type(version) is not int:
        raise _not_a_history(name, f"its \"version\" is {_shown(version)}, not an int")
    if version != VERSION:
        raise _not_a_history(name, f"it is version {version} of the {FORMAT} format; this "
                                   f"asyncmr reads version {VERSION}")
    if doc.get("units") != UNITS:
        raise _not_a_history(name, f"its \"units\" are {_shown(doc.get('units'))}; "
                                   f"version {VERSION} records {json.dumps(UNITS)}")
    return doc
