# SPDX-License-Identifier: Apache-2.0
"""Signatures of asyncmr._core.runtime (no Python names: it sets up the C++ side on import), for editors and type checkers. Checked against the built
module by ``python -m mypy.stubtest`` (ci/check_stubs.py, run by tests/test_project.py)."""
