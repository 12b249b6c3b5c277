"""Fitting the change detector's thresholds on *other* clusters, to a false-alarm budget.

Why out of sample: a threshold calibrated on the cluster it then scores has seen that
cluster's noise and its precursors; its false-alarm rate is the budget by construction and
says nothing about the next cluster. ``learn fit`` generates (or reads) clusters whose failures
are known, and this module picks the detector's few numbers on them; ``learn --detector FILE``
then scores a cluster the fit never saw.

What is fitted, and how little: per signal, the threshold ``h`` is the ``1 - level`` quantile
of that signal's evidence (``core.changepoint``'s CUSUM, per node) over the fitting clusters'
*healthy* node-time (every failing node masked from an hour before its precursor to two hours
after its XID) — so every signal is allowed the same rate of healthy exceedances, whatever
its units, noise or shape — floored at ``min_h_scrapes`` full-strength scrapes. Then one grid
over (k, cap) x level x stretch x pair: each setting's alerts are scored against the fitting clusters'
failures (``core.precursors.score``) — two-fold: thresholds taken from half the clusters,
scored on the other half, and back, because on the clusters its quantiles came from a
threshold sits above the healthy tail by construction — and the setting kept is the one with
the most failures warned before their XID, then the most detected, then the fewest false
alarms, among those whose mean false alarms per day stay within ``margin`` x the budget (the
margin is the room left for a cluster noisier than the fitting ones). The thresholds written
are then the quantiles over all the fitting clusters. Five numbers fitted on many
clusters cannot learn one family's shape; the held-out bench checks that they did not.

Pure: arrays in, a policy and plain rows out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from unbroken.core.changepoint import ChangePolicy, combine_pairs
from unbroken.core.precursors import Failure, score

__all__ = ["FitCase", "FitRow", "thresholds_at", "fit_detector", "LEVELS", "STRETCH", "PAIRS"]

LEVELS = (1e-4, 3e-5, 1e-5, 3e-6, 0.0)
STRETCH = (1.0, 1.3, 1.7)      # beyond the healthy maximum (level 0) when even it is noisy
PAIRS = (0.5, 0.7, 1.0)


@dataclass
class FitCase:
    """One fitting cluster under one (k, cap): per-signal node evidence and its truth."""
    evidence: dict[str, np.ndarray]      # signal -> (N, T) CUSUM of the node's worst unit
    t: np.ndarray                        # (T,) scrape times
    failures: list[Failure]
    null: np.ndarray                     # (N, T) bool: healthy node-time
    early_possible: int = 0              # failures whose precursor starts > 5 min ahead


@dataclass(frozen=True)
class FitRow:
    k: float
    cap: float
    level: float
    stretch: float
    pair: float
    fa_per_day_mean: float
    fa_per_day_max: float
    early: int
    detected: int
    failures: int
    early_possible: int


def thresholds_at(cases: Sequence[FitCase], level: float, min_h: float) -> dict[str, float]:
    """Per signal: the 1 - level quantile of its healthy evidence over all cases, >= min_h."""
    names = sorted({s for c in cases for s in c.evidence})
    out = {}
    for s in names:
        vals = np.concatenate([c.evidence[s][c.null].astype(np.float64).ravel()
                               for c in cases if s in c.evidence])
        q = float(np.quantile(vals, 1.0 - level)) if len(vals) else 0.0
        # a hair above the quantile: the largest healthy values come in ties (a saturated
        # burst), and evidence kept at lower precision must not sit a rounding above them
        out[s] = max(q * (1 + 1e-3) + 1e-6, min_h)
    return out


def _folds(n: int) -> list[tuple[list[int], list[int]]]:
    """Two halves (even and odd clusters), each fitted on the other; one cluster: itself."""
    if n < 2:
        return [(list(range(n)), list(range(n)))]
    a, b = list(range(0, n, 2)), list(range(1, n, 2))
    return [(b, a), (a, b)]


def fit_detector(cases: Mapping[tuple[float, float], Sequence[FitCase]],
                 family_of: Mapping[str, str], budget_per_day: float,
                 base: ChangePolicy = ChangePolicy(), levels: Sequence[float] = LEVELS,
                 pairs: Sequence[float] = PAIRS, margin: float = 0.8,
                 min_h_scrapes: float = 3.0, stretches: Sequence[float] = STRETCH) -> tuple[ChangePolicy, list[FitRow], str]:
    """The best setting over ``cases`` (keyed by (k, cap)); see the module docstring.
    Returns the policy (its thresholds filled), every row of the grid, and a reason line."""
    if not budget_per_day >= 0:
        raise ValueError(f"false-alarm budget {budget_per_day}: expected >= 0 per day")
    if not cases or not any(cases.values()):
        raise ValueError("no fitting clusters")
    rows: list[FitRow] = []
    pols: list[ChangePolicy] = []
    for (k, cap), cs in sorted(cases.items()):
        folds = _folds(len(cs))
        for level in levels:
            # thresholds from one half of the clusters, scored on the other half (and back):
            # scored on the clusters they were taken from, the healthy tail would be below
            # the threshold by construction and the false alarms zero
            th_fold0 = [thresholds_at([cs[i] for i in fit_i], level, min_h_scrapes * (cap - k))
                        for fit_i, _ in folds]
            th_all0 = thresholds_at(cs, level, min_h_scrapes * (cap - k))
            for m in stretches:
                th_fold = [{s: h * m for s, h in th.items()} for th in th_fold0]
                th_all = {s: h * m for s, h in th_all0.items()}
                # every pair scored on one combine of each cluster (what a pair does not
                # change is most of the work): per pair, each scored cluster's false alarms
                # a day and the sums of early, detected, failures, early possible
                fas: list[list[float]] = [[] for _ in pairs]
                sums = [[0, 0, 0, 0] for _ in pairs]
                for (_, score_i), th in zip(folds, th_fold):
                    # every pair's policy is checked; the shared pass takes the first
                    pol = [replace(base, k=k, cap=cap, pair=p, thresholds=th).check()
                           for p in pairs][0]
                    for i in score_i:
                        c = cs[i]
                        dets = combine_pairs(c.evidence, family_of, pol, tuple(pairs))
                        for j, d in enumerate(dets):
                            sc = score(d, c.t, c.failures)
                            fas[j].append(sc.false_alarms_per_day)
                            for n, x in enumerate((sc.before_xid, sc.n_detected,
                                                   len(c.failures), c.early_possible)):
                                sums[j][n] += x
                for pair, fa, (early, det, nf, poss) in zip(pairs, fas, sums):
                    rows.append(FitRow(k, cap, level, m, pair, float(np.mean(fa)),
                                       float(np.max(fa)), early, det, nf, poss))
                    pols.append(replace(base, k=k, cap=cap, pair=pair,
                                        thresholds=th_all).check())
    cap_fa = budget_per_day * margin
    ok = [i for i, r in enumerate(rows) if r.fa_per_day_mean <= cap_fa]
    if ok:
        i = max(ok, key=lambda i: (rows[i].early, rows[i].detected, -rows[i].fa_per_day_mean,
                                   -rows[i].level, -rows[i].stretch))
        r = rows[i]
        why = (f"k {r.k:g}, cap {r.cap:g}, level {r.level:g} x {r.stretch:g}, pair {r.pair:g}: "
               f"{r.early}/{r.early_possible} early precursors warned before the XID, "
               f"{r.detected}/{r.failures} failures detected, {r.fa_per_day_mean:.2f} "
               f"false alarms/day (max {r.fa_per_day_max:.2f}) on {len(cases[(r.k, r.cap)])} "
               f"fitting clusters, two-fold (budget {budget_per_day:g} x margin {margin:g})")
    else:
        i = min(range(len(rows)), key=lambda i: (rows[i].fa_per_day_mean, -rows[i].early))
        r = rows[i]
        why = (f"no setting meets {budget_per_day:g} x {margin:g} false alarms/day on the "
               f"fitting clusters; quietest: k {r.k:g}, cap {r.cap:g}, level {r.level:g} x "
               f"{r.stretch:g}, pair {r.pair:g} at {r.fa_per_day_mean:.2f}/day")
    return pols[i], rows, why
