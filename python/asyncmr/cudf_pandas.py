# SPDX-License-Identifier: Apache-2.0
"""cudf.pandas on asyncmr's managed pool, in one line.

    import asyncmr.cudf_pandas
    asyncmr.cudf_pandas.install()   # before pandas is imported by the code to accelerate
    import pandas as pd              # cudf.pandas, allocating from an AsyncManagedMR

or, as ``python -m cudf.pandas`` does for a script or a module::

    python -m asyncmr cudf-pandas script.py ARGS...
    python -m asyncmr cudf-pandas -m module ARGS...
    python -m asyncmr cudf-pandas --cache BYTES script.py ARGS...   (a front cache, see README)
    python -m asyncmr cudf-pandas --prefetch device --discard script.py ARGS...
    python -m asyncmr cudf-pandas --reserve BYTES script.py ARGS...   (the pool grown up front)

``--prefetch`` (``device``, ``host`` or a device ordinal) and ``--discard`` are the resource's
``prefetch=`` and ``discard=True``: every allocation placed where it will be used, its old
contents dropped instead of migrated (CUDA 13 build).

The runner's exit status: 2 for a wrong option or a missing script (checked first, on any
machine), or options the resource refuses; 3 without a usable CUDA device (looked for before
cuDF); 4 without cuDF; 1 when the pool cannot be set up (``--reserve`` more than the GPU
holds); each with one line on stderr. Otherwise it is the script's own (an exception in the
script is its traceback and 1, as under ``python script.py``).

cudf.pandas's default memory is RMM's pool adaptor over managed memory with libcudf's managed
prefetching on; ``install`` puts an :class:`asyncmr.AsyncManagedMR` in the adaptor's place
(cudf.pandas keeps a resource that is already set) and turns the same prefetching on.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

import asyncmr
from asyncmr import AsyncManagedMR
from asyncmr import _validate
from asyncmr._core import _check_managed_options
from asyncmr._validate import ascii_digits

__all__ = ["install", "main"]

_installed: AsyncManagedMR | None = None
_installed_options: dict[str, Any] | None = None  # install()'s options (a resource takes no attributes)


def install(*, pool: Any = "default", prefetch: Any = None, discard: bool = False,
            release_threshold: int | None = None, reserve: int = 0, cache: int | None = None,
            libcudf_prefetch: bool = True) -> AsyncManagedMR:
    """Makes an :class:`asyncmr.AsyncManagedMR` RMM's current device resource, turns on
    libcudf's managed-memory prefetching (``libcudf_prefetch``), then ``cudf.pandas.install()``.
    The keyword arguments are the resource's. Returns the resource. Calling it again returns
    the installed resource (a different configuration raises RuntimeError: cudf.pandas is set up
    once per process)."""
    global _installed, _installed_options
    # Checked before cuDF is looked for, so a wrong argument is named wherever this runs: its
    # own option, then all the resource refuses before any CUDA call (the resource's own checks:
    # the prefetch target's device is the driver's to judge).
    if not isinstance(libcudf_prefetch, bool):
        raise TypeError("asyncmr.cudf_pandas.install: libcudf_prefetch must be a bool, got "
                        f"{_validate.type_name(libcudf_prefetch)}")
    _check_managed_options(pool=pool, release_threshold=release_threshold, reserve=reserve,
                           cache=cache, prefetch=prefetch, discard=discard)
    wanted = {"pool": pool, "prefetch": prefetch, "discard": discard,
              "release_threshold": release_threshold, "reserve": reserve, "cache": cache,
              "libcudf_prefetch": libcudf_prefetch}
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

    mr = AsyncManagedMR(pool=pool, prefetch=prefetch, discard=discard,
                        release_threshold=release_threshold, reserve=reserve, cache=cache)
    rmm.mr.set_current_device_resource(mr)
    if libcudf_prefetch:
        pylibcudf.prefetch.enable()
    cudf.pandas.install()
    _installed, _installed_options = mr, wanted
    return mr


#: The runner's own options: (flag, metavar or None for a switch, help). They come before the
#: script; what follows the script is the script's.
OPTIONS = (
    ("--cache", "BYTES", "give the resource a front cache of at most BYTES (the resource's "
                         "cache=; 0: none)"),
    ("--reserve", "BYTES", "grow the pool by BYTES before the script runs (reserve=)"),
    ("--prefetch", "device|host|N", "prefetch every allocation, on its stream, to the "
                                    "resource's device, the host or device N (prefetch=)"),
    ("--discard", None, "with --prefetch: drop an allocation's old contents as it is "
                        "prefetched instead of migrating them (discard=True; CUDA 13 build)"),
)
_USAGE = ("%(prog)s [--cache BYTES] [--reserve BYTES] [--prefetch device|host|N] [--discard] "
          "(SCRIPT | -m MODULE) [ARGS...]")
PROG = "python -m asyncmr cudf-pandas"
USAGE = "usage: " + _USAGE % {"prog": PROG}


def parser():
    """The runner's ``--help`` (and its documentation): ``OPTIONS``, then the script or module.
    The arguments are read by ``_options``, which must leave what follows the script alone."""
    import argparse

    from asyncmr._cli import exit_statuses_epilog

    p = argparse.ArgumentParser(
        prog=PROG, usage=_USAGE,
        description="Runs a Python script or module under cudf.pandas, as `python -m "
                    "cudf.pandas` does, with an AsyncManagedMR (the device's managed pool) as "
                    "RMM's current resource and libcudf's managed-memory prefetching on. The "
                    "options set the resource; they come before the script. Needs a GPU and "
                    "cuDF.",
        epilog=exit_statuses_epilog() + ". Once the script runs, the status is the script's.")
    for flag, metavar, text in OPTIONS:
        if metavar is None:
            p.add_argument(flag, action="store_true", help=text)
        else:
            p.add_argument(flag, metavar=metavar, help=text)
    p.add_argument("-m", metavar="MODULE", dest="module",
                   help="run a module as the script (as `python -m MODULE`)")
    p.add_argument("script", metavar="SCRIPT", nargs="?", help="the script to run")
    p.add_argument("args", metavar="ARGS", nargs="*",
                   help="the script's or module's arguments: everything after SCRIPT or "
                        "MODULE, options of the runner's own included")
    return p


_HELP = ("-h", "--help")


def _number(flag: str, digits: str, bits: int, what: str) -> int:
    """ASCII ``digits`` as an int, judged by how many there are before int() reads them: int()
    refuses more than 4300, in words that name no option."""
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(2**bits)):
        raise ValueError(f"{flag} takes {what} below 2**{bits}, got {len(significant)} digits")
    return int(significant)


def _options(args: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Takes the runner's own options off the front of ``args``: (install's keywords, the rest,
    which starts with the script, ``-m``, or ``-h``/``--help``). Raises ValueError naming the
    option that is wrong, or an unknown one met before the script."""
    options: dict[str, Any] = {}
    takes_value = {flag: metavar is not None for flag, metavar, _ in OPTIONS}
    while args and args[0] in takes_value:
        flag, args = args[0], args[1:]
        if flag[2:] in options:
            raise ValueError(f"{flag} is given twice")
        if not takes_value[flag]:  # --discard
            options["discard"] = True
            continue
        value = args[0] if args else ""
        args = args[1:]
        if flag in ("--cache", "--reserve"):
            if not ascii_digits(value):
                raise ValueError(f"{flag} takes a number of bytes (0 or more), got {value!r}")
            options[flag[2:]] = _number(flag, value, 64, "a number of bytes")
        elif value in ("device", "host"):
            options["prefetch"] = value
        elif ascii_digits(value):
            options["prefetch"] = _number(flag, value, 31, "device, host or a device ordinal")
        else:
            raise ValueError(f"--prefetch takes device, host or a device ordinal, got {value!r}")
    if args and args[0].startswith("-") and args[0] != "-m" and args[0] not in _HELP:
        # A typo or an unsupported spelling (--cache=N) would otherwise be run as the script.
        raise ValueError(f"unknown option {args[0]!r} (the runner's options are "
                         f"{', '.join(flag for flag, _, _ in OPTIONS)}, before the script or "
                         "-m MODULE)")
    if options.get("discard") and "prefetch" not in options:
        raise ValueError("--discard needs --prefetch (it drops the old contents as an "
                         "allocation is prefetched)")
    return options, args


def main(argv: list[str] | None = None) -> int:
    """``python -m asyncmr cudf-pandas [OPTIONS] (script.py | -m module) [ARGS...]``."""
    from asyncmr._cli import EXIT_FAILURE, EXIT_MISSING, EXIT_NO_GPU, EXIT_OK, EXIT_USAGE, reason

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        options, args = _options(args)
    except ValueError as e:
        print(f"asyncmr cudf-pandas: {e}\n{USAGE}", file=sys.stderr)
        return EXIT_USAGE
    if args and args[0] in _HELP:
        parser().print_help()
        return EXIT_OK
    if not args or (args[0] == "-m" and len(args) < 2):
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    if args[0] == "-m":
        target, rest, module = args[1], args[2:], True
    else:
        target, rest, module = args[0], args[1:], False
        # As `python missing.py` says, before anything is set up. (-m's module is not looked
        # for: finding it imports its packages, which may import pandas before cudf.pandas.)
        try:
            os.stat(target)
        except OSError as e:
            print(f"asyncmr cudf-pandas: cannot open file {target!r}: {e.strerror}",
                  file=sys.stderr)
            return EXIT_USAGE
    try:
        # A wrong option first (its fix is the user's on any machine), then no GPU (installing
        # cuDF would not help), then install() looks for cuDF.
        _check_managed_options(**options)
        asyncmr.device_count()
        install(**options)
    except asyncmr.NoDeviceError as e:
        print(f"asyncmr cudf-pandas: no usable CUDA device: {reason(e)}", file=sys.stderr)
        return EXIT_NO_GPU
    except MemoryError as e:  # the pool could not grow (--reserve)
        print(f"asyncmr cudf-pandas: out of memory setting up the pool: {reason(e)}",
              file=sys.stderr)
        return EXIT_FAILURE
    except ImportError as e:  # no cuDF
        print(f"asyncmr cudf-pandas: {reason(e)}", file=sys.stderr)
        return EXIT_MISSING
    except (TypeError, ValueError, asyncmr.UnsupportedError) as e:
        # The resource refused the options (discard on the CUDA 12 build).
        print(f"asyncmr cudf-pandas: {reason(e)}", file=sys.stderr)
        return EXIT_USAGE
    sys.argv = [target, *rest]
    if module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(target, run_name="__main__")
    return EXIT_OK
