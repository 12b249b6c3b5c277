"""The side-effect half of straggler traces (:mod:`unbroken.core.stragglers` is the pure half):
reading a trace's CSV file, and a worker's own per-step factors.

The spec string travels to every worker in ``TrainConfig.stragglers`` (a CSV as an absolute
path); each worker computes its own factors from (spec, groups, steps, seed), so nothing is
exchanged and a spare started late gets the same numbers.
"""

from __future__ import annotations

import os

from unbroken.core.stragglers import StragglerSpecError, Trace, is_pattern, parse_stragglers

__all__ = ["load_trace", "normalize_spec", "own_slowdowns"]


def load_trace(spec: str, groups: int) -> Trace:
    """The parsed trace; a CSV file is read here. StragglerSpecError (one line) on bad input."""
    if is_pattern(spec) or not os.path.isfile(spec):
        if ":" not in spec and spec.strip() != "none":
            raise StragglerSpecError(f"--stragglers {spec!r}: no such file (expected "
                                     f"persistent:G@F, bursty:SEED, rotating:P[@F], 'none' or "
                                     f"a CSV file of step,group,slowdown rows)")
        return parse_stragglers(spec, groups)
    try:
        with open(spec, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise StragglerSpecError(f"--stragglers {spec!r}: cannot be read ({e})") from None
    return parse_stragglers(spec, groups, csv_text=text)


def normalize_spec(spec: str | None) -> str | None:
    """What goes into the workers' config: None for no trace (``none`` included, so a
    straggler-free run's config is today's), a CSV file as an absolute path (the workers'
    working directory need not be ours)."""
    if spec is None or spec.strip() == "none":
        return None
    if not is_pattern(spec) and os.path.isfile(spec):
        return os.path.abspath(spec)
    return spec.strip()


def own_slowdowns(spec: str | None, uid: int, groups: int, steps: int,
                  seed: int) -> list[float] | None:
    """This process's factor per step, or None when it never runs slower (no trace, a spare,
    a group the trace leaves alone): the runtime then adds nothing to its step."""
    if spec is None:
        return None
    col = load_trace(spec, groups).column(uid, steps, seed)
    return col if any(f > 1.0 for f in col) else None
