# SPDX-License-Identifier: Apache-2.0
"""Signatures of asyncmr._core.placement, for editors and type checkers. Checked against the built
module by ``python -m mypy.stubtest`` (ci/check_stubs.py, run by tests/test_project.py)."""

from typing import Any, Literal

from rmm.pylibrmm.stream import Stream

from asyncmr._core.conversions import _Int
from asyncmr._location import Location

ADVICE: tuple[str, ...]

def prefetch(
    obj: Any, to: Literal["device", "host"] | _Int | Location = "device", stream: Stream = ...
) -> None: ...
def discard(obj: Any, stream: Stream = ...) -> None: ...
def discard_and_prefetch(
    obj: Any, to: Literal["device", "host"] | _Int | Location = "device", stream: Stream = ...
) -> None: ...
def advise(
    obj: Any,
    advice: Literal[
        "set_read_mostly", "unset_read_mostly", "set_preferred_location",
        "unset_preferred_location", "set_accessed_by", "unset_accessed_by",
    ],
    to: Literal["device", "host"] | _Int | Location = "device",
) -> None: ...
def can_discard() -> bool: ...
def failed_prefetches() -> int: ...
