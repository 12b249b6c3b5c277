"""Time to accuracy of every mode and the selection among them.

The TTA model
-------------
TTA(mode) = update gap x iters(batch per update) x staleness factor, reported per *sync-
equivalent step* (divided by iters(N B)), so sync's TTA is simply its step time, max_i t_i.

* iters(B) = 1 + phi / B (McCandlish et al. 2018; STAR's statistical efficiency), phi the
  gradient noise scale in samples, B the samples behind one update.
* Update gap: ``sync`` max t; ``async`` 1 / sum(1/t); ``ksync:K`` STAR's 1,000-update
  Monte-Carlo (the closed forms at K = N and K = 1); ``groups`` 1 / sum over clusters of
  1 / (slowest member of the cluster).
* Staleness (our model; STAR has none): an update built on parameters tau updates old is worth
  1 / (1 + lambda tau) of a fresh one, so TTA is multiplied by (1 + lambda mean tau), lambda =
  ``CostModel.staleness_cost`` (0.1 by default: an update 10 versions old is worth half). Mean
  tau is N - 1 for async (exact: between a worker's read and write the others make
  sum_{j != i} t_i / t_j updates; weighted by update rate that averages to N - 1), C - 1 for
  C asynchronous clusters, and measured in the Monte-Carlo for ksync.
* ``ksync`` as the runtime runs it (``CostModel.ksync_defers``; :func:`ksync_defer_estimate`):
  the late groups' samples are deferred and caught up by the fast groups on fresh parameters,
  so nothing is stale; the step costs (N / K) x the fast groups' compute, and the statistical
  cost is that of the updates' varying batch (K B, or more on a catch-up step).
* ``mask`` (SPARe's redundancy turned on stragglers, not in STAR): the flagged groups leave the
  step like failed ones, ``core.rectlr.decide`` gives the surviving hosts their types, and the
  step costs max over survivors of (types it computes x its per-type compute) + the all-reduce.
  The gradient is exactly the synchronous one, so iters = iters(N B) and no staleness.
* Groups sharing CPU cores (``CostModel.cores``; 0, a device per group, is STAR's setting):
  P groups computing at once each run at 1 / max(1, P / C) of a core, so every mode is priced
  at the contention it leaves, on per-group times measured as if alone
  (:func:`uncontended`). A mode that idles groups then speeds up the others: on 2 cores
  ``ksync:2`` of 4 groups costs what ``sync`` does without a straggler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from unbroken.core import placement, rectlr
from unbroken.core.sync.cost import _PREFERENCE, CostModel, _times, parse_mode
from unbroken.core.sync.gap import cluster_times, ksync_gap, star_k_scan

__all__ = ["ModeEstimate", "Selection", "ksync_defer_estimate", "flag_stragglers", "estimates",
           "select", "tta_of"]


@dataclass(frozen=True)
class ModeEstimate:
    """One mode's predicted cost.

    ``tta`` is seconds per sync-equivalent step (inf when the mode cannot run); ``gap`` the
    time between updates; ``batch`` samples per update; ``staleness`` the mean staleness in
    updates; ``note`` what the estimate rests on (clusters, dropped groups, why unavailable)."""

    mode: str
    tta: float
    gap: float
    batch: float
    staleness: float
    note: str = ""
    left_out: tuple[int, ...] = ()   # mask only: the groups it leaves out


@dataclass(frozen=True)
class Selection:
    """The heuristic's answer: the chosen mode, every mode's estimate and a one-line reason."""

    mode: str
    estimates: dict[str, ModeEstimate]
    reason: str

    def tta(self) -> dict[str, float]:
        return {m: e.tta for m, e in self.estimates.items()}


def _mask_estimate(t: np.ndarray, flagged: Sequence[int], cm: CostModel) -> ModeEstimate:
    n = t.size
    if not flagged:
        s = float(cm.stretch(t.max(), n))
        return ModeEstimate("mask", s, s, n * cm.shard_batch, 0.0,
                            "no straggler to leave out: the sync step")
    if cm.redundancy < 2:
        return ModeEstimate("mask", math.inf, math.inf, n * cm.shard_batch, 0.0,
                            "needs redundancy >= 2")
    try:
        layout = placement.make_layout(n, cm.redundancy)
    except placement.PlacementError as e:
        return ModeEstimate("mask", math.inf, math.inf, n * cm.shard_batch, 0.0, str(e))
    live = np.ones(n, dtype=bool)
    live[list(flagged)] = False
    d = rectlr.decide(layout, live, rectlr.initial_stacks(layout), 1)
    if isinstance(d, rectlr.WipeOut):
        return ModeEstimate("mask", math.inf, math.inf, n * cm.shard_batch, 0.0,
                            f"leaving out {len(flagged)} group(s) is a {d.reason}")
    compute = np.maximum(t - cm.comm_s, 0.0)
    depth = {w: len(ts) for w, ts in d.contributions().items()}
    # the survivors compute at once (the left-out groups' probes are rare: not priced)
    gap = max(depth[w] * compute[w] for w in depth) * cm.contention(len(depth)) + cm.comm_s
    deepest = max(depth.values())
    return ModeEstimate("mask", gap, gap, n * cm.shard_batch, 0.0,
                        f"leaves out {sorted(int(g) for g in flagged)}, survivors' stacks up to "
                        f"{deepest} deep ({d.phase})")


def ksync_defer_estimate(times: Sequence[float], k: int, cm: CostModel) -> ModeEstimate:
    """``ksync:K`` as the runtime runs it (:func:`ksync_step`): the N - K groups predicted
    slowest defer their shards and the K fastest catch them up, m = ceil((N - K) / K) more
    each on a share f = (N - K) / (m K) of the steps.

    * Time: the fast groups compute all N shards between them, so a step costs on average
      comm + (N / K) x the slowest fast group's compute, whatever the late groups do.
    * Statistics: nothing is stale (a deferred shard is computed on the parameters of the
      step that uses it), but the updates' batches vary: K B on most steps, (K + m K) B on a
      catch-up step. An update of batch B makes 1 / iters(B) of a unit of progress, so the
      run needs iters_eff = 1 / mean(1 / iters(B)) updates per unit, against sync's
      iters(N B): the cost of deferral. It vanishes at both ends (noise scale 0: every update
      counts fully; noise-dominated: progress per sample is what counts, and the samples are
      the same) and is a few per cent in between.

    TTA per sync-equivalent step = average gap x iters_eff / iters(N B)."""
    t = _times(times)
    n, b = t.size, cm.shard_batch
    if not 1 <= k <= n:
        raise ValueError(f"k {k} outside [1, {n}]")
    if k == n:
        s = float(cm.stretch(t.max(), n))
        return ModeEstimate(f"ksync:{k}", s, s, n * b, 0.0, "K = N: the sync step")
    fast = np.sort(t)[:k]
    compute = float(max(fast.max() - cm.comm_s, 0.0))
    m = -(-(n - k) // k)
    f = (n - k) / (m * k)
    gap = cm.comm_s + compute * n / k * cm.contention(k)
    iters = 1.0 / ((1 - f) / cm.iters(k * b) + f / cm.iters((k + m * k) * b))
    return ModeEstimate(f"ksync:{k}", gap * iters / cm.iters(n * b), gap, n * b, 0.0,
                        f"defers the {n - k} slowest, the {k} fastest catch up "
                        f"{n / k:.2g} shards a step; deferral x{iters / cm.iters(n * b):.3f}")


def _mask_greedy(t: np.ndarray, flagged: Sequence[int], cm: CostModel) -> ModeEstimate:
    """``mask`` leaving out the best subset of ``flagged``: slowest first, a group is added
    while leaving it out too lowers the predicted step by ``cm.min_gain`` and RECTLR can give
    its types to other hosts. The estimate's ``left_out`` is the subset (empty: the sync
    step)."""
    s = float(cm.stretch(t.max(), t.size))
    best = ModeEstimate("mask", s, s, t.size * cm.shard_batch, 0.0,
                        "leaving no straggler out is soonest: the sync step")
    out: tuple[int, ...] = ()
    for g in sorted(flagged, key=lambda i: (-t[i], i)):
        est = _mask_estimate(t, out + (g,), cm)
        if math.isfinite(est.tta) and est.tta < best.tta * (1 - cm.min_gain):
            out = tuple(sorted(out + (g,)))
            best = replace(est, left_out=out)
    return best


def flag_stragglers(times: Sequence[float], ratio: float = 1.2,
                    already: Sequence[int] = (), release: float | None = None) -> tuple[int, ...]:
    """Groups predicted more than ``ratio`` x slower than the fastest. A group in ``already``
    stays flagged until it is within ``release`` x the fastest (default: half the margin,
    1.1 for 1.2): the Schmitt trigger of :func:`decide`."""
    t = _times(times)
    fast = float(t.min())
    rel = 1 + (ratio - 1) / 2 if release is None else release
    prev = set(int(g) for g in already)
    return tuple(int(i) for i in range(t.size)
                 if t[i] > ratio * fast or (i in prev and t[i] > rel * fast))


def estimates(times: Sequence[float], cm: CostModel,
              flagged: Sequence[int] | None = None,
              greedy_mask: bool = False) -> dict[str, ModeEstimate]:
    """Every mode's estimate for per-group predicted step times ``times`` (one per group).
    ``flagged``: the groups mask leaves out (default: those over the straggler ratio), or
    with ``greedy_mask`` the candidates of which it leaves out the best subset (the runtime:
    a group flagged by noise must not make mask look impossible)."""
    t = _times(times)
    if t.ndim != 1:
        raise ValueError("estimates take one predicted time per group")
    n, b = t.size, cm.shard_batch
    lam = cm.staleness_cost
    ref = cm.iters(n * b)
    if flagged is None:
        flagged = flag_stragglers(t, cm.straggler_ratio)
    ts = cm.stretch(t, n)  # sync, groups and async keep every group computing
    out = {"sync": ModeEstimate("sync", float(ts.max()), float(ts.max()), n * b, 0.0)}
    if greedy_mask:
        out["mask"] = _mask_greedy(t, flagged, cm)
    else:
        m = _mask_estimate(t, flagged, cm)
        out["mask"] = replace(m, left_out=tuple(flagged) if math.isfinite(m.tta) else ())
    if cm.ksync_defers:
        out["ksync"] = min((ksync_defer_estimate(t, k, cm) for k in range(1, n)),
                           key=lambda e: e.tta, default=out["sync"])
    else:
        k, _ = star_k_scan(t, cm)
        g = ksync_gap(ts, k, cm.mc_updates, cm.seed)
        tta_k = g.gap * cm.iters(k * b) / ref * (1 + lam * g.staleness)
        out["ksync"] = ModeEstimate(f"ksync:{k}", tta_k, g.gap, k * b, g.staleness,
                                    "k from STAR's scan")
    clusters = cluster_times(t, cm.cluster_fraction)
    slowest = [float(ts[m].max()) for m in clusters]
    rate = sum(1.0 / (cm.iters(len(m) * b) * s) for m, s in zip(clusters, slowest))
    gap_groups = 1.0 / sum(1.0 / s for s in slowest)
    out["groups"] = ModeEstimate(
        "groups", (1.0 / rate) / ref * (1 + lam * (len(clusters) - 1)), gap_groups,
        n * b / len(clusters), float(len(clusters) - 1),
        f"{len(clusters)} cluster(s) of sizes {[len(c) for c in clusters]}")
    t_async = float(1.0 / np.sum(1.0 / ts))
    out["async"] = ModeEstimate("async", t_async * cm.iters(b) / ref * (1 + lam * (n - 1)),
                                t_async, b, float(n - 1))
    return out


def select(times: Sequence[float], cm: CostModel,
           flagged: Sequence[int] | None = None,
           allowed: Sequence[str] = _PREFERENCE, greedy_mask: bool = False) -> Selection:
    """The heuristic: ``sync`` when no group is flagged (``flagged``, default: over the
    straggler ratio); else the mode with the lowest predicted TTA, where a mode other than sync
    must beat sync by ``cm.min_gain`` and ties go to the more synchronous mode. ``allowed``:
    the modes that may be chosen (the runtime's built ones); every mode is still estimated."""
    est = estimates(times, cm, flagged, greedy_mask)
    if flagged is None:
        flagged = flag_stragglers(times, cm.straggler_ratio)
    listing = ", ".join(f"{e.mode} {e.tta:.4g}" for e in est.values())
    if not flagged:  # STAR: stragglers trigger a decision; without one it is synchronous SGD
        return Selection("sync", est, f"sync: no straggler predicted; predicted s/step: "
                                      f"{listing}")
    sync = est["sync"].tta
    ok = [m for m in _PREFERENCE if m == "sync" or (
        m in allowed and est[m].tta < sync * (1 - cm.min_gain))]
    best = min(ok, key=lambda m: (est[m].tta, _PREFERENCE.index(m)))
    chosen = est[best].mode
    if best == "sync":
        why = "no mode beats sync by " + f"{cm.min_gain:.0%}"
    else:
        why = f"{chosen} {1 - est[best].tta / sync:.0%} below sync"
        if est[best].note:
            why += f" ({est[best].note})"
    return Selection(chosen, est, f"{chosen}: {why}; predicted s/step: {listing}")


def tta_of(mode: str, times: Sequence[float], cm: CostModel,
           greedy_mask: bool = False) -> float:
    """The TTA (s per sync-equivalent step) of any concrete mode string under ``cm``, also a
    ``ksync:K`` whose K is not the one STAR's scan would pick (``greedy_mask``: see
    :func:`estimates`)."""
    est = estimates(times, cm, greedy_mask=greedy_mask)
    for e in est.values():
        if e.mode == mode:
            return e.tta
    m = parse_mode(mode, len(times))
    if m.name != "ksync":
        raise ValueError(f"mode {mode!r} has no estimate")
    if cm.ksync_defers:
        return ksync_defer_estimate(times, m.k, cm).tta
    n, b = len(times), cm.shard_batch
    g = ksync_gap(cm.stretch(_times(times), n), m.k, cm.mc_updates, cm.seed)
    return g.gap * cm.iters(m.k * b) / cm.iters(n * b) * (1 + cm.staleness_cost * g.staleness)
