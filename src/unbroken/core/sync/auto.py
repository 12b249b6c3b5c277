"""``auto``: re-choosing the mode online as the predicted stragglers change, and the gradient
noise scale it prices by.

``auto`` (:func:`decide`): a group is flagged when it is predicted more than 20 % slower than the
fastest group; the mode is re-decided only when the flagged set changes, and ``sync`` comes back
when none is flagged. Hysteresis against flapping: a flagged group stays flagged until it is
within 10 % of the fastest (a Schmitt trigger), and the flagged set must differ from the one
the mode was chosen for on ``confirm`` consecutive decisions before the mode is re-chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from unbroken.core.sync.cost import _PREFERENCE, CostModel, _times
from unbroken.core.sync.tta import Selection, flag_stragglers, select

__all__ = ["AutoState", "AutoDecision", "Chooser", "decide", "noise_scale_terms", "NoiseScale"]


@dataclass(frozen=True)
class AutoState:
    """What ``auto`` remembers between decisions.

    ``mode``: the mode in force; ``flagged``: the straggler set it was chosen for; ``seen``:
    on how many consecutive decisions so far a flagged set different from it was predicted
    (``pending``: the latest such set)."""

    mode: str = "sync"
    flagged: tuple[int, ...] = ()
    pending: tuple[int, ...] | None = None
    seen: int = 0


@dataclass(frozen=True)
class AutoDecision:
    """``auto``'s answer: the mode for the next steps, the reason (the journal line), the new
    state, whether the mode changed, and the heuristic's selection when it ran."""

    mode: str
    reason: str
    state: AutoState
    switched: bool
    selection: Selection | None = None


#: what chooses the mode once the straggler set changed: :func:`select` (the heuristic) or
#: anything with its signature (``unbroken.sync.selector.MLSelector.chooser``: STAR's ML
#: selector); called as ``choose(times, cm, flagged, allowed, greedy_mask)``
Chooser = Callable[[np.ndarray, CostModel, Sequence[int], Sequence[str], bool], Selection]


def decide(state: AutoState, times: Sequence[float] | np.ndarray, cm: CostModel,
           confirm: int = 2, allowed: Sequence[str] = _PREFERENCE,
           greedy_mask: bool = False, choose: Chooser | None = None) -> AutoDecision:
    """One ``auto`` decision from the predicted per-group step times.

    ``times``: (N,) predicted step time per group, or (H, N) predictions for the next H steps
    (their mean per group is used). The flagged set is re-derived with hysteresis
    (:func:`flag_stragglers`); when it has differed from the state's on ``confirm``
    consecutive calls (not necessarily the same set each time: churning stragglers still get
    a decision), the mode is re-chosen for the latest set: ``sync`` when nothing is flagged,
    else :func:`select`'s choice. Otherwise the mode in force stays. Call it as often as
    predictions arrive; ``confirm`` counts calls, so at a call per 30-step window (the
    planner) 1 is enough. ``allowed``: the modes :func:`select` may choose; ``greedy_mask``:
    see :func:`estimates`; ``choose``: what picks the mode (default :func:`select`): the
    hysteresis and the return to ``sync`` are the same whoever chooses.
    """
    t = _times(times)
    mean = t.mean(axis=0) if t.ndim == 2 else t
    flagged = flag_stragglers(mean, cm.straggler_ratio, state.flagged)
    if flagged == state.flagged:
        return AutoDecision(state.mode, f"{state.mode}: straggler set "
                            f"{list(flagged) or 'empty'} unchanged", replace(
                                state, pending=None, seen=0), False)
    seen = state.seen + 1
    if seen < confirm:
        return AutoDecision(state.mode, f"{state.mode}: stragglers {list(flagged) or 'none'} "
                            f"differ from {list(state.flagged) or 'none'} on {seen}/{confirm} "
                            f"predictions, waiting", replace(state, pending=flagged, seen=seen),
                            False)
    if not flagged:
        new = AutoState("sync", ())
        return AutoDecision("sync", "sync: no straggler predicted any more", new,
                            state.mode != "sync")
    sel = (choose or select)(mean, cm, flagged, allowed, greedy_mask)
    new = AutoState(sel.mode, flagged)
    return AutoDecision(sel.mode, f"stragglers {list(flagged)}: {sel.reason}", new,
                        sel.mode != state.mode, sel)


def noise_scale_terms(small_sq: float, b_small: float, big_sq: float,
                      b_big: float) -> tuple[float, float]:
    """Unbiased estimates of |G|^2 and tr(Sigma) from two gradient norms (McCandlish et al.
    2018, appendix A). ``small_sq``: |g|^2 of a gradient averaged over ``b_small`` samples
    (one group's shard; average several groups' values for less variance); ``big_sq``: |g|^2
    of the reduced gradient over ``b_big`` samples. Gradients are means over their samples,
    so E|g_B|^2 = |G|^2 + tr(Sigma) / B. Returns (|G|^2, tr(Sigma)); either may be negative on
    one step (they are unbiased, not positive): average before dividing."""
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got {b_small} and {b_big}")
    g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    s = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return float(g2), float(s)


@dataclass
class NoiseScale:
    """phi = tr(Sigma) / |G|^2, with an exponential moving average of the numerator and of the
    denominator separately (the ratio of two noisy unbiased estimates is biased and can blow
    up when |G|^2 is near 0 on one step; the ratio of their averages converges).

    ``update(small_sq, b_small, big_sq, b_big)``: ``small_sq`` one group's |g_small|^2 or a
    sequence of every group's (averaged). ``phi`` is None until the first update, and while the
    averaged |G|^2 is not positive."""

    beta: float = 0.95
    g2: float = field(default=0.0, init=False)
    s: float = field(default=0.0, init=False)
    n: int = field(default=0, init=False)

    def update(self, small_sq: float | Sequence[float], b_small: float, big_sq: float,
               b_big: float) -> float | None:
        small = float(np.mean(np.asarray(small_sq, dtype=float)))
        g2, s = noise_scale_terms(small, b_small, big_sq, b_big)
        self.n += 1
        # bias-corrected EMA (Adam-style), so early values are not pulled towards 0
        self.g2 = self.beta * self.g2 + (1 - self.beta) * g2
        self.s = self.beta * self.s + (1 - self.beta) * s
        return self.phi

    @property
    def phi(self) -> float | None:
        if self.n == 0:
            return None
        corr = 1 - self.beta ** self.n
        g2, s = self.g2 / corr, self.s / corr
        return s / g2 if g2 > 0 else None
