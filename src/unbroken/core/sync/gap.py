"""The update gap of each mode (STAR's k-sync Monte-Carlo, the closed forms, the groups'
clusters) and STAR's released choice of K, kept to compare with.

Clustering for ``groups``: complete-linkage agglomerative clustering (scipy) with the distance
threshold a fraction (``cluster_fraction``, 10 %) of the fastest predicted step, not STAR's fixed
50 ms: what matters is a relative spread (50 ms is everything at a 20 ms step and nothing at a
60 s one), and complete linkage bounds every cluster's spread by the threshold, so inside a
cluster no member waits for another more than 10 % of a step -- half the 20 % straggler bar.

The heuristic is the *intended* logic of star.md section 4 -- the scan for k in which the gap
for i workers is carried from one iteration to the next (the code never updates it), the
dynamic-groups TTA on the slowest member's time (the code indexes the worker id), and the
smaller TTA wins (the code's comparison is inverted) -- extended to choose among all modes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage

from unbroken.core.sync.cost import CostModel, _times

__all__ = ["GapEstimate", "ksync_gap", "cluster_times", "star_k_scan"]


@dataclass(frozen=True)
class GapEstimate:
    """Mean time between updates and mean staleness (in updates) of the gradients used."""

    gap: float
    staleness: float


def ksync_gap(times: Sequence[float] | np.ndarray, k: int, updates: int = 1000,
              seed: int = 0, closed_form: bool = True) -> GapEstimate:
    """STAR's update gap of k-sync: an update fires when any ``k`` gradients have arrived.

    ``times`` is (N,) per-group iteration times or (S, N): group i's j-th iteration takes
    ``times[j % S, i]`` (trace-driven). For a vector, K = N is max t (staleness 0) and K = 1 is
    1 / sum(1/t) (staleness N - 1) when ``closed_form``; otherwise the 1,000-update Monte-Carlo
    of STAR's ``static_x_mode.py``: groups ordered by remaining time (ties broken at random,
    seeded), the k-th smallest fixes the interval, the first k restart, the others continue
    with their remaining time reduced. Their gradients are used by a later update, and the
    number of updates in between is their staleness.
    """
    t = _times(times)
    mat = t if t.ndim == 2 else t[None, :]
    n = mat.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"k {k} outside [1, {n}]")
    if t.ndim == 1 and closed_form and k in (n, 1):
        return GapEstimate(float(t.max()), 0.0) if k == n else \
            GapEstimate(float(1.0 / np.sum(1.0 / t)), float(n - 1))
    rng = np.random.default_rng(seed)
    it = np.zeros(n, dtype=np.int64)                 # iterations started by each group
    rem = mat[0].copy()
    started = np.zeros(n, dtype=np.int64)            # the version each group read
    total, stale = 0.0, 0
    for v in range(updates):
        order = np.lexsort((rng.random(n), rem))
        first = order[:k]
        dt = rem[order[k - 1]]
        total += dt
        stale += int(np.sum(v - started[first]))
        rem -= dt
        it[first] += 1
        rem[first] = mat[it[first] % mat.shape[0], first]
        started[first] = v + 1
    return GapEstimate(total / updates, stale / (updates * k))


def cluster_times(times: Sequence[float], fraction: float = 0.1) -> list[list[int]]:
    """Groups clustered by predicted step time: complete linkage, threshold ``fraction`` x the
    fastest time, so each cluster's spread is at most that. Clusters sorted fastest first."""
    t = _times(times)
    if t.ndim != 1:
        raise ValueError("cluster_times takes one time per group")
    if t.size == 1:
        return [[0]]
    z = linkage(t[:, None], method="complete")
    labels = fcluster(z, fraction * float(t.min()), criterion="distance")
    clusters: dict[int, list[int]] = {}
    for i in np.argsort(t, kind="stable"):
        clusters.setdefault(int(labels[i]), []).append(int(i))
    return sorted(clusters.values(), key=lambda c: (t[c].max(), c[0]))


def star_k_scan(times: Sequence[float], cm: CostModel) -> tuple[int, float]:
    """STAR's scan for k (star.md section 4, the intended logic): add workers fastest first
    while the next one still lowers gap x iters; the gap for i workers is interpolated between
    1/sum(1/t) (i = 1) and max t (i = N) by the i-th fastest time. Returns (k, its TTA in raw
    seconds, not yet per sync-equivalent step)."""
    t = np.sort(_times(times))
    n, b = t.size, cm.shard_batch
    t_max, t_async = float(t[-1]), float(1.0 / np.sum(1.0 / t))
    span = t_max - float(t[0])
    prev = t_async                                   # gap with i workers, i = 1
    for i in range(1, n):
        gap_next = t_max if span <= 0 else t_async + (t_max - t_async) * (t[i] - t[0]) / span
        if prev * cm.iters(i * b) < gap_next * cm.iters((i + 1) * b):
            return i, prev * cm.iters(i * b)
        prev = gap_next                              # STAR's code never updates this (t_0)
    return n, cm.iters(n * b) * t_max


def _star_code_k(times: Sequence[float], cm: CostModel) -> tuple[int, float]:
    """STAR's released k scan, quirk included: the gap for i workers stays 1/sum(1/t)."""
    t = np.sort(_times(times))
    n, b = t.size, cm.shard_batch
    t_max, t_async = float(t[-1]), float(1.0 / np.sum(1.0 / t))
    span = t_max - float(t[0])
    for i in range(1, n):
        gap_next = t_max if span <= 0 else t_async + (t_max - t_async) * (t[i] - t[0]) / span
        if t_async * cm.iters(i * b) < gap_next * cm.iters((i + 1) * b):
            return i, t_async * cm.iters(i * b)
    return n, cm.iters(n * b) * t_max


def _star_code_choice(times: Sequence[float], cm: CostModel) -> str:
    """STAR's released selector *with* its quirks (star.md section 4), kept only so tests can
    show where the intended logic differs: the gap for i workers stays 1/sum(1/t), T_dyn uses
    the slowest member's *index* as its time, and k-sync is chosen when T_dyn < T_k."""
    k, t_k = _star_code_k(times, cm)
    clusters = cluster_times(times, cm.cluster_fraction)
    worker_id = [float(c[-1]) for c in clusters]  # itm[-1][0]: the slowest member's id
    t_dyn = 1.0 / sum(1.0 / (cm.iters(len(c) * cm.shard_batch) * max(w, 1e-9))
                      for c, w in zip(clusters, worker_id))
    return f"ksync:{k}" if t_dyn < t_k else "groups"


def _star_intended_choice(times: Sequence[float], cm: CostModel) -> str:
    """STAR's two-way choice (k-sync vs dynamic groups) with the intended logic."""
    t = _times(times)
    k, t_k = star_k_scan(t, cm)
    clusters = cluster_times(t, cm.cluster_fraction)
    t_dyn = 1.0 / sum(1.0 / (cm.iters(len(c) * cm.shard_batch) * float(t[c].max()))
                      for c in clusters)
    return f"ksync:{k}" if t_k <= t_dyn else "groups"
