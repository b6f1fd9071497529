# SPDX-License-Identifier: Apache-2.0
"""Pool attributes as one object per pool, with one property per row of the C++ attribute
table (``include/asyncmr/pool_attributes.hpp``). The properties are made here, when this module
is imported, from the table the extension reports; ``_attributes.pyi`` is generated from the
same table (``ci/generate_stubs.py``) so editors see them, and a test fails if the two drift."""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import NamedTuple

from asyncmr import _core, _validate
from asyncmr._exceptions import UnsupportedError


class AttributeInfo(NamedTuple):
    """One row of the attribute table (``include/asyncmr/pool_attributes.hpp``)."""

    index: int
    name: str
    cuda_value: int  #: the ``cudaMemPoolAttr`` value
    kind: str  #: "boolean", "integer" or "bytes" (an :class:`AttributeKind` name)
    access: str  #: "read_only", "read_write" or "reset_only" (an :class:`AttributeAccess` name)
    min_driver: int  #: first driver version that knows it (13020 = 13.2)


#: The table, in the C++ enum's order.
TABLE: tuple[AttributeInfo, ...] = tuple(
    AttributeInfo(i, name, cuda_value, kind.name, access.name, min_driver)
    for i, (name, cuda_value, kind, access, min_driver) in enumerate(_core.attribute_table())
)


def _decode(pool, row: AttributeInfo, raw: int):
    if row.kind == "boolean":
        return bool(raw)
    if row.kind == "integer" and raw >= 2**31:
        raw -= 2**32  # a C int
    if row.name == "allocation_type":
        # Pinned to the driver is device memory on a device and host memory elsewhere: the
        # pool's own answer, so both spellings agree.
        return pool.allocation_type
    if row.name == "location_type":
        return _core._location_kind_from_cuda(raw).name
    return raw


def _encode(row: AttributeInfo, value) -> int:
    if row.kind == "boolean":
        # A bool, or an integer 0 or 1 (the driver's own encoding); never a float or a str,
        # which compare equal to 0 or 1 without meaning it.
        if isinstance(value, bool):
            return int(value)
        number = _validate.integer(value)
        if number not in (0, 1):
            got = number if number is not None else _validate.type_name(value)
            raise TypeError(f"{row.name} must be a bool, got {got}")
        return number
    return _validate.size(row.name, value, optional=False)


class PoolAttributes:
    """The attributes of one memory pool, one property each.

    Read-write: ``release_threshold`` (bytes), ``reuse_follow_event_dependencies``,
    ``reuse_allow_opportunistic``, ``reuse_allow_internal_dependencies`` (bool).
    Read-only: ``reserved_mem_current``, ``used_mem_current`` (bytes).
    Watermarks: ``reserved_mem_high``, ``used_mem_high`` (bytes); setting the int 0 resets them,
    another int raises ValueError, a value of another type (``0.0``, ``False``, ``"0"``, None)
    TypeError. CUDA 13.2 attributes (read-only): ``allocation_type``,
    ``location_type``, ``location_id``, ``max_pool_size``, ``export_handle_types``,
    ``hw_decompress_enabled``; on older drivers they are answered from what asyncmr knows about
    the pool and raise :class:`asyncmr.UnsupportedError` otherwise.

    Every read and write runs in relaxed stream-capture mode: safe while another stream is
    being captured. Writing a shared (default or current) pool's attributes affects every user
    of that pool in the process. The object keeps its pool alive; the pool does not keep it.
    """

    __slots__ = ("_pool",)

    def __init__(self, pool):
        self._pool = pool

    def as_dict(self) -> dict:
        """Every attribute this driver can answer for this pool, by name."""
        out = {}
        for row in TABLE:
            try:
                out[row.name] = getattr(self, row.name)
            except UnsupportedError:
                pass
        return out

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"PoolAttributes({items})"

    @contextlib.contextmanager
    def scoped(self, **values):
        """Set attributes for the duration of a ``with`` block, then restore them.

        ``with pool.attributes.scoped(release_threshold=0): ...``
        """
        rows = {row.name: row for row in TABLE}
        for name, value in values.items():
            row = rows.get(name)
            if row is None:
                raise AttributeError(f"unknown pool attribute {name!r}")
            if row.access != "read_write":
                raise AttributeError(f"pool attribute {name!r} cannot be scoped: it is {row.access}")
            _encode(row, value)
        saved = {name: getattr(self, name) for name in values}
        try:
            for name, value in values.items():
                setattr(self, name, value)
            yield self
        finally:
            for name, value in saved.items():
                setattr(self, name, value)


def _make_property(row: AttributeInfo) -> property:
    def fget(self):
        return _decode(self._pool, row, self._pool._get_attribute(row.index))

    if row.access == "read_only":

        def fset(self, value):
            raise AttributeError(f"pool attribute {row.name!r} is read-only")

    elif row.access == "reset_only":

        def fset(self, value):
            # The int 0: False, 0.0 or "0" is the wrong type; another int the wrong value.
            number = _validate.as_integer(value, f"pool attribute {row.name!r}",
                                          "the int 0 (a high-water mark can only be reset)")
            if number != 0:
                raise ValueError(
                    f"pool attribute {row.name!r} is a high-water mark: it can only be reset, "
                    f"by setting 0 (got {value!r})"
                )
            _reset_peaks(self._pool, (row,))  # open peak trackers keep what they saw

    else:

        def fset(self, value):
            raw = _encode(row, value)  # checked before the pool is asked anything
            self._pool._set_attribute(row.index, raw)

    return property(fget, fset, doc=property_doc(row))


def property_doc(row: AttributeInfo) -> str:
    """The docstring of ``row``'s property (also written into the stub)."""
    unit = " (bytes)" if row.kind == "bytes" else ""
    doc = f"``{row.name}``{unit}: {row.access.replace('_', '-')}"
    if row.min_driver > 13000:
        doc += f"; driver >= {row.min_driver // 1000}.{row.min_driver % 1000 // 10}"
    return doc


def property_type(row: AttributeInfo) -> str:
    """The Python type ``row``'s property reads as (also written into the stub)."""
    if row.kind == "boolean":
        return "bool"
    if row.name in ("allocation_type", "location_type"):
        return "str | None" if row.name == "allocation_type" else "str"
    return "int"


for _row in TABLE:
    setattr(PoolAttributes, _row.name, _make_property(_row))
del _row


# ---- peaks ---------------------------------------------------------------------------------

# The watermarks, from the table: the rows that can only be reset.
_MARKS: tuple[AttributeInfo, ...] = tuple(row for row in TABLE if row.access == "reset_only")

# The peak trackers open in this process, by pool handle: every MemPool object of one driver pool
# finds the same ones. Weak, so a tracker entered and never left keeps neither itself nor its
# pool alive. Under the lock, a reset with its folds, a tracker's entry (its reset and its
# registration) and its exit (its last read and its leaving) are each one step, which no other
# reset made through asyncmr falls inside.
_OPEN_LOCK = threading.Lock()
_OPEN: dict[int, weakref.WeakSet[PeakTracker]] = {}


def _reset_marks_locked(pool, key: int, marks: tuple[AttributeInfo, ...]) -> None:
    """Resets ``marks`` of ``pool`` (handle ``key``), each first read into every tracker open on
    the pool, so an open tracker keeps the peak it saw. The caller holds ``_OPEN_LOCK``."""
    trackers = list(_OPEN.get(key, ()))
    if not trackers:
        _OPEN.pop(key, None)  # an empty set: its trackers were collected without leaving
    for row in marks:
        # Read and reset one mark after the other: a peak made and undone by another thread
        # between the two calls is what no tracker sees.
        if trackers:
            high = pool._get_attribute(row.index)
            for tracker in trackers:
                tracker._fold(row.name, high)
        pool._set_attribute(row.index, 0)


def _reset_peaks(pool, marks: tuple[AttributeInfo, ...] = _MARKS) -> None:
    """Resets the watermarks ``marks`` of ``pool`` (a MemPool); every peak tracker open on the
    same driver pool keeps what it measured up to the reset. ``MemPool.reset_peaks``,
    ``mr.reset_peaks`` and setting a watermark to 0 all come here."""
    key = pool.handle  # raises PoolClosedError for a closed pool
    with _OPEN_LOCK:
        _reset_marks_locked(pool, key, marks)


class PeakTracker:
    """Measures one phase's high-water marks: ``with mr.track_peak() as peak: ...``; afterwards
    ``peak.used`` and ``peak.reserved`` are the phase's peaks in bytes.

    ``name`` names the phase. A named tracker made while the resource records
    (``mr.record_history()``) is also a phase of that recording: shaded in ``python -m asyncmr
    plot``, with its peaks (``used_high`` / ``reserved_high``) in the history's header.

    Trackers may be nested and may run at once on several threads, on one pool or through
    several MemPool objects of it: entering resets the pool's watermarks, but every reset made
    through asyncmr (a tracker's entry, ``reset_peaks()``, a watermark set to 0) first hands the
    marks to the trackers open on that pool, so each reports the peak of its own phase and an
    outer phase's peak is at least an inner one's. Missed: a peak that another thread makes and
    undoes between a mark's read and its reset (the next call to the driver), and resets made
    outside asyncmr. A shared pool's peak counts every user of that pool in the process, not just
    this code.
    """

    __slots__ = ("_pool", "_recorder", "_phase", "_key", "_highs", "name", "used", "reserved",
                 "__weakref__")

    def __init__(self, pool, name: str | None = None, recorder=None):
        self.name = check_phase_name(name, allow_none=True)
        self._pool = pool
        self._recorder = recorder if name is not None else None
        self._phase = None
        self._key: int | None = None  # the pool's handle, from its entry on
        self._highs: dict[str, int] = {}  # the highest marks seen, by mark's name
        self.used: int | None = None
        self.reserved: int | None = None

    def _fold(self, mark: str, high: int) -> None:
        # Called with _OPEN_LOCK held.
        self._highs[mark] = max(self._highs.get(mark, 0), high)

    def __enter__(self) -> PeakTracker:
        pool = self._pool
        if pool is None or self._key is not None:
            raise RuntimeError("asyncmr: a peak tracker is used once; make another with "
                               "mr.track_peak() for the next phase")
        key = pool.handle
        with _OPEN_LOCK:
            _reset_marks_locked(pool, key, _MARKS)
            # Registered after its own reset, in the same step: it sees every later reset.
            _OPEN.setdefault(key, weakref.WeakSet()).add(self)
            self._key = key
        try:
            if self._recorder is not None and self._recorder.recording:
                self._phase = self._recorder._open_phase(self.name)
        except BaseException:
            self._leave()
            self._pool = self._recorder = None
            raise
        return self

    def __exit__(self, *exc) -> bool:
        try:
            with _OPEN_LOCK:
                try:
                    for row in _MARKS:
                        self._fold(row.name, self._pool._get_attribute(row.index))
                    self.used = self._highs["used_mem_high"]
                    self.reserved = self._highs["reserved_mem_high"]
                finally:
                    # Left even when the marks cannot be read: no later reset folds into it.
                    self._leave_locked()
        finally:
            # The phase ends even when the peaks cannot be read (then without them).
            if self._phase is not None:
                self._recorder._close_phase(self._phase, used_high=self.used,
                                            reserved_high=self.reserved)
            # The tracker no longer keeps the pool or the recording alive.
            self._pool = self._recorder = self._phase = None
        return False

    def _leave(self) -> None:
        with _OPEN_LOCK:
            self._leave_locked()

    def _leave_locked(self) -> None:
        key = self._key
        trackers = _OPEN.get(key) if key is not None else None
        if key is None or trackers is None:
            return  # not registered: never entered, or left already
        trackers.discard(self)
        if not trackers:
            del _OPEN[key]

    def __repr__(self) -> str:
        named = f"name={self.name!r}, " if self.name is not None else ""
        return f"PeakTracker({named}used={self.used}, reserved={self.reserved})"


def check_phase_name(name: object, *, allow_none: bool = False) -> str | None:
    """A phase's name: a non-empty str (or None where ``allow_none``)."""
    if name is None and allow_none:
        return None
    if not isinstance(name, str):
        raise TypeError(f"asyncmr: a phase's name must be a str, got {_validate.type_name(name)}")
    if not name:
        raise ValueError("asyncmr: a phase needs a non-empty name, got ''")
    return name
