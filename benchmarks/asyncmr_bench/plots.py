# SPDX-License-Identifier: Apache-2.0
"""One PNG per section that has a plot (sections 1 to 6), drawn with matplotlib from the
results document; a missing matplotlib is recorded, not fatal."""

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
                    (4, _plot_frag), (5, _plot_staging), (6, _plot_cupy)):
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
        colors = ["tab:green" if n.startswith("Async") else
                  "tab:gray" if n.startswith(("C++", "raw floor")) else "tab:blue"
                  for n in names]
        ax.barh(range(len(names)), vals, color=colors)
        ax.set_xscale("log")
        for i, v in enumerate(vals):
            if v:
                ax.text(v, i, f" {v:.3g}", va="center", fontsize=6)
        ax.set_title(fmt_size(s))
        ax.set_xlabel("us per alloc+free pair (median)")
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(names)))
    axes[0][0].set_yticklabels(names, fontsize=8)
    axes[0][0].invert_yaxis()
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
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3.8))
    names = list(st)
    a1.barh(range(len(names)), [st[n]["GBps"] for n in names], color="tab:green")
    for i, n in enumerate(names):
        a1.text(st[n]["GBps"], i, f" {st[n]['GBps']:.3g}", va="center", fontsize=7)
    a1.set_yticks(range(len(names)))
    a1.set_yticklabels(names, fontsize=8)
    a1.invert_yaxis()
    a1.set_xscale("log")
    a1.set_xlabel("staging GB/s (median)")
    a1.set_title("H2D staging in chunks")
    names = list(lc)
    for j, d in enumerate(("H2D", "D2H")):
        a2.bar([i + 0.4 * j - 0.2 for i in range(len(names))],
               [median_of(lc[n].get(d), "GBps") or 0 for n in names], width=0.4, label=d)
    a2.set_xticks(range(len(names)))
    a2.set_xticklabels(names, fontsize=8)
    a2.set_ylabel("GB/s (median)")
    a2.set_title("one large copy")
    a2.legend(fontsize=8)
    fig.suptitle(f"Pinned memory -- {_subtitle(meta)}")
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
            color=["tab:green" if n.startswith("Async") else "tab:blue" for n in names])
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("wall time, s (median, p10-p90)")
    fig.suptitle(f"Managed CuPy pipeline -- {_subtitle(meta)}", fontsize=9)
    return fig


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
