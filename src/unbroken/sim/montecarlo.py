"""The theory's Monte-Carlo over the real controller, run against a wall-clock budget.

``core.theory.controller_walk`` is pure and yields one event per failure; this module owns the
clock. At N = 100,000 a single trial to wipe-out is ~64,000 failures, so the caller sets how
long the excess over the depth bound may be measured, sees progress while it runs, and gets a
result that says how far it got (trials finished, failures seen) instead of no answer.
"""

from __future__ import annotations

import time
from typing import Callable

from unbroken.core import theory


def controller_mc(groups: int, redundancy: int, trials: int, seed: int = 0,
                  budget_s: float | None = None,
                  on_progress: Callable[[int, int], None] | None = None) -> theory.ControllerMC:
    """``theory.controller_montecarlo`` within ``budget_s``; ``on_progress(trial, k)`` about
    every 0.2 s. Cut short, the result has ``complete=False`` and averages what it saw."""
    acc = theory.MCSums(groups, redundancy)
    deadline = None if budget_s is None else time.monotonic() + budget_s
    next_report = time.monotonic() + 0.2
    for event in theory.controller_walk(groups, redundancy, trials, seed):
        acc.add(*event)
        now = time.monotonic()          # ~50 ns against >= 10 us per event: check every one
        if deadline is not None and now >= deadline:
            break
        if on_progress is not None and now >= next_report:
            on_progress(event[0], event[1])
            next_report = now + 0.2
    return acc.result()
