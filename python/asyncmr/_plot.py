# SPDX-License-Identifier: Apache-2.0
"""The timeline behind ``asyncmr.history.plot`` and ``python -m asyncmr plot``: reserved, used
and cached bytes over time per history, phases shaded, one lane per worker.

matplotlib is imported only when a timeline is drawn, and drawn on a figure of its own with the
Agg canvas: pyplot's global state (its backend, its current figure) is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from asyncmr._validate import type_name
from asyncmr.history import History

# matplotlib's axes, typed loosely: matplotlib is optional, and the stub check runs without it.
Axes = Any

_GIB = 1 << 30
_MIB = 1 << 20
# (event key, legend label, colour): the pool's two figures and the front cache's.
_SERIES = (("reserved", "reserved (pool)", "C0"),
           ("used", "used (pool)", "C1"),
           ("cached", "cached (front cache)", "C2"))
_PHASE_COLOURS = ("C4", "C5", "C6", "C8", "C9")


def lane_name(history: History) -> str:
    """A lane's title: the worker, or the pool and its device."""
    h = history.header
    if h["worker"] is not None:
        return str(h["worker"])
    where = f" on device {h['device']}" if h["device"] is not None else ""
    return f"{h['kind']} pool {h['pool']:#x}{where}"


# Each lane is a subplot of its own, whose layout costs grow faster than the lanes (300 empty
# histories, a 17.6 kB file, took 116 s): a timeline draws at most this many.
MAX_LANES = 64


def lanes_of(history_or_many: History | Mapping[str, History]) -> list[tuple[str, History]]:
    """(title, history) per lane, in the order given."""
    if isinstance(history_or_many, History):
        return [(lane_name(history_or_many), history_or_many)]
    if not isinstance(history_or_many, Mapping):
        raise TypeError(f"asyncmr: history_or_many must be a History or a dict of them, got "
                        f"{type_name(history_or_many)}")
    if len(history_or_many) > MAX_LANES:
        raise ValueError(f"asyncmr: {len(history_or_many)} histories are more lanes than one "
                         f"timeline draws ({MAX_LANES}): plot a selection of them with "
                         f"asyncmr.history.plot")
    lanes = []
    for name, h in history_or_many.items():
        if not isinstance(name, str):
            raise TypeError(f"asyncmr: a worker's name must be a str, got {type_name(name)}")
        if not isinstance(h, History):
            raise TypeError(f"asyncmr: histories[{name!r}] must be a History, got "
                            f"{type_name(h)}")
        lanes.append((name, h))
    if not lanes:
        raise ValueError("asyncmr: no histories to plot")
    return lanes


def unit_for(peak: int) -> tuple[str, int]:
    """GiB for a peak of 1 GiB or more, MiB below."""
    return ("GiB", _GIB) if peak >= _GIB else ("MiB", _MIB)


def time_unit_for(span_ns: int) -> tuple[str, float]:
    """Seconds for a span of a second or more, milliseconds down to a millisecond, else
    microseconds: the unit and the nanoseconds in one."""
    if span_ns >= 1_000_000_000:
        return "s", 1e9
    return ("ms", 1e6) if span_ns >= 1_000_000 else ("us", 1e3)


def draw(history_or_many: History | Mapping[str, History], out_path: Path,
         title: str | None) -> Path:
    """Writes the timeline PNG to ``out_path`` and returns it (see asyncmr.history.plot)."""
    if title is not None and not isinstance(title, str):
        raise TypeError(f"asyncmr: plot's title must be a str or None, got {type_name(title)}")
    lanes = lanes_of(history_or_many)
    try:
        # Optional: the stub check runs where matplotlib is not installed.
        from matplotlib.backends.backend_agg import (  # type: ignore[import-not-found,unused-ignore]
            FigureCanvasAgg,
        )
        from matplotlib.figure import Figure  # type: ignore[import-not-found,unused-ignore]
    except ImportError as e:
        raise ImportError("the history timeline needs matplotlib (pip install matplotlib)") from e

    peak = max((max(e["reserved"], e["used"], e["cached"])
                for _, h in lanes for e in h.events), default=0)
    unit, scale = unit_for(peak)
    fig = Figure(figsize=(11.0, 1.2 + 2.8 * len(lanes)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(lanes), 1, squeeze=False)[:, 0]
    for ax, (name, history) in zip(axes, lanes):
        _lane(ax, name, history, unit, scale)
    if title is None:
        kinds = sorted({h.header["kind"] for _, h in lanes})
        title = f"asyncmr allocation history: {', '.join(kinds)} pool" + (
            f"s of {len(lanes)} workers" if len(lanes) > 1 else "")
    fig.suptitle(title, parse_math=False)  # user text: "$" is a dollar, not mathtext
    fig.savefig(out_path, format="png", dpi=100)
    return out_path


def _lane(ax: Axes, name: str, history: History, unit: str, scale: int) -> None:
    dropped = history.dropped
    ax.set_title(name + (f"  ({dropped} oldest events dropped: the lane starts later)"
                         if dropped else ""), loc="left", fontsize=10, parse_math=False)
    ax.set_ylabel(f"bytes ({unit})")
    ax.grid(alpha=0.3)
    # The recorder's order can be a few ns out of time order across threads: draw in time.
    events = sorted(history.events, key=lambda e: e["time_ns"])
    if not events:
        ax.text(0.5, 0.5, "no events recorded", transform=ax.transAxes, ha="center",
                va="center", color="0.4")
        ax.set_ylim(0, 1)
        return
    t0, t_end = events[0]["time_ns"], events[-1]["time_ns"]
    time_unit, per = time_unit_for(t_end - t0)
    ax.set_xlabel(f"time ({time_unit} since this lane's first event)")
    xs = [(e["time_ns"] - t0) / per for e in events]
    # The state after the last event drawn a little past it, where it can be seen.
    x_end = max(xs[-1] * 1.03, 1e-9)
    for key, label, colour in _SERIES:
        ys = [e[key] / scale for e in events]
        sx, sy = xs + [x_end], ys + ys[-1:]
        if key == "reserved":
            # An area under the other lines: where used reaches reserved, both still show.
            ax.fill_between(sx, sy, step="post", color=colour, alpha=0.18, linewidth=0)
            ax.step(sx, sy, where="post", color=colour, label=label, linewidth=3.0, alpha=0.7)
        else:
            ax.step(sx, sy, where="post", color=colour, label=label, linewidth=1.5)
    ooms = [(x, e["used"] / scale) for x, e in zip(xs, events) if e["action"] == "oom"]
    if ooms:
        ax.plot([x for x, _ in ooms], [y for _, y in ooms], "x", color="red", markersize=9,
                label=f"failed allocation ({len(ooms)})")
    _phases(ax, history.header["phases"], t0, t_end, x_end, per)
    ax.set_ylim(bottom=0)
    ax.set_xlim(0, x_end)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def phase_label(phase: Mapping[str, Any]) -> str:
    """A phase's name, with its used peak when it has one (``mr.track_peak(name=...)``)."""
    peak = phase.get("used_high")
    if isinstance(peak, int) and not isinstance(peak, bool):
        unit, scale = unit_for(peak)
        return f"{phase['name']} (peak {peak / scale:.1f} {unit})"
    return str(phase["name"])


def _phases(ax: Axes, phases: Sequence[dict[str, Any]], t0: int, t_end: int,
            x_end: float, per: float) -> None:
    """Each phase as a shaded span with its name, clipped to the lane's events (a phase still
    open runs to the lane's end)."""
    for i, phase in enumerate(phases):
        start = (max(phase["start_ns"], t0) - t0) / per
        if phase["end_ns"] is None:
            end = x_end
        else:
            end = (min(phase["end_ns"], t_end) - t0) / per
        if end < start:
            continue  # entirely outside the events this lane holds
        colour = _PHASE_COLOURS[i % len(_PHASE_COLOURS)]
        if end > start:
            ax.axvspan(start, end, color=colour, alpha=0.15, linewidth=0)
        else:
            ax.axvline(start, color=colour, alpha=0.6)
        ax.text(start, 0.98, f" {phase_label(phase)}", transform=ax.get_xaxis_transform(),
                ha="left", va="top", fontsize=8, color=colour, clip_on=True,
                parse_math=False)
