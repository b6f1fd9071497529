# SPDX-License-Identifier: Apache-2.0
"""Signatures of asyncmr._core.ipc, for editors and type checkers. Checked against the built
module by ``python -m mypy.stubtest`` (ci/check_stubs.py, run by tests/test_project.py)."""

import enum
from typing import Any

from typing_extensions import disjoint_base

from rmm.pylibrmm.stream import Stream

from asyncmr._core.conversions import _Int
from asyncmr._core.mem_pool import MemPool

# The C++ enum of include/asyncmr/mem_pool.hpp that names export handle types.
class ExportHandle(enum.IntEnum):
    posix_fd = ...
    fabric = ...

def export_pointer(ptr: _Int) -> bytes: ...

@disjoint_base
class ImportedAllocation:
    def __init__(self, *args: Any, **kwargs: Any) -> None: ...  # raises: use import_pointer
    @property
    def pool(self) -> MemPool: ...
    @property
    def ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def released(self) -> bool: ...
    def release(self, stream: Stream | None = None) -> None: ...
    def __enter__(self) -> ImportedAllocation: ...
    def __exit__(self, *exc: object) -> bool: ...
