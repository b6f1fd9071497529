# SPDX-License-Identifier: Apache-2.0
"""Pool attributes as one object per pool, with one property per row of the C++ attribute
table (``include/asyncmr/pool_attributes.hpp``). The properties are made here, when this module
is imported, from the table the extension reports; ``_attributes.pyi`` is generated from the
same table (``ci/generate_stubs.py``) so editors see them, and a test fails if the two drift."""

from __future__ import annotations

import contextlib
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
        if not isinstance(value, bool) and value not in (0, 1):
            raise TypeError(f"{row.name} must be a bool, got {value!r}")
        return int(value)
    return _validate.size(row.name, value, optional=False)


class PoolAttributes:
    """The attributes of one memory pool, one property each.

    Read-write: ``release_threshold`` (bytes), ``reuse_follow_event_dependencies``,
    ``reuse_allow_opportunistic``, ``reuse_allow_internal_dependencies`` (bool).
    Read-only: ``reserved_mem_current``, ``used_mem_current`` (bytes).
    Watermarks: ``reserved_mem_high``, ``used_mem_high`` (bytes); setting 0 resets them, any
    other value raises ValueError. CUDA 13.2 attributes (read-only): ``allocation_type``,
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
            if isinstance(value, bool) or value != 0:
                raise ValueError(
                    f"pool attribute {row.name!r} is a high-water mark: it can only be reset, "
                    f"by setting 0 (got {value!r})"
                )
            self._pool._set_attribute(row.index, 0)

    else:

        def fset(self, value):
            self._pool._set_attribute(row.index, _encode(row, value))

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


class PeakTracker:
    """Measures one phase's high-water marks: ``with mr.track_peak() as peak: ...``; afterwards
    ``peak.used`` and ``peak.reserved`` are the phase's peaks in bytes.

    ``name`` names the phase. A named tracker made while the resource records
    (``mr.record_history()``) is also a phase of that recording: shaded in ``python -m asyncmr
    plot``, with its peaks (``used_high`` / ``reserved_high``) in the history's header.

    A shared pool's peak counts every user of that pool in the process, not just this code.
    """

    __slots__ = ("_pool", "_recorder", "_phase", "name", "used", "reserved")

    def __init__(self, pool, name: str | None = None, recorder=None):
        self.name = check_phase_name(name, allow_none=True)
        self._pool = pool
        self._recorder = recorder if name is not None else None
        self._phase = None
        self.used: int | None = None
        self.reserved: int | None = None

    def __enter__(self) -> PeakTracker:
        if self._pool is None:
            raise RuntimeError("asyncmr: a peak tracker is used once; make another with "
                               "mr.track_peak() for the next phase")
        self._pool.reset_peaks()
        if self._recorder is not None and self._recorder.recording:
            self._phase = self._recorder._open_phase(self.name)
        return self

    def __exit__(self, *exc) -> bool:
        try:
            attrs = self._pool.attributes
            self.used = attrs.used_mem_high
            self.reserved = attrs.reserved_mem_high
        finally:
            # The phase ends even when the peaks cannot be read (then without them).
            if self._phase is not None:
                self._recorder._close_phase(self._phase, used_high=self.used,
                                            reserved_high=self.reserved)
            # The tracker no longer keeps the pool or the recording alive.
            self._pool = self._recorder = self._phase = None
        return False

    def __repr__(self) -> str:
        named = f"name={self.name!r}, " if self.name is not None else ""
        return f"PeakTracker({named}used={self.used}, reserved={self.reserved})"


def check_phase_name(name: object, *, allow_none: bool = False) -> str | None:
    """A phase's name: a non-empty str (or None where ``allow_none``)."""
    if name is None and allow_none:
        return None
    if not isinstance(name, str) or not name:
        raise ValueError(f"asyncmr: a phase needs a non-empty name (a str), got {name!r}")
    return name
