# SPDX-License-Identifier: Apache-2.0
"""Sphinx configuration: MyST Markdown, pydata-sphinx-theme, the API reference from asyncmr's
docstrings (numpydoc style) with the signatures of its stubs, the command line from its own
argparse parsers, and the benchmark pages rendered from benchmarks/results. Built with
``sphinx-build -W -b html docs build/docs`` where asyncmr is installed (a GPU is not needed)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(ROOT / "benchmarks"))  # asyncmr_bench: the bench's parser and results

import asyncmr  # noqa: E402  (the installed package: autodoc documents what users import)

_project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
project = "asyncmr"
author = "asyncmr contributors"
copyright = "asyncmr contributors"
release = asyncmr.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
    "stub_signatures",   # _ext/: signatures of the compiled module from its .pyi stubs
    "api_coverage",      # _ext/: a public name without a docstring or a page fails the build
    "bench_results",     # _ext/: the benchmark pages, rendered from benchmarks/results
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "**/_*.md", "images/*.pickle", "images/*.json"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
nitpicky = False
suppress_warnings: list[str] = []

autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# asyncmr.cudf needs asyncmr._cudf, built only where libcudf was installed at build time.
autodoc_mock_imports = ["libcudf", "asyncmr._cudf"]
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False


html_theme = "pydata_sphinx_theme"
html_title = f"asyncmr {release}"
html_theme_options = {
    "icon_links": [{"name": name, "url": url, "icon": "fa-brands fa-github"}
                   for name, url in _project.get("urls", {}).items() if name == "Source"],
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
html_static_path: list[str] = []
