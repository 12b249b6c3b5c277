"""What every face's command line shares: the parser, the argument types, the usage error.

``unbroken.cli`` and the faces' CLI modules (``sim.cli``, ``learn.cli``, ``sync.cli``) build
their commands' flags with these types; a UsageError is bad input found after parsing, which
``unbroken.cli`` turns into exit 2. Kept to the standard library and ``core.units`` so that
building the whole parser (``unbroken --help``) stays cheap.

A bad value is one line naming it (``expected a positive integer, got 'x'``), exit 2.
"""

from __future__ import annotations

import argparse
import sys

from unbroken.core.units import parse_duration
from unbroken.protocol import ExitCode

__all__ = ["UsageError", "Parser", "number", "integer", "positive_int",
           "nonneg_int", "nonneg_float", "fraction", "positive_float", "finite_float",
           "duration", "duration0"]


class UsageError(Exception):
    """Bad input found after parsing (a conflict, a value out of range)."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        sys.stderr.write(f"unbroken: error: {message}\n")
        sys.exit(ExitCode.USAGE)


def number(cast, ok, want: str):
    """An argparse type: ``cast`` the text, accept it when ``ok``, else name it and ``want``."""
    def convert(text: str):
        try:
            v = cast(text)
        except ValueError:
            v = None
        if v is None or not ok(v):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return v
    return convert


integer = number(int, lambda v: True, "an integer")
positive_int = number(int, lambda v: v >= 1, "a positive integer")
nonneg_int = number(int, lambda v: v >= 0, "an integer >= 0")
nonneg_float = number(float, lambda v: 0 <= v < float("inf"), "a number >= 0")
fraction = number(float, lambda v: 0 <= v < 1, "a number in [0, 1)")
positive_float = number(float, lambda v: 0 < v < float("inf"), "a positive number")
finite_float = number(float, lambda v: abs(v) < float("inf"), "a finite number")


def duration(text: str) -> float:
    """``300``, ``60s``, ``5m``, ``1h`` as seconds, positive (``core.units``)."""
    return _duration(text, allow_zero=False)


def duration0(text: str) -> float:
    """A duration that may be zero (a free restart, an instant save)."""
    return _duration(text, allow_zero=True)


def _duration(text: str, allow_zero: bool) -> float:
    try:
        return parse_duration(text, allow_zero=allow_zero)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
