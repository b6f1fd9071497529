# SPDX-License-Identifier: Apache-2.0
"""The committed results (``benchmarks/results/<build>/<run>/results.json``) and the newest
measurement of each section in them: what the README's figures and the documentation's
benchmark pages render. Standard library only.

A run may hold some sections only (``--sections``), so the newest figures of a (build, GPU)
can come from several runs: for each section, the newest run that measured it (a section the
run skipped or that failed does not count).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .common import SECTION_KEYS, SECTION_TITLES

RESULTS = Path(__file__).resolve().parent.parent / "results"


@dataclass(frozen=True, eq=False)
class Run:
    path: Path           # its results.json
    doc: dict

    @property
    def build(self) -> str:
        return self.path.parent.parent.name

    @property
    def gpu(self) -> str:
        return str((self.doc.get("meta") or {}).get("gpu", "unknown GPU"))

    @property
    def date(self) -> str:
        return str((self.doc.get("meta") or {}).get("date", ""))

    def measured(self, num: int) -> bool:
        """Whether this run holds results of section ``num`` (not a skip or a failure)."""
        entry = self.doc.get("sections", {}).get(SECTION_KEYS[num])
        return isinstance(entry, dict) and not ({"skipped", "error"} & entry.keys())

    def describe(self) -> str:
        """The machine, the date and the mode of the run, for a caption."""
        meta = self.doc.get("meta") or {}
        mode = "quick" if (self.doc.get("params") or {}).get("quick") else "full"
        return (f"{self.gpu}, driver {meta.get('driver', '?')}, "
                f"{self.date[:16].replace('T', ' ')} UTC, {mode} mode, {self.build} build, "
                f"`benchmarks/results/{self.build}/{self.path.parent.name}/`")


def runs(root: Path = RESULTS) -> list[Run]:
    """Every committed run, oldest first."""
    found = [Run(p, json.loads(p.read_text())) for p in sorted(root.glob("*/*/results.json"))]
    return sorted(found, key=lambda r: r.date)


def newest(build: str, num: int, gpu: str | None = None, root: Path = RESULTS) -> Run | None:
    """The newest run of ``build`` (on ``gpu``, or any) that measured section ``num``."""
    found = [r for r in runs(root) if r.build == build and r.measured(num)
             and (gpu is None or r.gpu == gpu)]
    return found[-1] if found else None


def newest_by_section(root: Path = RESULTS) -> dict[tuple[str, str], dict[int, Run]]:
    """{(build, GPU): {section: the newest run that measured it}}, builds and GPUs sorted."""
    table: dict[tuple[str, str], dict[int, Run]] = {}
    for run in runs(root):  # oldest first: a newer run replaces an older one
        for num in SECTION_TITLES:
            if run.measured(num):
                table.setdefault((run.build, run.gpu), {})[num] = run
    return {k: dict(sorted(v.items())) for k, v in sorted(table.items())}


def superseded(root: Path = RESULTS) -> list[Run]:
    """Committed runs no section's newest figures come from: git keeps them, the tree need not."""
    used = {r.path for by in newest_by_section(root).values() for r in by.values()}
    return [r for r in runs(root) if r.path not in used]
