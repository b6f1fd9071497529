# SPDX-License-Identifier: Apache-2.0
"""asyncmr's pinned pool where cuDF consumes pinned memory: its pinned memory resource, which
libcudf uses for I/O staging and host buffers (``cudf::set_pinned_memory_resource``).

    import asyncmr, asyncmr.cudf
    mr = asyncmr.AsyncPinnedMR()
    previous = asyncmr.cudf.set_pinned_memory_resource(mr)   # process-wide, for all of cuDF
    ...                                                      # pylibcudf / cudf I/O
    asyncmr.cudf.set_pinned_memory_resource(previous)        # or: with pinned_memory_resource(mr)

This module needs asyncmr built where libcudf was installed (the extension ``asyncmr._cudf``
links libcudf); otherwise importing it raises ImportError saying so.
"""

from __future__ import annotations

import contextlib

try:
    import libcudf

    libcudf.load_library()  # libcudf.so and what it needs, before the extension that links it
except Exception as _missing:  # ImportError, or the loader's error for a missing CUDA library
    from asyncmr import runtime_version

    raise ImportError(f"asyncmr.cudf needs libcudf and the CUDA libraries it loads "
                      f"(pip install libcudf-cu{runtime_version() // 1000}): "
                      f"{type(_missing).__name__}: {_missing}") from _missing

try:
    from asyncmr import _cudf
except ImportError as _missing:
    raise ImportError(
        "asyncmr.cudf is not available: this asyncmr was built without libcudf (install "
        "libcudf-cu13 26.10, then rebuild asyncmr from source so asyncmr._cudf is built): "
        f"{_missing}") from _missing

from asyncmr._cudf import CudfPinnedResource

__all__ = ["CudfPinnedResource", "get_pinned_memory_resource", "pinned_memory_resource",
           "set_pinned_memory_resource"]


def set_pinned_memory_resource(mr):
    """Make ``mr`` cuDF's pinned memory resource, for the whole process; return the previous
    one, which restores it when passed back here.

    Parameters
    ----------
    mr : asyncmr.AsyncPinnedMR or CudfPinnedResource
        An asyncmr pinned resource (its pool must be reachable from the devices cuDF runs on;
        ``AsyncPinnedMR`` grants every device access by default), or what an earlier call
        returned.

    asyncmr keeps every resource installed here alive until the process ends, because cuDF
    objects made while it was installed may free their pinned buffers through it later; call
    ``mr.trim_to(0)`` to give its unused memory back.
    """
    return _cudf.install(mr)


def get_pinned_memory_resource():
    """cuDF's pinned memory resource now: an asyncmr resource installed here, or a
    :class:`CudfPinnedResource` for any other (cuDF's default pool)."""
    return _cudf.current()


@contextlib.contextmanager
def pinned_memory_resource(mr):
    """``with asyncmr.cudf.pinned_memory_resource(mr): ...`` installs ``mr`` for the block and
    restores the previous resource afterwards, also when the block raises."""
    previous = set_pinned_memory_resource(mr)
    try:
        yield mr
    finally:
        set_pinned_memory_resource(previous)
