# SPDX-License-Identifier: Apache-2.0
"""One PNG per section (sections 1 to 11), drawn with matplotlib from the results document;
a missing matplotlib is recorded, not fatal. Colours say whose a bar is, the same in every plot:
asyncmr green, other libraries blue, the raw driver floor or an ideal grey; each plot has the
legend that says so."""

from __future__ import annotations

from pathlib import Path

from .common import SECTION_KEYS, err_text, fmt_size, median_of
from .harness import section_failed


def write_plots(doc: dict, out: Path) -> dict:
    """One PNG per section that ran; returns {section: file or error}."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        return {"error": f"matplotlib unavailable: {err_text(e)}"}
    made = {}
    secs = doc.get("sections", {})
    for num, fn in ((1, _plot_pair_cost), (2, _plot_sync), (3, _plot_threads),
                    (4, _plot_frag), (5, _plot_staging), (6, _plot_cupy), (7, _plot_gil),
                    (8, _plot_cupy_pinned), (9, _plot_pinned_arrays), (10, _plot_cudf),
                    (11, _plot_front_cache), (12, _plot_placement), (13, _plot_stacks)):
        key = SECTION_KEYS[num]
        res = secs.get(key)
        if not res or section_failed(res) or "skipped" in res:
            continue
        path = out / f"{key}.png"
        try:
            fig = fn(plt, res, doc.get("meta", {}))
            if fig is None:
                continue
            fig.savefig(path, dpi=110, bbox_inches="tight")
            plt.close(fig)
            made[key] = path.name  # relative: results.json and the PNGs travel together
        except Exception as e:  # noqa: BLE001
            made[key] = f"error: {err_text(e)}"
            plt.close("all")
    return made


def _subtitle(meta: dict) -> str:
    return f"{meta.get('gpu', '?')}, driver {meta.get('driver', meta.get('cuda_driver_api'))}, " \
           f"{meta.get('date', '')}"


ASYNCMR, OTHER, FLOOR = "tab:green", "tab:blue", "tab:gray"


def _family(name: str) -> str:
    """The colour of a contender: asyncmr's, another library's, or a floor / ideal."""
    if name.startswith(("C++", "raw floor")) or "ideal" in name:
        return FLOOR
    if name.startswith(("Async", "asyncmr")):
        return ASYNCMR
    return OTHER


def _legend(ax, plt, families=(ASYNCMR, OTHER, FLOOR), **kw):
    """The colour key of the figure, under its title (never over a bar)."""
    from matplotlib.patches import Patch

    labels = {ASYNCMR: "asyncmr", OTHER: "other libraries", FLOOR: "raw driver floor / ideal"}
    kw.pop("loc", None)
    ax.figure.legend(handles=[Patch(color=c, label=labels[c]) for c in families], fontsize=8,
                     loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=len(families),
                     frameon=False, **kw)


def _log_x(ax):
    """A log x axis with labels on the decades only (minor labels overlap)."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())


def _hbars(ax, names, values, unit_fmt="{:.3g}"):
    """Horizontal bars, one per name, coloured by family, each labelled with its value."""
    ax.barh(range(len(names)), [v or 0.0 for v in values], color=[_family(n) for n in names])
    for i, v in enumerate(values):
        if v:
            ax.text(v, i, " " + unit_fmt.format(v), va="center", fontsize=7)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()


def _plot_pair_cost(plt, res, meta):
    sizes = res.get("sizes", [])
    rows = {}
    for name, per in res.get("results", {}).items():
        if "error" not in per and "skipped" not in per:
            rows[name] = {s: median_of(per.get(str(s))) for s in sizes}
    for pool, per in (res.get("cpp", {}).get("floor") or {}).items():
        rows[f"C++ floor: {pool}"] = {s: median_of(per.get(str(s))) for s in sizes}
    if not rows:
        return None
    names = list(rows)
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 0.32 * len(names) + 1.8),
                             sharey=True, squeeze=False)
    for ax, s in zip(axes[0], sizes, strict=True):
        vals = [rows[n][s] or 0.0 for n in names]
        ax.barh(range(len(names)), vals, color=[_family(n) for n in names])
        _log_x(ax)
        for i, v in enumerate(vals):
            if v:
                ax.text(v, i, f" {v:.3g}", va="center", fontsize=6)
        ax.set_title(fmt_size(s))
        ax.set_xlabel("us per alloc+free pair (median)")
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(names)))
    axes[0][0].set_yticklabels(names, fontsize=8)
    axes[0][0].invert_yaxis()
    _legend(axes[0][-1], plt, loc="lower right")
    fig.suptitle(f"Alloc+free pair cost, one stream -- {_subtitle(meta)}")
    return fig


def _plot_sync(plt, res, meta):
    sizes = res.get("sizes", [])
    pairs = [k for k in res.get("ratios", {}).get("threshold 0 / threshold max (round time)", {})]
    if not pairs:
        return None
    fig, axes = plt.subplots(1, len(sizes), figsize=(4 * len(sizes), 3.6), squeeze=False)
    for ax, s in zip(axes[0], sizes, strict=True):
        def med(b, label, _s=s):
            return median_of(res["results"].get(f"{b} threshold={label}", {}).get(str(_s))) or 0

        zero = [med(b, "0") for b in pairs]
        mx = [med(b, "max") for b in pairs]
        x = range(len(pairs))
        ax.bar([i - 0.2 for i in x], zero, width=0.4, label="threshold 0", color="tab:red")
        ax.bar([i + 0.2 for i in x], mx, width=0.4, label="threshold max", color="tab:green")
        ax.set_xticks(list(x))
        ax.set_xticklabels([p.replace("rmm ", "rmm\n") for p in pairs], fontsize=7, rotation=20)
        ax.set_yscale("log")
        ax.set_title(fmt_size(s))
    axes[0][0].set_ylabel("us per alloc+free+sync round (median)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Release threshold across synchronizations -- {_subtitle(meta)}")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return fig


def _plot_threads(plt, res, meta):
    sizes = res.get("sizes", [])
    counts = res.get("thread_counts", [])
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4), squeeze=False)
    for ax, s in zip(axes[0], sizes, strict=True):
        for name, per in res.get("results", {}).items():
            ps = per.get(str(s), {}) if "error" not in per else {}
            ys = [median_of(ps.get(str(n)), "pairs_per_s") for n in counts]
            if any(y is not None for y in ys):
                ax.plot(counts, [(y or 0) / 1e6 for y in ys], marker="o", label=name,
                        linestyle="-" if name.startswith("Async") else "--")
        ax.set_xticks(counts)
        ax.set_xlabel("threads (one stream each)")
        ax.set_ylabel("aggregate M pairs/s (median)")
        ax.set_title(fmt_size(s))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Threads -- {_subtitle(meta)}")
    return fig


def _plot_frag(plt, res, meta):
    kinds = list(res.get("results", {}))
    if not kinds:
        return None
    ours = [res["results"][k].get("ours", {}).get("reserved_over_requested") or 0 for k in kinds]
    theirs = [res["results"][k].get("adaptor", {}).get("reserved_over_requested") or 0
              for k in kinds]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    x = range(len(kinds))
    ax.bar([i - 0.2 for i in x], ours, width=0.4, label="asyncmr (owned pool)", color="tab:green")
    ax.bar([i + 0.2 for i in x], theirs, width=0.4, label="rmm PoolMemoryResource",
           color="tab:blue")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(kinds)
    ax.set_ylabel("reserved high / requested peak")
    ax.legend(fontsize=8)
    fig.suptitle(f"Fragmentation, seeded workload -- {_subtitle(meta)}", fontsize=9)
    return fig


def _plot_staging(plt, res, meta):
    st = {n: e for n, e in res.get("staging", {}).items() if "error" not in e}
    lc = {n: e for n, e in res.get("large_copy", {}).items() if "error" not in e}
    if not st and not lc:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    names = list(st)
    _hbars(a1, names, [st[n].get("GBps") for n in names])
    a1.set_xlabel("staging GB/s (median)")
    a1.set_title("H2D staging in chunks")
    _legend(a1, plt, loc="lower right")
    names = list(lc)
    rows = [(n, d, median_of(lc[n].get(d), "GBps")) for n in names for d in ("H2D", "D2H")]
    labels = [f"{n} {d}" for n, d, _ in rows]
    _hbars(a2, labels, [v for _, _, v in rows])
    a2.set_xlabel("GB/s (median)")
    a2.set_title("one large copy")
    fig.suptitle(f"Pinned memory -- {_subtitle(meta)}")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def _plot_cupy(plt, res, meta):
    ok = {n: e for n, e in res.get("results", {}).items() if "error" not in e}
    if not ok:
        return None
    names = list(ok)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.5))
    ax.barh(range(len(names)), [ok[n]["median_s"] for n in names],
            xerr=[[ok[n]["median_s"] - ok[n]["p10_s"] for n in names],
                  [ok[n]["p90_s"] - ok[n]["median_s"] for n in names]],
            color=[_family(n) for n in names])
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("wall time, s (median, p10-p90)")
    _legend(ax, plt, (ASYNCMR, OTHER), loc="lower right")
    fig.suptitle(f"Managed CuPy pipeline -- {_subtitle(meta)}", fontsize=9)
    return fig


def _plot_gil(plt, res, meta):
    stall = (res.get("stall") or {}).get("results") or {}
    th = res.get("threads") or {}
    if not stall and not th:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 3.8))
    names = [n for n, e in stall.items() if "error" not in e]
    _hbars(a1, names, [(stall[n].get("longest_gap") or {}).get("median_ms") for n in names],
           "{:.3g} ms")
    _log_x(a1)
    a1.set_xlabel("a Python ticker's longest gap while a pinned pool grows, ms (median)")
    a1.set_title("stall")
    counts = th.get("thread_counts") or [8]
    n = str(max(counts))
    tres = th.get("results") or {}
    names = [k for k, e in tres.items() if "error" not in e]
    _hbars(a2, names, [((tres[k].get(n) or {}).get("median_pairs_per_s") or 0) / 1e6
                       for k in names], "{:.3g} M/s")
    a2.set_xlabel(f"aggregate M pairs/s, {n} threads on their own streams (median)")
    a2.set_title("threads")
    _legend(a2, plt, (ASYNCMR, OTHER), loc="lower right")
    fig.suptitle(f"The GIL policy -- {_subtitle(meta)}")
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    return fig


def _gbps_rows(results: dict, key: str) -> tuple[list, list]:
    labels, values = [], []
    for name, e in results.items():
        if not isinstance(e, dict) or "error" in e:
            continue
        for d in ("H2D", "D2H"):
            entry = e.get(d) or {}
            labels.append(f"{name} {d}")
            values.append(entry.get(key) if key in entry else median_of(entry, "GBps"))
    return labels, values


def _gbps_plot(plt, res, meta, key, value_fmt, xlabel, title):
    """One labelled bar per contender and direction, from ``res["results"]``'s GB/s entries."""
    labels, values = _gbps_rows(res.get("results") or {}, key)
    if not labels:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.4 * len(labels) + 1.6))
    _hbars(ax, labels, values, value_fmt)
    ax.set_xlabel(xlabel)
    _legend(ax, plt, (ASYNCMR, OTHER), loc="lower right")
    fig.suptitle(f"{title} -- {_subtitle(meta)}", fontsize=9)
    return fig


def _plot_cupy_pinned(plt, res, meta):
    return _gbps_plot(plt, res, meta, "GBps", "{:.3g} GB/s",
                      "GB/s through CuPy's pinned-memory hook (median)", "CuPy staging loop")


def _plot_pinned_arrays(plt, res, meta):
    return _gbps_plot(plt, res, meta, "median_GBps", "{:.4g} GB/s", "copy GB/s (median)",
                      "Pinned NumPy arrays")


def _plot_cudf(plt, res, meta):
    results = {n: e for n, e in (res.get("results") or {}).items() if "error" not in e}
    if not results:
        return None
    labels, values = [], []
    for name, e in results.items():
        for what in ("write", "read"):
            v = (e.get(what) or {}).get("median_s")
            labels.append(f"{name}: {what}")
            values.append(v * 1e3 if isinstance(v, (int, float)) else None)
    fig, ax = plt.subplots(figsize=(10, 0.4 * len(labels) + 1.6))
    _hbars(ax, labels, values, "{:.3g} ms")
    ax.set_xlabel("Parquet time, ms (median)")
    _legend(ax, plt, (ASYNCMR, OTHER), loc="lower right")
    fig.suptitle(f"cuDF Parquet round trip -- {_subtitle(meta)}", fontsize=9)
    return fig


def _plot_front_cache(plt, res, meta):
    py = ((res.get("python") or {}).get("results")) or {}
    sizes = res.get("sizes") or [4096, 65536]
    names = [n for n, e in py.items() if "error" not in e and "skipped" not in e]
    pinned = ((res.get("cpp") or {}).get("pairs") or {}).get("pinned") or {}
    if not names and not pinned:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.35 * max(len(names), 3) + 2.2))
    s0 = str(sizes[0])
    _hbars(axes[0], names, [median_of(py[n].get(s0)) for n in names], "{:.3g} us")
    _log_x(axes[0])
    axes[0].set_xlabel(f"us per alloc+free pair from Python, {fmt_size(sizes[0])} (median)")
    _legend(axes[0], plt, loc="lower right")
    ways = [("cached", "asyncmr: cache hit, via ref"), ("uncached", "asyncmr: no cache, via ref"),
            ("floor", "raw floor")]
    entry = pinned.get(s0) or {}
    _hbars(axes[1], [label for _, label in ways],
           [(entry.get(w) or {}).get("median_ns") for w, _ in ways], "{:.4g} ns")
    axes[1].set_xlabel(f"ns per pair in C++, pinned, {fmt_size(sizes[0])} (median)")
    fig.suptitle(f"Front cache -- {_subtitle(meta)}")
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    return fig


def _ours_or_others(ax, values: dict, ours: tuple, title: str):
    """One panel of horizontal bars, {name: value}: asyncmr's (names starting with ``ours``)
    in its colour, the others in theirs."""
    names = list(values)
    ax.barh(range(len(names)), [values[n] for n in names],
            color=[ASYNCMR if n.startswith(ours) else OTHER for n in names])
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=9)


def _plot_placement(plt, res, meta):
    panels = [(k, t) for k, t in (("host_written", "a. host-written, then a kernel"),
                                  ("reused", "b. reused host-touched pool memory"),
                                  ("small_ranges", "c. many 64 KiB ranges"),
                                  ("overwrite", "d. about to be overwritten"))
              if any("error" not in e for e in (res.get(k) or {}).values())]
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 1.6 * len(panels) + 1.2))
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (key, title) in zip(axes, panels):
        ok = {w: e["median_ms"] for w, e in res[key].items() if "error" not in e}
        _ours_or_others(ax, ok, ("asyncmr", "AsyncManagedMR"), title)
        ax.set_xlabel("ms per round (median)")
    _legend(axes[0], plt, (ASYNCMR, OTHER), loc="lower right")
    fig.suptitle(f"Managed placement -- {_subtitle(meta)}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.94))  # the title and the colour key above the panels
    return fig


def _plot_stacks(plt, res, meta):
    pd_ = {w: e for w, e in ((res.get("cudf_pandas") or {}).get("results") or {}).items()
           if "error" not in e}
    ml = {w: e for w, e in ((res.get("cuml") or {}).get("results") or {}).items()
          if "error" not in e}
    panels = []
    for key in ("first", "warm"):
        if pd_:
            panels.append((f"a. cudf.pandas workload, {key} (s, median)",
                           {w: e[key]["median_s"] for w, e in pd_.items()}))
    if ml:
        estimators = next(iter(ml.values()))["fits"].keys()
        for est in estimators:
            panels.append((f"b. cuML {est} fit (ms, median)",  # fits take milliseconds
                           {w: 1e3 * e["fits"][est]["median_s"] for w, e in ml.items()}))
    panels += _share_panels(res.get("allocator_share") or {})
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 1.3 * len(panels) + 1.2))
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (title, values) in zip(axes, panels):
        _ours_or_others(ax, values, ("python -m asyncmr", "Async"), title)
    _legend(axes[0], plt, (ASYNCMR, OTHER))
    fig.suptitle(f"Managed stacks -- {_subtitle(meta)}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.94))  # the title and the colour key above the panels
    return fig


def _share_panels(share: dict) -> list:
    """Section 13 c: each way's allocations of a warm run replayed alone (cuML: the four fits'
    summed), in ms: what its allocator costs that run."""
    panels = []
    for part, label in (("cudf_pandas", "the cudf.pandas workload's"), ("cuml", "the cuML fits'")):
        replays = {w: r for w, r in ((share.get(part) or {}).get("replays") or {}).items()
                   if "error" not in r}
        values = {w: 1e3 * sum(v["warm"]["median_s"] for k, v in r.items() if k != "resource")
                  for w, r in replays.items()}
        if values:
            panels.append((f"c. {label} allocations of a warm run, replayed alone (ms, median)",
                           values))
    return panels


def main(argv=None) -> int:
    """``python -m asyncmr_bench.plots RESULTS.json [OUT_DIR]``: draw the plots of a results
    file (a GPU host returns the JSON; the plots are drawn where matplotlib is)."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m asyncmr_bench.plots RESULTS.json [OUT_DIR]", file=sys.stderr)
        return 2
    path = Path(args[0])
    out = Path(args[1]) if len(args) > 1 else path.parent
    out.mkdir(parents=True, exist_ok=True)
    written = write_plots(json.loads(path.read_text()), out)
    for name in sorted(written):
        print(f"{name}: {written[name]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
