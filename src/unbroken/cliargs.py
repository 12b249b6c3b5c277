"""What every face's command line shares: the parser, the argument types, the two errors.

Each face's CLI module (``sim.cli``, ``supervise.cli``, ``learn.cli``, ``sync.cli``) builds its
commands' flags with these types and raises these errors; ``unbroken.cli`` turns them into the
documented exit codes. Kept to the standard library and ``core.units`` so that building the
whole parser (``unbroken --help``) stays cheap.

A bad value is one line naming it (``expected a positive integer, got 'x'``), exit 2.
"""

from __future__ import annotations

import argparse
import sys

from unbroken.core.units import parse_duration
from unbroken.protocol import ExitCode

__all__ = ["UsageError", "Stopped", "Parser", "number", "integer", "positive_int",
           "nonneg_int", "nonneg_float", "fraction", "positive_float", "finite_float",
           "duration", "duration0"]


class UsageError(Exception):
    """Bad input found after parsing (a conflict, a value out of range)."""


class Stopped(Exception):
    """The run ended on purpose with a documented exit code (protocol.ExitCode)."""

    def __init__(self, message: str | None, code: int, report: dict | None) -> None:
        super().__init__(message or f"exit {code}")
        self.code, self.report = code, report


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
