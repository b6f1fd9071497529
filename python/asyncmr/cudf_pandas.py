# SPDX-License-Identifier: Apache-2.0
"""cudf.pandas on asyncmr's managed pool, in one line.

    import asyncmr.cudf_pandas
    asyncmr.cudf_pandas.install()   # before pandas is imported by the code to accelerate
    import pandas as pd              # cudf.pandas, allocating from an AsyncManagedMR

or, as ``python -m cudf.pandas`` does for a script or a module::

    python -m asyncmr cudf-pandas script.py ARGS...
    python -m asyncmr cudf-pandas -m module ARGS...
    python -m asyncmr cudf-pandas --cache BYTES script.py ARGS...   (a front cache, see README)

cudf.pandas's default memory is RMM's pool adaptor over managed memory with libcudf's managed
prefetching on; ``install`` puts an :class:`asyncmr.AsyncManagedMR` in the adaptor's place
(cudf.pandas keeps a resource that is already set) and turns the same prefetching on.
"""

from __future__ import annotations

import runpy
import sys
from typing import Any

from asyncmr import AsyncManagedMR

__all__ = ["install", "main"]

_installed: AsyncManagedMR | None = None
_installed_options: dict[str, Any] | None = None  # install()'s options (a resource takes no attributes)


def install(*, pool: Any = "default", prefetch: Any = None, release_threshold: int | None = None,
            cache: int | None = None, libcudf_prefetch: bool = True) -> AsyncManagedMR:
    """Makes an :class:`asyncmr.AsyncManagedMR` RMM's current device resource, turns on
    libcudf's managed-memory prefetching (``libcudf_prefetch``), then ``cudf.pandas.install()``.
    The keyword arguments are the resource's. Returns the resource. Calling it again returns
    the installed resource (a different configuration raises RuntimeError: cudf.pandas is set up
    once per process)."""
    global _installed, _installed_options
    wanted = {"pool": pool, "prefetch": prefetch, "release_threshold": release_threshold,
              "cache": cache, "libcudf_prefetch": libcudf_prefetch}
    if _installed is not None:
        if _installed_options != wanted:
            raise RuntimeError("asyncmr.cudf_pandas.install() ran already with other options; "
                               "cudf.pandas is set up once per process")
        return _installed
    try:
        import cudf.pandas  # type: ignore[import-not-found,unused-ignore]
        import pylibcudf  # type: ignore[import-not-found,unused-ignore]
    except ImportError as e:
        raise ImportError(f"asyncmr.cudf_pandas needs cuDF (pip install cudf-cu13): {e}") from e
    import rmm

    mr = AsyncManagedMR(pool=pool, prefetch=prefetch, release_threshold=release_threshold,
                        cache=cache)
    rmm.mr.set_current_device_resource(mr)
    if libcudf_prefetch:
        pylibcudf.prefetch.enable()
    cudf.pandas.install()
    _installed, _installed_options = mr, wanted
    return mr


def main(argv: list[str] | None = None) -> int:
    """``python -m asyncmr cudf-pandas (script.py | -m module) [ARGS...]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m asyncmr cudf-pandas [--cache BYTES] (SCRIPT | -m MODULE) [ARGS...]"
    if not args or args[0] in ("-h", "--help"):
        print(usage, file=sys.stderr if not args else sys.stdout)
        return 2 if not args else 0
    cache = None
    if args[0] == "--cache":
        value = args[1] if len(args) > 1 else ""
        if not value.isdigit():
            print(f"asyncmr cudf-pandas: --cache takes a number of bytes (0 or more), got "
                  f"{value!r}\n{usage}", file=sys.stderr)
            return 2
        cache, args = int(value), args[2:]
        if not args:
            print(usage, file=sys.stderr)
            return 2
    if args[0] == "-m":
        if len(args) < 2:
            print(usage, file=sys.stderr)
            return 2
        target, rest, module = args[1], args[2:], True
    else:
        target, rest, module = args[0], args[1:], False
    try:
        install(cache=cache)
    except ImportError as e:
        print(f"asyncmr cudf-pandas: {e}", file=sys.stderr)
        return 2
    sys.argv = [target, *rest]
    if module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(target, run_name="__main__")
    return 0
