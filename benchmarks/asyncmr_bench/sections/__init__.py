# SPDX-License-Identifier: Apache-2.0
"""One module per section; each has ``run(cfg, ctx) -> dict`` (raise ``harness.Skip`` when a
dependency is missing) and ``show(result)`` (its tables). Numbers, keys and titles live in
``common.SECTIONS``; the targets each section feeds are in ``targets.py``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from ..common import SECTION_KEYS, SECTION_TITLES
from . import (
    cudf_parquet, cupy_pinned, fragmentation, front_cache, gil, managed_cupy, managed_placement,
    managed_stacks, pair_cost, pinned_arrays, pinned_staging, sync_threshold, threads,
)


class Section(NamedTuple):
    key: str
    title: str
    run: Callable
    show: Callable


_MODULES = {
    1: pair_cost,
    2: sync_threshold,
    3: threads,
    4: fragmentation,
    5: pinned_staging,
    6: managed_cupy,
    7: gil,
    8: cupy_pinned,
    9: pinned_arrays,
    10: cudf_parquet,
    11: front_cache,
    12: managed_placement,
    13: managed_stacks,
}

REGISTRY = {num: Section(SECTION_KEYS[num], SECTION_TITLES[num], mod.run, mod.show)
            for num, mod in _MODULES.items()}
