#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Type-checks every ```python block of README.md and of the documentation's pages (docs/) with
mypy against the installed asyncmr (it ships py.typed, so mypy reads its stubs): what a user
copies from a page must type-check. Each block is checked on its own, as a user would paste it.
Exits 1 listing the errors, each with the page it comes from.

    python ci/check_readme_types.py [PAGE.md ...]
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pages() -> list[Path]:
    """README.md and the documentation's Markdown sources (not what a docs build generates)."""
    return [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md")
                                         if "_generated" not in p.parts)


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or pages()
    blocks = [(path, block) for path in paths
              for block in re.findall(r"```python\n(.*?)```", path.read_text(), re.S)]
    if not blocks:
        print(f"{', '.join(map(str, paths))}: no python blocks")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, (page, block) in enumerate(blocks):
            name = re.sub(r"\W", "_", str(page.resolve().relative_to(ROOT)
                                          if page.resolve().is_relative_to(ROOT) else page.name))
            path = Path(tmp) / f"{name}_block_{i:02d}.py"
            path.write_text(block)
            files.append(str(path))
        proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                               str(ROOT / "pyproject.toml"), "--no-incremental", *files],
                              capture_output=True, text=True)
    print(proc.stdout, end="")
    print(proc.stderr, end="", file=sys.stderr)
    print(f"{len(blocks)} blocks of {len(paths)} pages: "
          f"{'ok' if proc.returncode == 0 else 'mypy failed'}")
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
