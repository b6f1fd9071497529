#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks the installed asyncmr's stubs against the built module with mypy.stubtest (as
typeshed checks its own): a signature, parameter, property or name that the stub and the
extension disagree on fails. The allowlist (ci/stubtest-allowlist.txt) holds only what Cython
or the environment cannot show stubtest, each entry with its reason.

    python ci/check_stubs.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    proc = subprocess.run([sys.executable, "-m", "mypy.stubtest", "asyncmr", "--mypy-config-file",
                           str(ROOT / "pyproject.toml"), "--allowlist",
                           str(ROOT / "ci" / "stubtest-allowlist.txt")],
                          capture_output=True, text=True)
    print(proc.stdout, end="")
    print(proc.stderr, end="", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
