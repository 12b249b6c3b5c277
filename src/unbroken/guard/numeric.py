"""The committed loss and gradient norm: a NaN/Inf or a more than 5x jump is an implicit
failure (``core.anomaly.numeric_event``).

The step is committed already when the guard reads it; the runtime's in-band check is what
stops a non-finite sum before the commit. This is the guard's second look, over a window.
Gradient norms swing by 10-30x in the first tens of steps of a healthy run (the demo's GPT
under AdamW: 61 at step 10, 6x its recent median at step 33), so their jump check waits for
50 committed steps and compares with the median of the last 50 (our choice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from unbroken.core.anomaly import NumericPolicy, numeric_event

__all__ = ["NumericWatch", "NumericFinding", "POLICIES"]

POLICIES = {"loss": NumericPolicy(), "grad_norm": NumericPolicy(window=50, min_history=50)}


@dataclass(frozen=True)
class NumericFinding:
    signal: str   # "loss" or "grad_norm"
    kind: str     # what core.anomaly found: "nan", "inf", "jump"
    value: float
    reason: str


class NumericWatch:
    """Each signal's recent finite values: a non-finite one is an event of its own and never
    part of a median, so only the last window is handed over (handing four windows with the
    non-finite entries in them had ``numeric_event`` check 100-200 values a commit)."""

    def __init__(self) -> None:
        self.history: dict[str, list[float]] = {s: [] for s in POLICIES}

    def observe(self, ev: dict) -> list[NumericFinding]:
        """The findings of one step's commit (one per signal at most)."""
        out = []
        for signal, policy in POLICIES.items():
            if signal not in ev:
                continue
            value = float(ev[signal])
            hist = self.history[signal]
            found, reason = numeric_event(hist[-policy.window:], value, policy)
            if math.isfinite(value):
                hist.append(value)
            if len(hist) > 2 * policy.window:  # the whole history made a long run O(steps)
                del hist[:-policy.window]      # per commit
            if found is not None:
                out.append(NumericFinding(signal, found.kind, value, reason))
        return out
