#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Type-checks every ```python block of README.md with mypy against the installed asyncmr (it
ships py.typed, so mypy reads its stubs): what a user copies from the page must type-check.
Each block is checked on its own, as a user would paste it. Exits 1 listing the errors.

    python ci/check_readme_types.py [README.md]
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    readme = Path(argv[0]) if argv else ROOT / "README.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)
    if not blocks:
        print(f"{readme}: no python blocks")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, block in enumerate(blocks):
            path = Path(tmp) / f"readme_block_{i:02d}.py"
            path.write_text(block)
            files.append(str(path))
        proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                               str(ROOT / "pyproject.toml"), "--no-incremental", *files],
                              capture_output=True, text=True)
    print(proc.stdout, end="")
    print(proc.stderr, end="", file=sys.stderr)
    print(f"{len(blocks)} README blocks: {'ok' if proc.returncode == 0 else 'mypy failed'}")
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
