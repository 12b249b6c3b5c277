"""Parsing of human durations ("5m", "60s", "1h", "300") into seconds.

Kept pure and strict: a planner that silently read "5" as five hours would be worse than one
that refuses it, so anything but a positive finite number with an optional s/m/h/d suffix is
rejected with a message that names the value.
"""

from __future__ import annotations

import math
import re

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(s|m|min|h|d)?\s*$")


def parse_duration(text: str, *, allow_zero: bool = False) -> float:
    """Seconds in ``text``; raises ValueError naming the text when it is not a duration."""
    m = _RE.match(str(text))
    if not m:
        raise ValueError(f"malformed duration {text!r} (use e.g. 300, 60s, 5m, 1h)")
    value = float(m.group(1)) * _UNITS[m.group(2) or ""]
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"duration {text!r} must be positive")
    return value


def format_duration(seconds: float) -> str:
    """Compact human form: 300 -> '5m', 3600 -> '1h', 61 -> '61s'."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and abs(seconds / size - round(seconds / size)) < 1e-9:
            return f"{round(seconds / size)}{unit}"
    return f"{seconds:g}s"
