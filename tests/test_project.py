# SPDX-License-Identifier: Apache-2.0
"""The project as shipped: the installed distribution's metadata, the stubs, the README's code
and links, the documentation pages and the sources."""

import re
import sys
from pathlib import Path

import pytest

import asyncmr


def test_the_installed_distribution_carries_the_license():
    import importlib.metadata as md

    name = next(d.metadata["Name"] for d in md.distributions()
                if (d.metadata["Name"] or "").startswith("asyncmr"))
    dist = md.distribution(name)
    assert dist.metadata["License-Expression"] == "Apache-2.0"
    licenses = [f for f in dist.files or [] if f.name == "LICENSE"]
    assert licenses, f"no LICENSE in {name}'s files"
    assert "Apache License" in licenses[0].read_text()


def _installed_metadata():
    import importlib.metadata as md

    name = next(d.metadata["Name"] for d in md.distributions()
                if (d.metadata["Name"] or "").startswith("asyncmr"))
    return md.metadata(name)


def test_the_package_metadata_links_and_classifies_the_project():
    meta = _installed_metadata()
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls), urls
    assert all(u.startswith("https://") for u in urls.values()), urls
    classifiers = meta.get_all("Classifier") or []
    assert "Environment :: GPU :: NVIDIA CUDA" in classifiers, classifiers
    assert "Programming Language :: Python :: 3.11" in classifiers, classifiers
    assert not [c for c in classifiers if c.startswith("License ::")], "PEP 639: the expression"


def test_the_long_description_is_the_readmes_first_part_with_absolute_links():
    meta = _installed_metadata()
    body = meta.get_payload() or meta["Description"] or ""
    assert meta["Description-Content-Type"] == "text/markdown"
    assert body.startswith("# asyncmr"), body[:200]
    assert 20 < len(body.splitlines()) < 120, len(body.splitlines())
    assert "end of the package description" not in body
    relative = re.findall(r"\]\((?!https?://|#)([^)]+)\)", body)
    assert not relative, relative


# ---- the house: stubs, the README's code, the docs, the sources -------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def _ci_script(name):
    import subprocess
    import sys

    require = pytest.importorskip("mypy", reason="mypy is in the [test] extra; without it the "
                                                 "stub and README checks cannot run")
    del require
    return subprocess.run([sys.executable, str(ROOT / "ci" / name)], capture_output=True,
                          text=True, timeout=900)


def test_the_stubs_match_the_built_module():
    proc = _ci_script("check_stubs.py")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


def test_the_readmes_python_blocks_type_check():
    proc = _ci_script("check_readme_types.py")  # README.md and the docs' pages
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "pages: ok" in proc.stdout, proc.stdout


README = ROOT / "README.md"
DOC_PAGES = [README, ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md"] + sorted(
    p for p in (ROOT / "docs").rglob("*.md") if "_generated" not in p.parts)
FIGURES_BLOCK = re.compile(r"<!-- figures:(?P<name>[a-z0-9-]+) -->.*?<!-- /figures:(?P=name) -->",
                           re.S)


def test_the_readme_is_read_in_five_minutes():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    first_example = next(i for i, line in enumerate(lines, 1) if line == "```python")
    assert first_example <= 60, first_example
    # .ci/run runs the line after "# tests:"; the demo's line comes first.
    assert [i for i, line in enumerate(lines) if line.startswith("# main:")] == [
        i - 2 for i, line in enumerate(lines) if line.startswith("# tests:")]


def test_the_pages_carry_no_dates_and_the_readme_no_gpu_model():
    # Dates, hosts and run history live in git and in the results files; the pages rendered from
    # those (the README's figures blocks, the docs' generated benchmark pages) may carry them.
    date = re.compile(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}")
    dated = [f"{p.relative_to(ROOT)}:{i}" for p in DOC_PAGES
             for i, line in enumerate(FIGURES_BLOCK.sub("", p.read_text()).splitlines(), 1)
             if date.search(line)]
    assert not dated, dated
    gpu = re.compile(r"\b(H100|H200|GH200|A100|B200|V100|L40S?|RTX ?\d+)\b")
    outside = FIGURES_BLOCK.sub("", README.read_text())
    assert not gpu.search(outside), gpu.search(outside)


def test_the_readmes_links_into_the_tree_resolve():
    links = re.findall(r"\]\((?!https?://|#)([^)#]+)", README.read_text())
    assert len(links) > 10
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, missing


def test_the_cli_page_states_the_exit_statuses_of_the_code():
    from asyncmr._cli import EXIT_STATUSES

    text = (ROOT / "docs" / "cli.md").read_text()
    for code, what in EXIT_STATUSES:
        assert f"| {code} | {what} |" in text, (code, what)


LIBRARY_SOURCES = [p for d in ("include", "src", "python/asyncmr", "cmake", "ci")
                   for p in sorted((ROOT / d).rglob("*"))
                   if p.is_file() and p.suffix in {".hpp", ".cpp", ".py", ".pyx", ".pxd", ".pyi",
                                                    ".cmake", ".sh", ".txt", ".cu"}]


CORE = ROOT / "python" / "asyncmr" / "_core"


def test_each_compiled_part_is_built_declared_stubbed_and_documented():
    # A part is a .pyx with its .pxd (what other parts cimport), its stub (stubtest checks a
    # compiled module only through one), its line in the CMake list (else it is never built)
    # and its row in docs/ARCHITECTURE.md's "The Python layer".
    parts = {p.stem for p in CORE.glob("*.pyx")}
    assert len(parts) > 5, parts
    assert {p.stem for p in CORE.glob("*.pxd")} == parts
    assert {p.stem for p in CORE.glob("*.pyi")} == parts
    cmake = (ROOT / "python" / "asyncmr" / "CMakeLists.txt").read_text()
    assert set(re.findall(r"asyncmr_cython_module\(_core/(\w+)\)", cmake)) == parts
    layer = (ROOT / "docs" / "ARCHITECTURE.md").read_text().split("## The Python layer")[1]
    layer = layer.split("\n## ")[0]
    assert set(re.findall(r"^\| `(\w+)\.pyx`", layer, re.M)) == parts


def test_the_installed_parts_are_the_compiled_modules_asyncmr_imports():
    import importlib.machinery

    import asyncmr._core

    installed = Path(asyncmr._core.__file__).parent
    compiled = {p.name.split(".")[0] for p in installed.iterdir()
                if p.name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))}
    imported = {name.rsplit(".", 1)[1] for name in sys.modules
                if name.startswith("asyncmr._core.")}
    assert compiled == imported == {p.stem for p in installed.glob("*.pyi")}


def test_no_issue_numbers_in_the_sources():
    """Comments and messages say what the code does and why; history lives in git."""
    pattern = re.compile(r"\bissues?\s*#?\d+|\(#\d+\)", re.IGNORECASE)
    offenders = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
                 for p in LIBRARY_SOURCES + sorted(q for q in (ROOT / "benchmarks").rglob("*")
                                                   if q.suffix in {".py", ".cpp", ".hpp", ".md"})
                 for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
                 if pattern.search(line)]
    assert not offenders, "\n".join(offenders)
