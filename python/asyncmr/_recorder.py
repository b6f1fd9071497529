# SPDX-License-Identifier: Apache-2.0
"""``mr.record_history()``: the context manager that runs a resource's recording (the C++ ring,
``detail/history.hpp``) and turns what it recorded into an :class:`asyncmr.history.History`."""

from __future__ import annotations

import os
import time
import traceback
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from os import PathLike
from typing import Any

from asyncmr import _validate
from asyncmr._attributes import check_phase_name

STACK_MODES = ("none", "python")
MAX_EVENTS = 1 << 26  # the C++ ring's limit (history_ring::max_capacity)
_FRAMES = 32  # the innermost frames kept per allocation
# asyncmr's own Python frames at the top of an allocation's stack (this recorder, wrappers such
# as the pinned-array door) are left out; the resources' Cython methods make no frame.
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _kind(mr: Any) -> str:
    """What the resource hands out: what it is (a subclass too), not what its class is named."""
    from asyncmr import AsyncDeviceMR, AsyncManagedMR, AsyncPinnedMR

    for cls, kind in ((AsyncPinnedMR, "pinned"), (AsyncDeviceMR, "device"),
                      (AsyncManagedMR, "managed")):
        if isinstance(mr, cls):
            return kind
    raise TypeError(f"asyncmr: record_history needs an asyncmr resource, got "
                    f"{type(mr).__name__}")


def check_arguments(max_events: object, stacks: object) -> int:
    """Refuses a bad ``max_events`` or ``stacks`` (before anything records); returns
    ``max_events`` as an int (a NumPy integer is accepted, and kept as the int it is)."""
    events = int(_validate.as_integer(max_events, "asyncmr: max_events"))
    if not 1 <= events <= MAX_EVENTS:
        raise ValueError(f"asyncmr: max_events must be between 1 and {MAX_EVENTS}, "
                         f"got {events}")
    if not isinstance(stacks, str):
        raise TypeError(f"asyncmr: stacks must be a str, got {_validate.type_name(stacks)}")
    if stacks not in STACK_MODES:
        raise ValueError(f"asyncmr: stacks must be one of {STACK_MODES}, got {stacks!r}")
    return events


class HistoryRecorder:
    """``with mr.record_history(max_events=65536, stacks="none") as h:``; see
    ``_PoolResource.record_history``. Usable once: a second ``with`` raises RuntimeError."""

    def __init__(self, mr: Any, max_events: int = 65536, stacks: str = "none") -> None:
        max_events = check_arguments(max_events, stacks)
        self._mr = mr
        self._kind = _kind(mr)
        self._max_events = max_events
        self._stacks = stacks
        # (event number, frames) of each allocation, as many as the ring holds events.
        self._frames: deque[tuple[int, list[dict[str, Any]]]] = deque(maxlen=max_events)
        self._state = "new"
        self._result: tuple[list[dict[str, Any]], int, list[int]] | None = None
        self._phases: list[dict[str, Any]] = []

    def __enter__(self) -> HistoryRecorder:
        if self._state != "new":
            raise RuntimeError("asyncmr: this recorder was used already; call "
                               "record_history() again for a new recording")
        self._mr._start_history(self._max_events, self)
        self._state = "recording"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._state == "recording":
            self._result = self._mr._read_history(True)
            self._state = "done"

    @property
    def recording(self) -> bool:
        """True inside the ``with`` block."""
        return self._state == "recording"

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """``with h.phase("load"):`` names a span of the recording (shaded in ``plot``). The
        clock is the events' (CLOCK_MONOTONIC, which std::chrono::steady_clock reads).
        ``with mr.track_peak(name="load"):`` makes the same span, with the phase's peaks."""
        entry = self._open_phase(name)
        try:
            yield
        finally:
            self._close_phase(entry)

    def _open_phase(self, name: object) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": check_phase_name(name), "start_ns": time.monotonic_ns(),
                                 "end_ns": None}
        self._phases.append(entry)
        return entry

    def _close_phase(self, entry: dict[str, Any], **extra: Any) -> None:
        entry["end_ns"] = time.monotonic_ns()
        entry.update(extra)

    # ---- called by the resource -------------------------------------------------------------

    def note_allocation(self, ptr: int, event: int | None) -> None:
        """The Python stack of an allocation, when stacks="python": ``event`` is the number of
        the event it made in this recording's ring (None: it made none here, and no stack is
        kept)."""
        if self._stacks == "python" and ptr and event is not None:
            stack = traceback.extract_stack(limit=_FRAMES + 8)
            while stack and stack[-1].filename.startswith(_PACKAGE):
                stack.pop()
            self._frames.append((event, [{"filename": f.filename, "line": f.lineno or 0,
                                          "name": f.name} for f in reversed(stack[-_FRAMES:])]))

    def describe_outstanding(self, largest: int = 5) -> str:
        """The largest allocations live now, for an out-of-memory message."""
        try:
            live = self.history().outstanding()
        except Exception as e:  # noqa: BLE001 - the message must not fail
            return f"outstanding allocations unknown ({e})"
        if not live:
            return "recorded history: no outstanding allocations"
        top = ", ".join(f"{a['bytes']} bytes at {a['address']:#x} on stream {a['stream']:#x} "
                        f"({a['age_s']:.3f} s old)" for a in live[:largest])
        return f"largest outstanding allocations of {len(live)} (recorded history): {top}"

    # ---- what was recorded ------------------------------------------------------------------

    def _events(self) -> tuple[list[dict[str, Any]], int, list[int]]:
        if self._state == "recording":
            return self._mr._read_history(False)
        if self._result is None:
            raise RuntimeError("asyncmr: nothing recorded yet: use the recorder in a `with` block")
        return self._result

    def history(self) -> Any:
        """The :class:`asyncmr.history.History` recorded so far (or in all, after the block)."""
        from asyncmr.history import History

        events, dropped, numbers = self._events()
        if self._stacks == "python":
            # Each allocation's stack goes to the event it made, by the event's number: an event
            # no Python allocation made (RMM's own) has none, and a stack whose event the ring
            # dropped goes nowhere. A copy, made at once under the GIL: other threads append as
            # they allocate.
            stacks = dict(list(self._frames))
            for e, number in zip(events, numbers):
                if e["action"] in ("alloc", "cache_hit") and number in stacks:
                    e["frames"] = stacks[number]
        device = getattr(self._mr, "device", None) if self._kind != "pinned" else None
        header: dict[str, Any] = {
            "version": 1, "kind": self._kind, "pool": int(self._mr.pool_handle),
            "device": device, "max_events": self._max_events, "dropped": int(dropped),
            "stacks": self._stacks, "phases": [dict(p) for p in self._phases], "worker": None}
        return History(header, events)

    def snapshot(self) -> dict[str, Any]:
        """The snapshot PyTorch's memory viewer opens (``History.snapshot``)."""
        return dict(self.history().snapshot())

    def save(self, path: str | PathLike[str]) -> None:
        """Writes the history as asyncmr's JSON file (``History.save``)."""
        self.history().save(path)

    def export_torch_snapshot(self, path: str | PathLike[str]) -> None:
        """Writes the pickle PyTorch's memory viewer opens (``History.export_torch_snapshot``)."""
        self.history().export_torch_snapshot(path)

    def outstanding(self) -> list[dict[str, Any]]:
        """What is live now, largest first (``History.outstanding``)."""
        return list(self.history().outstanding())
