"""Sync modes under stragglers: the update gap, the time-to-accuracy model and the selector.

Why choose a mode at all
------------------------
A synchronous step waits for its slowest group. STAR (Zhang & Shen 2025; notes in
shared/reference/star.md) found stragglers common even on identical GPUs and showed that the
usual escape, asynchronous SGD, often reaches a given accuracy *later*: each update carries a
smaller batch, so more updates are needed, and they are stale. Which mode wins depends on two
numbers that change during a run -- the predicted per-group step times and the gradient noise
scale -- so the mode is chosen online by a time-to-accuracy (TTA) model. Everything here is a
decision or a model: pure functions on plain data, no torch, no I/O, no clock; the runtime, the
planner and the simulator call the same ones.

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

The heuristic is the *intended* logic of star.md section 4 -- the scan for k in which the gap
for i workers is carried from one iteration to the next (the code never updates it), the
dynamic-groups TTA on the slowest member's time (the code indexes the worker id), and the
smaller TTA wins (the code's comparison is inverted) -- extended to choose among all modes.

Clustering for ``groups``: complete-linkage agglomerative clustering (scipy) with the distance
threshold a fraction (``cluster_fraction``, 10 %) of the fastest predicted step, not STAR's fixed
50 ms: what matters is a relative spread (50 ms is everything at a 20 ms step and nothing at a
60 s one), and complete linkage bounds every cluster's spread by the threshold, so inside a
cluster no member waits for another more than 10 % of a step -- half the 20 % straggler bar.

``auto`` (:func:`decide`): a group is flagged when it is predicted more than 20 % slower than the
fastest group; the mode is re-decided only when the flagged set changes, and ``sync`` comes back
when none is flagged. Hysteresis against flapping: a flagged group stays flagged until it is
within 10 % of the fastest (a Schmitt trigger), and the flagged set must differ from the one
the mode was chosen for on ``confirm`` consecutive decisions before the mode is re-chosen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage

from unbroken.core import placement, rectlr

__all__ = ["MODES", "Mode", "parse_mode", "CostModel", "ModeEstimate", "Selection",
           "ksync_gap", "GapEstimate", "cluster_times", "star_k_scan", "select",
           "flag_stragglers", "tta_of", "estimates", "AutoState", "AutoDecision", "decide",
           "Chooser", "AUTO_MODES", "noise_scale_terms", "NoiseScale", "RUNTIME_MODES",
           "predict_times", "mask_bench", "bench_for_mode", "KsyncStep", "ksync_step",
           "drain_step", "ksync_defer_estimate", "uncontended", "split_times", "shared_cores",
           "data_step_losses", "RUNTIME_MIN_GAIN", "RUNTIME_MC_UPDATES", "MAX_STALENESS",
           "Job", "AsyncStep", "async_units", "stream_shard", "async_step", "restart_after"]

MODES = ("sync", "mask", "ksync", "groups", "async", "auto")
#: the order ties are broken in: the safest (most synchronous) mode first
_PREFERENCE = ("sync", "mask", "ksync", "groups", "async")


@dataclass(frozen=True)
class Mode:
    """A sync mode: ``name`` one of MODES, ``k`` set for ksync only."""

    name: str
    k: int | None = None

    def __str__(self) -> str:
        return f"ksync:{self.k}" if self.name == "ksync" else self.name


def parse_mode(text: str, groups: int) -> Mode:
    """``sync``, ``mask``, ``ksync:K`` (1 <= K <= groups), ``groups``, ``async`` or ``auto``;
    ValueError naming the bad value otherwise."""
    name, colon, arg = text.partition(":")
    if name == "ksync":
        if not colon:
            raise ValueError(f"sync mode {text!r}: ksync needs K, as ksync:K")
        try:
            k = int(arg)
        except ValueError:
            raise ValueError(f"sync mode {text!r}: K {arg!r} is not an integer") from None
        if not 1 <= k <= groups:
            raise ValueError(f"sync mode {text!r}: K {k} outside [1, {groups}] (the number of "
                             f"groups)")
        return Mode("ksync", k)
    if name in MODES and not colon:
        return Mode(name)
    raise ValueError(f"unknown sync mode {text!r} (expected sync, mask, ksync:K, groups, "
                     f"async or auto)")


#: the predicted TTA gain over sync the runtime's ``auto`` needs to leave (or stay out of)
#: sync. The model's default 2 % assumes predictions as good as the trace; on a shared machine
#: equal groups' predicted times spread by up to 1.76x (bench/sync_modes.py beside other
#: load), so small predicted gains were noise: auto went into ksync with no straggler and,
#: with the straggler set never empty, did not come back. A 2x straggler predicts ~33 % for
#: ksync:3.
RUNTIME_MIN_GAIN = 0.15
#: updates of the ksync Monte-Carlo when the runtime re-selects (STAR's 1,000 cost ~20 ms)
RUNTIME_MC_UPDATES = 200


@dataclass(frozen=True)
class CostModel:
    """What the TTA model needs besides the predicted step times.

    Attributes:
        shard_batch: B, samples per group per step.
        noise_scale: phi, the gradient noise scale in samples (see :class:`NoiseScale`).
        comm_s: the all-reduce part of every group's step time (the rest is compute).
        redundancy: SPARe's r (each group hosts r shard types); ``mask`` needs r >= 2.
        staleness_cost: lambda, the TTA penalty per update of mean staleness.
        cluster_fraction: the ``groups`` linkage threshold as a share of the fastest step.
        straggler_ratio: a group slower than this x the fastest is a straggler (STAR: 1.2).
        min_gain: a mode other than sync must beat sync's TTA by this share to be chosen.
        mc_updates: updates in the ksync Monte-Carlo (STAR: 1,000).
        seed: seeds the Monte-Carlo's tie-breaking.
        ksync_defers: price ``ksync`` as the runtime runs it (the late groups' samples are
            deferred and caught up on fresh parameters: :func:`ksync_defer_estimate`, K the
            best of 1..N-1) instead of STAR's k-sync (late gradients applied stale).
        cores: the CPU cores the groups' compute shares; 0: each group computes on a device
            of its own (STAR's setting, and every cluster's). With N groups on C < N cores,
            P groups computing at once each get min(1, C / P) of a core (processor sharing:
            :meth:`contention`), so a mode that idles some groups speeds up the others --
            ``ksync:2`` of 4 groups on 2 cores computes 2 shards a group at full speed, as fast
            as ``sync``'s 4 at half speed. The times the model is given are then each group's
            per-shard time on a core of its own (:func:`uncontended`), and each mode's step is
            priced at the contention of the groups it keeps computing.
    """

    shard_batch: int = 8
    noise_scale: float = 0.0
    comm_s: float = 0.0
    redundancy: int = 1
    staleness_cost: float = 0.1
    cluster_fraction: float = 0.1
    straggler_ratio: float = 1.2
    min_gain: float = 0.02
    mc_updates: int = 1000
    seed: int = 0
    ksync_defers: bool = False
    cores: int = 0

    @classmethod
    def for_runtime(cls, shard_batch: int, redundancy: int, noise_scale: float = 0.0,
                    comm_s: float = 0.0, seed: int = 0, cores: int = 0) -> "CostModel":
        """The model the runtime's ``auto`` decides with, and ``plan --stragglers`` prices
        by (one selector): ``ksync`` as the runtime runs it (deferral, nothing stale), a
        :data:`RUNTIME_MC_UPDATES`-update Monte-Carlo, and :data:`RUNTIME_MIN_GAIN` to
        leave sync."""
        return cls(shard_batch=shard_batch, redundancy=redundancy, noise_scale=noise_scale,
                   comm_s=comm_s, seed=seed, mc_updates=RUNTIME_MC_UPDATES,
                   ksync_defers=True, min_gain=RUNTIME_MIN_GAIN, cores=cores)

    def __post_init__(self) -> None:
        if self.shard_batch < 1:
            raise ValueError(f"shard batch {self.shard_batch} must be at least 1")
        for name in ("noise_scale", "comm_s", "staleness_cost", "min_gain"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} {v!r} must be a finite number >= 0")
        if not self.cluster_fraction > 0:
            raise ValueError(f"cluster_fraction {self.cluster_fraction!r} must be > 0")
        if not self.straggler_ratio > 1:
            raise ValueError(f"straggler_ratio {self.straggler_ratio!r} must be > 1")
        if self.redundancy < 1 or self.mc_updates < 1:
            raise ValueError(f"redundancy {self.redundancy} and mc_updates "
                             f"{self.mc_updates} must be at least 1")
        if not (isinstance(self.cores, int) and self.cores >= 0):
            raise ValueError(f"cores {self.cores!r} must be an integer >= 0")

    def contention(self, computing: int) -> float:
        """How much slower than on a core of its own each of ``computing`` groups computing
        at once runs: max(1, computing / cores); 1 with a device per group (``cores`` 0)."""
        return 1.0 if self.cores <= 0 else max(1.0, computing / self.cores)

    def stretch(self, t: float | np.ndarray, computing: int) -> float | np.ndarray:
        """Step time(s) ``t`` (compute + ``comm_s``) with ``computing`` groups computing at
        once: the compute part stretched by :meth:`contention`, the all-reduce not; ``t``
        unchanged with a device per group."""
        if self.cores <= 0:
            return t
        return self.comm_s + np.maximum(t - self.comm_s, 0.0) * self.contention(computing)

    def iters(self, batch: float) -> float:
        """Relative iterations to the same progress at ``batch`` samples per update."""
        return 1.0 + self.noise_scale / batch


# ----------------------------------------------------------------------------- update gap

@dataclass(frozen=True)
class GapEstimate:
    """Mean time between updates and mean staleness (in updates) of the gradients used."""

    gap: float
    staleness: float


def _times(times: Sequence[float] | np.ndarray) -> np.ndarray:
    t = np.asarray(times, dtype=float)
    if t.ndim not in (1, 2) or t.size == 0:
        raise ValueError(f"step times must be a non-empty vector or (steps, groups) array, got "
                         f"shape {t.shape}")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("step times must be finite and positive")
    return t


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


# ----------------------------------------------------------------------------- the TTA model

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


# ----------------------------------------------------------------------------- auto

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


# ----------------------------------------------------------------------------- noise scale

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


# ----------------------------------------------------------------------------- runtime modes

#: the modes the runtime (``unbroken.runtime.syncmodes``) carries out; ``auto`` chooses among
#: sync, mask and ksync (ksync priced as the runtime runs it: ``CostModel.ksync_defers``)
RUNTIME_MODES = ("sync", "mask", "ksync", "groups", "async", "auto")
#: what the runtime's ``auto`` chooses among: ``groups`` and ``async`` are left out (their
#: estimates leave out what the runtime adds to them, and the bench finds them slower to the
#: target everywhere: ``unbroken.runtime.syncmodes``)
AUTO_MODES = ("sync", "mask", "ksync")


def shared_cores(groups: int, cores: int) -> int:
    """``CostModel.cores`` for ``groups`` groups that all compute on one machine's ``cores``
    CPU cores: the cores when the groups outnumber them, else 0 (each group has a core of its
    own, as good as a device: nothing to price)."""
    return cores if groups > cores > 0 else 0


def uncontended(walls: Sequence[float], cpus: Sequence[float], cm: CostModel) -> list[float]:
    """One step's measured per-shard times (one per group; 0 or less: computed nothing) as
    each group's time on a core of its own, so that a window mixes steps of different modes
    fairly. With a device per group (``cm.cores`` 0) they are returned as they are.

    Sharing cores, group i's wall time w_i is its CPU time c_i stretched by the contention
    s = :meth:`CostModel.contention` of the groups computing that step, plus what is not CPU
    at all (a slow device's wait, the sleep of an injected straggler): w_i = c_i s + x_i. On
    a core of its own it takes c_i + x_i, with x_i = max(0, w_i - c_i s): a group the
    scheduler favoured (w_i under c_i s) has no x_i, so its 17 ms of CPU is 17 ms whether it
    measured 34 ms or 19 (dividing by s alone read 9.5 ms for that lucky one, and the lower
    envelope of a window kept it: equal groups looked 1.9x apart). ``cpus`` <= 0: unknown
    (a background job's thread), w_i / s."""
    if cm.cores <= 0:
        return [float(v) if v > 0 else 0.0 for v in walls]
    s = cm.contention(sum(1 for v in walls if v > 0))
    out = []
    for w, c in zip(walls, cpus):
        w, c = float(w), float(c)
        out.append(0.0 if w <= 0 else w / s if c <= 0 else c + max(0.0, w - c * s))
    return out


def split_times(walls: Sequence[float], cpus: Sequence[float], waits: Sequence[float],
                cm: CostModel) -> tuple[list[float], list[float]]:
    """One step's measured per-shard times, each split into the part spent on a core and the
    part *blocked* (asleep: a device's or the network's wait, an injected straggler's sleep),
    for a predictor that trusts them differently (:func:`predict_times`).

    ``waits``: each group's run-queue wait per shard (runnable, no core:
    :func:`unbroken.runtime.resources.runqueue_wait`; below 0: unknown). Wall = CPU + wait +
    blocked, so blocked = max(0, w - c - q) is exact -- the scheduler's noise is all in the
    wait. The on-core part is what :func:`uncontended` makes of the rest: c + max(0, q - c (s -
    1)) sharing cores (the wait beyond the contention the groups make themselves: another
    process's load, or the scheduler's unfairness, which only a window shows apart), c + q with
    a device per group. The two parts add up to :func:`uncontended`'s time. A wait or CPU time
    that is unknown puts the whole time in the on-core part."""
    s = cm.contention(sum(1 for v in walls if v > 0))
    on, off = [], []
    for w, c, q in zip(walls, cpus, waits):
        w, c, q = float(w), float(c), float(q)
        b = max(0.0, w - c - q) if w > 0 and c > 0 and q >= 0 else 0.0
        if w <= 0:
            on.append(0.0)
        elif cm.cores <= 0:
            on.append(w - b)
        else:
            on.append((w - b) / s if c <= 0 else c + max(0.0, w - b - c * s))
        off.append(b)
    return on, off


def predict_times(window: Sequence[Sequence[float]],
                  blocked: Sequence[Sequence[float]] | None = None,
                  min_measured: int = 1) -> list[float] | None:
    """Each group's predicted per-shard compute time from its recent measurements (one row
    per step, one column per group; 0 or less: not measured that step, e.g. a group left out
    and not probed): the *fastest* of its measured values. The load of a shared machine only
    ever adds time to a measurement (a median of a few steps still followed it: groups were
    flagged by the scheduler, not by their speed), while a slow machine is slow on every step,
    so the lower envelope keeps the ratio a trace injects and flags a group only once it was
    slow on every step of the window; it sees a recovery at the first fast step. None while
    some group has no measurement.

    ``blocked``: rows of each group's blocked time per shard (:func:`split_times`; then
    ``window`` holds the on-core parts), usually a shorter window: a group's prediction is
    the sum of the two envelopes. Blocked time carries none of the scheduler's noise, so a
    group that starts to sleep (a burst on a slow machine) is seen after a few steps rather
    than a whole window; the on-core part still needs the long one. A step a group was not
    measured reads below 0 in ``blocked`` (0 is a measurement there: no sleep).

    ``min_measured``: None until every group has that many measurements in ``window``. The
    runtime asks for 3: a run's (or a generation's) first two steps are warm-up -- 25-31 ms a
    shard against 15 steady, unequally between groups -- and a prediction from them alone
    sent ``auto`` into ``ksync:2`` at step 2 without a straggler (bench/sync_modes.py, 'none',
    1 run of 9), where it stayed 24 steps until the probes saw the groups it deferred."""
    if not window:
        return None
    cols = np.asarray(window, dtype=float).T
    out = []
    for c in cols:
        v = c[c > 0]
        if v.size < max(1, min_measured):
            return None
        out.append(float(v.min()))
    if blocked:
        for i, c in enumerate(np.asarray(blocked, dtype=float).T):
            v = c[c >= 0]
            out[i] += float(v.min()) if v.size else 0.0
    return out


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


def mask_bench(times: Sequence[float], benched: Sequence[int],
               cm: CostModel) -> tuple[tuple[int, ...], str]:
    """``mask``'s decision for the next step: which groups to leave out.

    Candidates are the groups predicted over ``cm.straggler_ratio`` x the fastest (with the
    hysteresis of :func:`flag_stragglers` around the ones left out now); of them the subset of
    :func:`_mask_greedy` (each one left out must make the predicted step sooner: the
    survivors' deeper stacks against the wait). So a 3x straggler at r = 2 is left out (a
    2-deep stack is sooner) and a 2x one is not (a wash). Returns (groups, reason)."""
    t = _times(times)
    flagged = flag_stragglers(t, cm.straggler_ratio, benched)
    if not flagged:
        return (), "mask: no straggler predicted"
    est = _mask_greedy(t, flagged, cm)
    return est.left_out, (f"mask: stragglers {list(flagged)}: {est.note}; predicted step "
                          f"{est.tta:.4g} s vs sync {float(cm.stretch(t.max(), t.size)):.4g} s")


def bench_for_mode(d: AutoDecision, benched: Sequence[int]) -> tuple[int, ...]:
    """The groups ``auto`` leaves out after decision ``d``: under ``mask`` the subset its
    selection estimated (``benched``, the ones out now, while it did not re-select); none
    under any other mode."""
    if d.mode != "mask":
        return ()
    if d.selection is not None:
        return d.selection.estimates["mask"].left_out
    return tuple(benched)


@dataclass(frozen=True)
class KsyncStep:
    """One ``ksync:K`` step in the runtime.

    ``late``: the groups predicted slowest (N - K of them) whose own shard types this step
    does *not* compute: those samples are deferred (``deferred`` is filled by the caller from
    the plan); ``catch_up``: ``(group, data step, type)`` deferred shards computed this step,
    oldest first; ``reason``: the journal line."""

    late: tuple[int, ...]
    catch_up: tuple[tuple[int, int, int], ...]
    reason: str


def ksync_step(times: Sequence[float] | None, groups: int, k: int,
               backlog: Sequence[tuple[int, int]], last: bool) -> KsyncStep:
    """``ksync:K``'s plan for the next step, the same on every member.

    The step commits with the K groups predicted fastest (``times``, one per group; None: no
    prediction yet, every group takes part); the other N - K defer their shard types.
    Deferred shards (``backlog``: (data step, type), oldest first) are caught up so that every
    sample is used exactly once: once there are ``m`` per fast group (m = ceil((N - K) / K),
    what keeps the backlog bounded: under 2N), each fast group computes m of them (a step in
    which all of them carry m more shards costs m shards more, not a wait for the straggler),
    and the ``last`` step of the run defers nothing and spreads the whole backlog over every
    group. A shard is computed on the parameters of the
    step that uses it: the data order changes, not the staleness."""
    if not 1 <= k <= groups:
        raise ValueError(f"k {k} outside [1, {groups}]")
    if last:
        return drain_step(backlog, range(groups), f"ksync:{k}: last step")
    if times is None:
        return KsyncStep((), (), f"ksync:{k}: no prediction yet, every group takes part")
    t = _times(times)
    if t.size != groups:
        raise ValueError(f"{t.size} times for {groups} groups")
    order = sorted(range(groups), key=lambda i: (t[i], i))
    late = tuple(sorted(order[k:]))
    fast = sorted(order[:k])
    m = -(-(groups - k) // k)
    cu: tuple[tuple[int, int, int], ...] = ()
    if m and len(backlog) >= m * k:
        cu = tuple((fast[i % k], int(s), int(ty))
                   for i, (s, ty) in enumerate(backlog[:m * k]))
    why = (f"ksync:{k}: commits with {fast}, defers {list(late)}"
           + (f", {len(cu)} deferred shard(s) caught up" if cu else ""))
    return KsyncStep(late, cu, why)


def drain_step(backlog: Sequence[tuple[int, int]], over: Sequence[int],
               why: str = "drain") -> KsyncStep:
    """A step that defers nothing and catches up the whole ``backlog`` spread round-robin over
    the groups ``over`` (the ones computing in that step): the last step of a run, the step
    after a re-plan (a failure, an admission: whatever the interrupted step was to catch up
    goes to whoever is live now) or after ``auto`` leaves ``ksync``. Without it a deferred
    shard would be used never -- the ledger would report it missing. Empty ``over`` (nobody
    computes) or backlog: no catch-up."""
    over = sorted(int(w) for w in over)
    if not over or not backlog:
        return KsyncStep((), (), f"{why}: nothing deferred to catch up")
    cu = tuple((over[i % len(over)], int(s), int(ty)) for i, (s, ty) in enumerate(backlog))
    return KsyncStep((), cu, f"{why}: {len(cu)} deferred shard(s) caught up over groups {over}")


def data_step_losses(pending: dict[int, tuple[float, int]], step: int, own_sum: float,
                     own_n: int, caught_up: Sequence[tuple[int, float]], types: int
                     ) -> tuple[dict[int, float], dict[int, tuple[float, int]]]:
    """The loss of every *data step* whose ``types`` shards have now all been computed: what
    makes the loss of a mode that defers samples comparable with ``sync``'s.

    A step's committed loss under ``sync`` is the mean training loss of its N shard types,
    each on the parameters it is trained on. Under ``ksync`` the step's own loss leaves out
    the deferred types, always the same ones under a persistent straggler, and a mean over
    fewer shards is noisier, so it dips under a target sooner: neither is the quantity
    ``sync`` reports. So a data step's loss here is the mean over all N of its shards, each
    taken when its gradient is computed (a deferred one at its catch-up, on the parameters it
    is trained on there), known -- and timed -- once the last of them is computed. It covers
    the very samples of ``sync``'s step, so the data noise of a per-step loss is the same in
    both modes. A held-out evaluation would cost forward passes in every mode and a change of
    the synchronous path; this costs nothing.

    ``pending``: data step -> (loss sum, shards) so far; ``step`` the step being committed,
    whose own computed shards have the loss sum ``own_sum`` over ``own_n`` shards;
    ``caught_up``: (data step, loss) of each deferred shard computed in it. Returns (complete
    data steps -> mean loss, the new pending); does not modify ``pending``."""
    acc = dict(pending)
    for s, v, c in [(step, own_sum, own_n)] + [(s, l, 1) for s, l in caught_up]:
        if c:
            old = acc.get(int(s), (0.0, 0))
            acc[int(s)] = (old[0] + float(v), old[1] + int(c))
    done = {s: v / c for s, (v, c) in acc.items() if c >= types}
    return done, {s: vc for s, vc in acc.items() if s not in done}


# ----------------------------------------------------------------------------- groups / async

#: ``groups`` / ``async`` in the runtime: a background gradient is applied at most this many
#: updates after the parameters it was computed on (past it the step waits for it), and a
#: group's shard stream lags its step by at most this many data steps (older shards go to the
#: backlog the synchronous groups catch up)
MAX_STALENESS = 4


@dataclass(frozen=True)
class Job:
    """A background job of one group: its gradient of ``data_step`` (its own shard types) on
    the parameters of step ``version``; ``unit``: the groups that started it together (they
    deliver together)."""

    version: int
    data_step: int
    unit: tuple[int, ...]


def async_units(times: Sequence[float], mode: str, fraction: float = 0.1,
                live: Sequence[int] | None = None) -> list[tuple[int, ...]]:
    """The clusters of ``mode`` over the ``live`` groups (default all), fastest first:
    ``groups`` :func:`cluster_times` on the predicted times (the threshold ``fraction`` x the
    fastest time), ``async`` every group alone."""
    live = list(range(len(times))) if live is None else sorted(int(w) for w in live)
    if not live:
        return []
    t = _times([times[w] for w in live])
    if mode == "async":
        return [(live[i],) for i in sorted(range(len(live)), key=lambda i: (t[i], live[i]))]
    if mode != "groups":
        raise ValueError(f"async_units: mode {mode!r} is neither groups nor async")
    return [tuple(sorted(live[i] for i in c)) for c in cluster_times(t, fraction)]


def stream_shard(cursor: int, step: int, max_lag: int = MAX_STALENESS) -> tuple[int, list[int]]:
    """The data step a group's job starting at ``step`` computes: the oldest of its stream not
    taken yet (``cursor``), but at most ``max_lag`` behind ``step``; the data steps skipped
    (they go to the backlog)."""
    if cursor > step:
        raise ValueError(f"cursor {cursor} is ahead of step {step}")
    lo = max(cursor, step - max_lag)
    return lo, list(range(cursor, lo))


@dataclass(frozen=True)
class AsyncStep:
    """``groups`` / ``async``'s plan for one step, the same on every member.

    ``sync``: the groups computing this step's own shard inline (the fastest cluster);
    ``start``: group -> the job it starts in the background at this boundary; ``deliver``:
    in-flight groups every member knows deliver in this step (``forced`` by the staleness
    bound, or a cluster whose members all reported ready at the previous commit); a job of a
    group alone may also be delivered in the step, which only the reduced buffer says;
    ``catch_up``: backlog shards the sync groups compute; ``backlog``, ``cursor``: the state
    after the boundary (``cursor[w]``: the first data step of group w's stream no job has
    taken; the backlog still holds the shards caught up in this step: they leave it at the
    commit that computes them); ``clusters``: the clustering this boundary used."""

    sync: tuple[int, ...]
    start: dict[int, Job]
    deliver: tuple[int, ...]
    forced: tuple[int, ...]
    catch_up: KsyncStep
    backlog: tuple[tuple[int, int], ...]
    cursor: tuple[int, ...]
    clusters: tuple[tuple[int, ...], ...]
    reason: str


def async_step(times: Sequence[float] | None, mode: str, step: int, cursor: Sequence[int],
               inflight: dict[int, Job], ready: Sequence[int],
               backlog: Sequence[tuple[int, int]], live: Sequence[int],
               fraction: float = 0.1, max_staleness: int = MAX_STALENESS) -> AsyncStep:
    """The plan of step ``step`` under ``groups`` or ``async`` (each group's stream is its own
    shard type ``w`` at data steps 0, 1, ...).

    The clusters come from the predicted times (:func:`async_units`; None: no prediction
    yet, every group is synchronous). An idle group of the fastest cluster computes this
    step's own shard inline (its lag, if any, goes to the backlog: a synchronous group is
    never behind); an idle group of another cluster starts a background job on this step's
    parameters, together with the idle members of its cluster, on the oldest shard of its
    stream (:func:`stream_shard`). An in-flight job must be delivered in this step when it
    would otherwise exceed ``max_staleness``, and is when its cluster (of two or more)
    reported ready at the last commit. The sync groups catch up the backlog in balanced
    steps (as ``ksync``: m = ceil(background / sync) shards each, more when it is long); with
    no group in the background they catch all of it up."""
    live = sorted(int(w) for w in live)
    n = len(cursor)
    cur = list(int(c) for c in cursor)
    back = list(backlog)
    if times is None:
        clusters: list[tuple[int, ...]] = [tuple(w for w in live)]
    else:
        clusters = async_units(times, mode, fraction, live)
    fast = set(clusters[0]) if clusters else set()
    sync = tuple(w for w in live if w in fast and w not in inflight)
    for w in sync:  # a synchronous group computes this step's shard: its lag to the backlog
        back += [(s, w) for s in range(cur[w], step)]
        cur[w] = step + 1
    start: dict[int, Job] = {}
    for c in clusters:
        unit = tuple(w for w in c if w not in fast and w not in inflight)
        for w in unit:
            s, skipped = stream_shard(cur[w], step, max_staleness)
            back += [(k, w) for k in skipped]
            cur[w] = s + 1
            start[w] = Job(step, s, unit)
    ready_set = set(int(w) for w in ready)
    forced = tuple(sorted(w for w, j in inflight.items() if step - j.version >= max_staleness))
    deliver = tuple(sorted(set(forced) | {w for w, j in inflight.items() if len(j.unit) > 1
                                          and all(g in ready_set for g in j.unit)}))
    jobs = {**inflight, **start}
    if not sync and not deliver and jobs:  # a step with no gradient: wait for the oldest job
        w0 = min(jobs, key=lambda w: (jobs[w].version, jobs[w].data_step, w))
        forced = tuple(sorted(g for g in jobs[w0].unit if g in jobs))
        deliver = forced
    back.sort()
    if not sync or not back:
        cu = KsyncStep((), (), "nothing to catch up")
    elif not start and not inflight:
        cu = drain_step(back, sync, f"{mode}: no group in the background")
    else:
        m = -(-(len(live) - len(sync)) // len(sync))
        take = m * len(sync) * max(1, len(back) // (2 * n))
        cu = KsyncStep((), tuple((sync[i % len(sync)], int(s), int(t))
                                 for i, (s, t) in enumerate(back[:take])), "") \
            if len(back) >= m * len(sync) else KsyncStep((), (), "")
    why = (f"{mode}: clusters {[list(c) for c in clusters]}, synchronous {list(sync)}"
           + (f", starting {sorted(start)}" if start else "")
           + (f", in flight {sorted(inflight)}" if inflight else "")
           + (f", forced by the staleness bound {list(forced)}" if forced else "")
           + (f", {len(cu.catch_up)} backlog shard(s) caught up" if cu.catch_up else ""))
    return AsyncStep(sync, start, deliver, forced, cu, tuple(back), tuple(cur),
                     tuple(clusters), why)


def restart_after(w: int, job: Job, step: int, plan: AsyncStep, cursor: Sequence[int],
                  max_staleness: int = MAX_STALENESS) -> tuple[Job, list[int]] | None:
    """The job group ``w`` starts at once when it delivers ``job`` in step ``step`` (before
    that step's all-reduce, on its parameters), or None: it waits for the next boundary.
    A job delivered in the step it started (fresh) is followed at the next boundary, on
    fresher parameters; one that overran is followed at once (the group would idle for the
    rest of the step), unless the boundary put ``w`` in the fastest cluster (it becomes
    synchronous at the next one). Its unit: the members of ``job.unit`` that share ``w``'s
    cluster of ``plan`` (they deliver together, so they restart together). Returns (the job,
    the data steps of ``w``'s stream it skips: to the backlog)."""
    if step == job.version or any(w in c for c in plan.clusters[:1]):
        return None
    mine = next((c for c in plan.clusters if w in c), (w,))
    s, skipped = stream_shard(cursor[w], step, max_staleness)
    return Job(step, s, tuple(g for g in job.unit if g in mine)), skipped
