# SPDX-License-Identifier: Apache-2.0
"""The benchmark results pages, rendered at build time from the committed results
(``benchmarks/results/<build>/<run>/results.json``): per build and GPU, each section's tables
(as the benchmark prints them), its plot and its targets, from the newest run that measured
it (``asyncmr_bench.committed``). Written to ``_generated/`` (not committed), which
``benchmarks/results.md`` includes; the pages carry each run's machine and date."""

from __future__ import annotations

import contextlib
import copy
import io
from pathlib import Path

OUT = "_generated"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def _captured(fn, *args) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args)
    return out.getvalue().rstrip()


def _targets_table(rows: list[dict]) -> list[str]:
    from asyncmr_bench import targets as tm

    def value(v):
        return "not measured" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))

    lines = ["| section | target | value | wanted | met |", "|---|---|---|---|---|"]
    for t in rows:
        met = {tm.MET: "yes", tm.NOT_MET: "**no**"}.get(t["status"], "not run")
        name = t["name"].replace("|", "\\|")
        lines.append(f"| {t['section']} | {name} | {value(t.get('value'))} | "
                     f"{t['target']} | {met} |")
    return lines


def render(srcdir: Path) -> str:
    """The results page's Markdown; draws the plots into ``srcdir/_generated/bench``."""
    from asyncmr_bench import committed
    from asyncmr_bench.common import SECTION_KEYS, SECTION_TITLES
    from asyncmr_bench.plots import write_plots
    from asyncmr_bench.sections import REGISTRY
    from asyncmr_bench.targets import compute_targets

    plots = srcdir / OUT / "bench"
    plots.mkdir(parents=True, exist_ok=True)
    out: list[str] = []
    for (build, gpu), by_section in committed.newest_by_section().items():
        out += [f"## The {build} build on {gpu}", ""]
        used = list(dict.fromkeys(by_section.values()))
        out += ["The newest run of each section:", ""]
        out += [f"- sections {', '.join(str(n) for n, r in by_section.items() if r is run)}: "
                f"{run.describe()}" for run in used]
        out += ["", "### Targets", ""]
        rows = []
        for run in used:
            mine = {n for n, r in by_section.items() if r is run}
            rows += [t for t in compute_targets(run.doc) if t["section"] in mine]
        out += _targets_table(sorted(rows, key=lambda t: t["section"])) + [""]
        for num, run in by_section.items():
            key = SECTION_KEYS[num]
            result = run.doc["sections"][key]
            out += [f"### {num}. {SECTION_TITLES[num]}", "", f"Run: {run.describe()}.", ""]
            tables = _captured(REGISTRY[num].show, copy.deepcopy(result))
            if tables:
                out += ["```text", tables, "```", ""]
            one = {"meta": run.doc.get("meta", {}), "sections": {key: result}}
            made = write_plots(one, plots)
            name = made.get(key)
            if isinstance(name, str) and not name.startswith("error"):
                target = plots / f"{_slug(build + '-' + gpu)}-{name}"
                (plots / name).replace(target)
                out += [f"![section {num}: {SECTION_TITLES[num]}](/{OUT}/bench/{target.name})",
                        ""]
    return "\n".join(out) + "\n"


def _generate(app):
    srcdir = Path(app.srcdir)
    text = render(srcdir)
    page = srcdir / OUT / "benchmark-results.md"
    if not page.exists() or page.read_text() != text:
        page.write_text(text)


def setup(app):
    app.connect("builder-inited", _generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
