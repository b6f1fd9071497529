# SPDX-License-Identifier: Apache-2.0
"""What the command line's parsers share (``python -m asyncmr`` and its subcommands): kept out
of ``asyncmr/__main__.py``, which the library must not import, and out of ``import asyncmr``."""

from __future__ import annotations

import argparse

#: Exit statuses, one per cause, the same for every subcommand (``cudf-pandas`` passes the
#: script's own status through once the script runs).
EXIT_OK = 0
EXIT_FAILURE = 1        # the command ran and failed (a wrong result, a file not written)
EXIT_USAGE = 2          # bad arguments: argparse's own status
EXIT_NO_GPU = 3         # no usable CUDA device or driver
EXIT_MISSING = 4        # a package the command needs is not installed

EXIT_STATUSES = (
    (EXIT_OK, "success"),
    (EXIT_FAILURE, "the command ran and failed (a wrong result, a file not written, a "
                   "benchmark section that raised)"),
    (EXIT_USAGE, "bad arguments (an unknown option, a bad value, a missing file)"),
    (EXIT_NO_GPU, "no usable CUDA device or driver"),
    (EXIT_MISSING, "a package the command needs is not installed (CuPy, cuDF, matplotlib, "
                   "or the benchmark outside a source checkout)"),
)


def exit_statuses_epilog() -> str:
    """The exit statuses as a help epilog."""
    return "exit status: " + "; ".join(f"{code} {what}" for code, what in EXIT_STATUSES)


def reason(error: BaseException) -> str:
    """An exception's message without asyncmr's own "asyncmr: " prefix, for a line that
    already names the command."""
    return str(error).removeprefix("asyncmr: ")


class OnceAction(argparse.Action):
    """Stores an option's value as argparse's default action does, but refuses the option given
    again (argparse would keep the last value without a word)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = vars(namespace).setdefault("_given_once", {})
        if self.dest in given:
            raise argparse.ArgumentError(
                self, f"given twice (first {given[self.dest]!r}, then {values!r})")
        given[self.dest] = values
        setattr(namespace, self.dest, values)


def plot_parser() -> argparse.ArgumentParser:
    """``python -m asyncmr plot`` (run by ``asyncmr.history.main``)."""
    p = argparse.ArgumentParser(prog="python -m asyncmr plot", description=(
        "Draws a saved allocation history: the pool's reserved and used bytes and the front "
        "cache's bytes over time, with the phases; one lane per worker. Needs matplotlib."),
        epilog=exit_statuses_epilog())
    p.add_argument("history", metavar="HISTORY",
                   help="a file written by History.save or asyncmr.history.save_many")
    p.add_argument("-o", "--output", default="timeline.png", action=OnceAction,
                   help="the PNG to write (default: timeline.png)")
    p.add_argument("--title", default=None, action=OnceAction, help="the figure's title")
    return p
