# SPDX-License-Identifier: Apache-2.0
"""What the command line's parsers share (``python -m asyncmr`` and ``plot``): kept out of
``asyncmr/__main__.py``, which the library must not import, and out of ``import asyncmr``."""

from __future__ import annotations

import argparse


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
