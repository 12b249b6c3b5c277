"""Closed forms for SPARe and replication: how many failures are masked, at what compute
overhead, how often to checkpoint, and what time-to-train follows.

Why closed forms next to a simulator
------------------------------------
A planner must answer "which redundancy and which checkpoint interval" in milliseconds, for
any N; the simulator then checks the answer on the chosen point. The formulas follow the SPARe
paper (spare.md §4–§5):

* mu(N, r) = Gamma(1 + 1/r) * N^(1 - 1/r): expected failures until some shard type has lost all
  r hosts (a wipe-out), for failures hitting distinct groups uniformly at random.
* S(N, r): mean stack depth, i.e. compute per step in stacks. The lower bound averages
  c(k) = ceil(N / (N - k)) over the masked failures k = 0 .. floor(mu) - 1; the estimate adds
  the excess the real controller needs beyond c(k), measured by Monte-Carlo over
  ``core.rectlr.decide`` itself.
* T_c* = T_s + sqrt(T_s^2 + 2 T_s (T_f + T_r)) (Saxena et al. 2024), with T_f = mu * MTBF the
  mean time between restarts, and the availability A(T_c) = (1 - T_s/T_c) * T_f / (T_f + T_r +
  T_c / 2), whose maximiser is exactly T_c*.
* J(r) = step(r) / ((T_compute + T_a) * A*): time-to-train over the failure-free T0, where
  step(r) is the expected synchronous step time including the barrier's wait for the slowest
  of N jittered groups (the term that makes the simulated step longer than S * T_compute).
* r* = argmin J(r), and the paper's closed form floor(log2 N + 0.833).

Replication (Rep+CKPT) uses the same model with r-fold compute per step and
mu_rep = Gamma(1 + 1/r) * N^(1 - 1/r) * r^(1/r) (N/r replica sets of r groups each).

Why the paper's J is corrected
------------------------------
The paper's J (kept as ``ttt_over_t0_paper``) was 7-9 % below the simulation at its optimum,
while the paper reports <= 4 % for its own. It leaves out three things the simulation (and a
real cluster) does, each derived here from the same failure model and each checked against the
simulator on its own (tests/sim/test_theory_vs_sim.py):

1. **The restart is the slowest of N renewal processes with resets** (``restart_expected``).
   Every group must stay failure-free for T_r, and a failure during its recovery starts its T_r
   again; the restart ends with the last group. One group's completion time C solves a renewal
   equation: its first failure Y is the residual life of a process already running (the
   equilibrium residual, F_Y(y) = (1/m_g) int_0^y (1 - F_X)), later ones are fresh intervals X;
   C = T_r if Y >= T_r, else Y + C'. With the groups independent,
   E[R] = int (1 - F_C(t)^N) dt, about 2 T_r in the paper's scenario (12 groups fail in the first
   T_r, and the last of them starts late), within 1 % of the simulated restart.
2. **Masked groups stop failing** (``time_to_wipeout``): with j groups dead, failures come every
   m N / (N - j), so the epoch lasts T_f = m sum_j survival(j) N / (N - j) rather than mu m, where
   survival(j) = exp(-N (j/N)^r) is the same wipe-out law whose sum gives mu. The steps in such
   an epoch dwell longest where the depth is highest, so the mean step is the time-weighted
   harmonic mean of step(c(j)) (``time_weighted_step``), not step(mean c).
3. **A masked failure costs time** (``epoch_costs``): half an all-reduce that broke, a shrink,
   one stack of patch compute when the controller must reorder (``nonfixed_decisions``:
   1 - (1 - (j/N)^(S-1))^S per failure at depth S), then the retried all-reduce in place of the
   step's own; failures noticed in one step share that round (Poisson batching).

Then A = (1 - T_s/T_c) T_f / (T_f + E[R] + T_a/2 + T_c/2) keeps the paper's form (so Saxena's
T_c* holds with T_f + E[R] + T_a/2 in place of T_f + T_r) and J = step / ((T_compute + T_a) A
(1 - O_f / T_f)), with O_f the masked failures' cost per epoch. At r* for N = 200, 600, 1000
this is within 1 % of the simulation (README, "Theory against simulation").

Everything here is pure: numbers in, numbers out.

One file of ~530 lines, on purpose: the formulas above are one model (each strategy's J uses
mu, S, the restart, the epoch's costs and Saxena's interval together), and the Monte-Carlo
over the controller feeds S's excess; split, each part would import the others back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import numpy as np
from scipy.special import gammainc, ndtr

from unbroken.core import placement
from unbroken.core.rectlr import Plan, TopCover, decide, initial_stacks
from unbroken.core.scenario import Scenario

R_STAR_OFFSET = 0.5772156649015329 / math.log(2)   # gamma / ln 2 = 0.8327


def mu(groups: int, redundancy: int) -> float:
    """Expected failures until a wipe-out under SPARe's stacked layout."""
    r = redundancy
    return math.gamma(1.0 + 1.0 / r) * groups ** (1.0 - 1.0 / r)


def mu_replication(groups: int, redundancy: int) -> float:
    """Expected failures until some replica set of r groups has lost all of its members."""
    r = redundancy
    return math.gamma(1.0 + 1.0 / r) * groups ** (1.0 - 1.0 / r) * r ** (1.0 / r)


def depth_bound(groups: int, failed: int) -> int:
    """c(k) = ceil(N / (N - k)): the fewest stacks per survivor that can cover N types."""
    return -(-groups // (groups - failed))


def overhead_lower_bound(groups: int, redundancy: int) -> float:
    """Mean of c(k) over k = 0 .. floor(mu) - 1."""
    m = max(1, int(math.floor(mu(groups, redundancy))))
    k = np.arange(m)
    return float(np.mean(-(-groups // (groups - k))))


@dataclass(frozen=True)
class ControllerMC:
    """Monte-Carlo over the real controller: random distinct failures until a wipe-out."""

    failures_to_wipeout: float          # mean number of failures including the fatal one
    depth_after: tuple[float, ...]      # mean depth in force after k failures (k = 0, 1, ...)
    excess_over_bound: float            # mean of depth_after - c(k) over the k visited < mu
    trials: int                         # trials that reached their wipe-out
    failures_seen: int = 0              # decisions made, over all trials (partial included)
    complete: bool = True               # False: a budget stopped it inside a trial


def controller_walk(groups: int, redundancy: int, trials: int = 8,
                    seed: int = 0) -> Iterator[tuple[int, int, int | None]]:
    """Drive ``rectlr.decide`` through ``trials`` seeded failure sequences until wipe-out,
    yielding ``(trial, k, depth)`` after the k-th failure (depth None: the wipe-out).

    A generator, so that a caller with a clock can stop it at a budget and show progress
    while this module stays pure. Failures that leave the survivors' top positions covering
    every type are answered by ``rectlr.TopCover`` in O(r) (exactly what ``decide`` would
    answer: the fixed phase, nothing changed); only the others pay for ``decide``.
    """
    layout = placement.make_layout(groups, redundancy)
    rng = np.random.default_rng(seed)
    for trial in range(trials):
        live = np.ones(groups, dtype=bool)
        stacks, depth = initial_stacks(layout), 1
        cover = TopCover(stacks, live, depth)
        for k, g in enumerate(rng.permutation(groups), start=1):
            g = int(g)
            if cover.survives([g]):
                live[g] = False
                cover.remove([g])
                yield trial, k, depth
                continue
            live[g] = False
            d = decide(layout, live, stacks, depth)
            if not isinstance(d, Plan):
                yield trial, k, None
                break
            stacks, depth = d.stacks, d.depth
            cover = TopCover(stacks, live, depth)
            yield trial, k, depth


class MCSums:
    """Running sums over ``controller_walk``'s events; ``result()`` at any point."""

    def __init__(self, groups: int, redundancy: int) -> None:
        self.groups, self.redundancy = groups, redundancy
        self.sums = np.zeros(groups + 1)
        self.counts = np.zeros(groups + 1)
        self.fatal: list[int] = []
        self.seen = 0
        self.open = False                  # inside a trial that has not reached its wipe-out

    def add(self, trial: int, k: int, depth: int | None) -> None:
        if k == 1:
            self.sums[0] += 1
            self.counts[0] += 1
        self.seen += 1
        if depth is None:
            self.fatal.append(k)
            self.open = False
            return
        self.open = True
        self.sums[k] += depth
        self.counts[k] += 1

    def result(self) -> ControllerMC:
        seen = self.counts > 0
        depth_after = self.sums[seen] / self.counts[seen] if seen.any() else np.ones(1)
        m = min(len(depth_after), max(1, int(math.floor(mu(self.groups, self.redundancy)))))
        bound = np.array([depth_bound(self.groups, k) for k in range(m)])
        excess = float(np.mean(depth_after[:m] - bound))
        fatal = float(np.mean(self.fatal)) if self.fatal else math.nan
        return ControllerMC(fatal, tuple(float(x) for x in depth_after), excess,
                            len(self.fatal), self.seen, not self.open)


@lru_cache(maxsize=256)
def controller_montecarlo(groups: int, redundancy: int, trials: int = 8,
                          seed: int = 0) -> ControllerMC:
    """Every trial of ``controller_walk`` to its wipe-out, summarised."""
    acc = MCSums(groups, redundancy)
    for event in controller_walk(groups, redundancy, trials, seed):
        acc.add(*event)
    return acc.result()


def overhead(groups: int, redundancy: int, trials: int = 8, seed: int = 0) -> float:
    """Lower bound plus the excess measured over the real controller (mean stacks/step)."""
    return overhead_lower_bound(groups, redundancy) + controller_montecarlo(
        groups, redundancy, trials, seed).excess_over_bound


def ckpt_period(t_save: float, t_fail: float, t_restart: float) -> float:
    """Saxena's optimal checkpoint period T_c* (seconds of wall clock between saves)."""
    return t_save + math.sqrt(t_save ** 2 + 2.0 * t_save * (t_fail + t_restart))


def availability(t_ckpt: float, t_save: float, t_fail: float, t_restart: float) -> float:
    """Useful fraction of wall clock with a checkpoint every t_ckpt seconds."""
    if t_ckpt <= t_save:
        return 0.0
    return (1.0 - t_save / t_ckpt) * t_fail / (t_fail + t_restart + t_ckpt / 2.0)


def best_availability(t_save: float, t_fail: float, t_restart: float) -> float:
    """A*: availability at the optimal period T_c*."""
    return availability(ckpt_period(t_save, t_fail, t_restart), t_save, t_fail, t_restart)


def young(t_save: float, mtbf: float) -> float:
    """Young's first-order checkpoint interval sqrt(2 * delta * M)."""
    return math.sqrt(2.0 * t_save * mtbf)


def daly(t_save: float, mtbf: float, t_restart: float = 0.0) -> float:
    """Daly's higher-order interval (2006), with the restart time added to the MTBF."""
    m = mtbf + t_restart
    if t_save >= 2.0 * m:
        return m
    x = t_save / (2.0 * m)
    return math.sqrt(2.0 * t_save * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - t_save


@lru_cache(maxsize=4096)
def expected_max_normal(n: int) -> float:
    """E[max of n i.i.d. standard normals], by quadrature (0 for n = 1)."""
    if n <= 1:
        return 0.0
    x = np.linspace(-8.0, 8.0, 16001)
    cdf = ndtr(x)
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    dens = n * pdf * cdf ** (n - 1)
    return float(np.sum(x * dens) * (x[1] - x[0]))


def step_time(sc: Scenario, stacks: float, jitter_scale: float | None = None) -> float:
    """Expected synchronous step: the slowest of N groups computing ``stacks`` stacks, then
    the all-reduce. Each stack's time is T_compute x N(1, jitter^2); ``jitter_scale`` is the
    standard deviation of one group's total in units of T_compute (sqrt(stacks) when each
    stack jitters on its own, as in SPARe; stacks when one draw scales r-fold work, as in
    replication)."""
    sd = math.sqrt(stacks) if jitter_scale is None else jitter_scale
    em = expected_max_normal(sc.groups)
    return sc.t_compute * (stacks + sc.jitter * sd * em) + sc.allreduce


# -- what the paper's J leaves out ---------------------------------------------------------
# The paper's J charges a wipe-out T_r of downtime, lets failures arrive every MTBF whatever
# has failed already, and charges nothing for a masked failure. The simulation (and a real
# cluster) differs in three ways, each derived below and tested against the simulator.


def survival(groups: int, redundancy: int, k: np.ndarray | float, sets: float | None = None):
    """P(no wipe-out after k distinct failures) ~ exp(-M (k/N)^r): M = N shard types for
    SPARe (each lost when all r hosts are), M = N/r replica sets for replication. Its sum
    over k is mu (the integral gives Gamma(1 + 1/r) N^(1-1/r) (N/M)^(1/r))."""
    m = groups if sets is None else sets
    return np.exp(-m * (np.asarray(k, dtype=float) / groups) ** redundancy)


def time_to_wipeout(groups: int, redundancy: int, mtbf: float,
                    sets: float | None = None) -> float:
    """Expected wall time from a restart to the wipe-out that ends the epoch.

    Masked groups stop failing, so with j groups dead failures arrive at rate (N - j) / (N m):
    the (j+1)-th failure waits m N / (N - j) on average, and it is waited for only if the
    epoch survived the first j (probability survival(j)). Hence
    T_f = m * sum_j survival(j) * N / (N - j), against the paper's mu * m: the late failures
    of a long epoch come slower, about -ln(1 - x) / x times with x = mu / N masked at the end
    (1.39x at x = 1/2, 1.75x at (600, 20)).
    """
    j = np.arange(groups)
    return float(mtbf * np.sum(survival(groups, redundancy, j, sets) * groups / (groups - j)))


def nonfixed_decisions(groups: int, redundancy: int) -> float:
    """Expected masked failures per epoch that the controller cannot answer in place (phase
    free or mcmf: the step must patch-compute before its all-reduce is retried).

    With j groups dead and depth S = c(j), a failed group's top S types each have S - 1 other
    top-S holders, dead with probability ~(j/N) each, so the failure needs a reorder with
    probability 1 - (1 - (j/N)^(S-1))^S: always at depth 1 (the first failure), ~2j/N at
    depth 2. Summed over the failures that are masked (survival(j + 1)).
    """
    j = np.arange(groups - 1)
    depth = -(-groups // (groups - j))
    p = 1.0 - (1.0 - (j / groups) ** (depth - 1)) ** depth
    return float(np.sum(survival(groups, redundancy, j + 1) * p))


def restart_expected(sc: Scenario, points_per_restart: int = 400, horizon: int = 12) -> float:
    """Expected length of a global restart (see ``_restart_expected``); infinite when the
    slowest group is still not done after ``horizon`` T_r (failures come faster than T_r)."""
    shape = sc.weibull_shape if sc.fail_dist == "weibull" else 1.0
    return _restart_expected(sc.groups, sc.t_restart, sc.fail_dist, shape, sc.group_mtbf,
                             points_per_restart, horizon)


@lru_cache(maxsize=1024)
def _restart_expected(groups: int, tr: float, dist: str, shape: float, group_mtbf: float,
                      points_per_restart: int, horizon: int) -> float:
    """Expected length of a global restart: the slowest of N groups, each of which must stay
    failure-free for T_r and starts its T_r again whenever it fails meanwhile.

    One group's completion time C: its first failure Y after the restart begins is the
    residual life of a renewal process already running (equilibrium residual, CDF
    F_Y(y) = (1/m_g) int_0^y (1 - F_X), for a Weibull(k, lambda) interval X that is the
    regularised incomplete gamma P(1/k, (y/lambda)^k)); later ones are fresh intervals X.
    C = T_r if Y >= T_r, else Y + C', where C' (fresh) solves the renewal equation
        G(t) = P(X >= T_r) 1[t >= T_r] + int_0^T_r G(t - x) dF_X(x),
    and F_C(t) = P(Y >= T_r) 1[t >= T_r] + int_0^T_r G(t - y) dF_Y(y). The groups are
    independent, so E[R] = int_0^inf (1 - F_C(t)^N) dt. Solved on a grid of T_r /
    ``points_per_restart`` up to ``horizon`` T_r. About 2 T_r at the paper's scenario: ~T_r/MTBF
    = 12 groups fail during the first T_r, and the last of them starts its T_r late.
    """
    if tr <= 0:
        return 0.0
    n_r = points_per_restart
    h = tr / n_r
    x = h * np.arange(n_r + 1)
    if dist == "weibull":
        k = shape
        lam = group_mtbf / math.gamma(1.0 + 1.0 / k)
        f_x = -np.expm1(-(x / lam) ** k)
        f_y = gammainc(1.0 / k, (x / lam) ** k)
    else:
        f_x = f_y = -np.expm1(-x / group_mtbf)
    p, q = np.diff(f_x), np.diff(f_y)             # masses on ((i-1)h, ih], i = 1..n_r
    s_x, s_y = 1.0 - f_x[-1], 1.0 - f_y[-1]
    size = horizon * n_r + 1
    g, fc = np.zeros(size), np.zeros(size)
    for j in range(size):
        past = g[max(0, j - n_r):j][::-1]          # G(t_j - h), G(t_j - 2h), ...
        g[j] = (s_x if j >= n_r else 0.0) + float(p[:past.size] @ past)
        fc[j] = (s_y if j >= n_r else 0.0) + float(q[:past.size] @ past)
    all_done = np.exp(groups * np.log(np.clip(fc, 1e-300, 1.0)))
    if all_done[-1] < 0.999:
        return math.inf
    return float(h * np.sum(1.0 - all_done))


def time_weighted_step(sc: Scenario, redundancy: int, excess: float = 0.0) -> float:
    """Mean wall time per committed step over an epoch, with the depth c(j) weighted by the
    time spent at j dead groups rather than equally per failure.

    The paper's S averages c(j) once per failure; but the epoch dwells at j dead for
    survival(j) * m N / (N - j), longer at high j, where the depth is highest (the simulated
    depth exceeds the bound at high r for this reason). Steps at j are that time over
    step(c(j)), so the mean step is the time-weighted harmonic mean of step(c(j)).
    ``excess`` (the controller's measured excess over c) is added to every c(j).
    """
    n = sc.groups
    j = np.arange(n)
    w = survival(n, redundancy, j) * n / (n - j)
    keep = w > 1e-12 * w[0]
    depth = (-(-n // (n - j[keep]))).astype(float) + excess
    steps = np.array([step_time(sc, float(d)) for d in np.unique(depth)])
    per = steps[np.searchsorted(np.unique(depth), depth)]
    return float(np.sum(w[keep]) / np.sum(w[keep] / per))


@dataclass(frozen=True)
class Costs:
    """The corrected epoch: wall time to the wipe-out, the restart, and what masking costs."""

    t_fail: float          # restart end -> wipe-out (s)
    restart: float         # E[R] (s)
    masked_overhead: float # time masked failures add to an epoch (s)


def epoch_costs(sc: Scenario, redundancy: int, step: float, strategy: str = "spare") -> Costs:
    """``time_to_wipeout``, ``restart_expected`` and the masked failures' own cost.

    A masked failure breaks the all-reduce halfway (0.5 T_a), shrinks the communicator
    (t_shrink), patch-computes one stack when it needs a reorder (``nonfixed_decisions``),
    and retries the all-reduce, which takes the place of the step's own. Failures noticed in
    the same step share one such round: with rho = step / MTBF failures per step (Poisson),
    rounds per failure are beta = (1 - e^-rho) / rho. Under ``paper_shortcut`` a round
    answered in place commits without the retry: it then costs t_shrink - 0.5 T_a.
    """
    n = sc.groups
    if strategy == "ckpt":
        return Costs(sc.system_mtbf, restart_expected(sc), 0.0)
    sets = None if strategy == "spare" else n / redundancy
    t_fail = time_to_wipeout(n, redundancy, sc.system_mtbf, sets)
    masked = max(0.0, float(np.sum(survival(n, redundancy, np.arange(n), sets))) - 1.0)
    rho = step / sc.system_mtbf
    rounds = masked * (-math.expm1(-rho) / rho if rho > 0 else 1.0)
    reorders = min(rounds, nonfixed_decisions(n, redundancy)) if strategy == "spare" else 0.0
    half = sc.allreduce_fail_scale * sc.allreduce
    in_place = sc.t_shrink + (half - sc.allreduce if sc.paper_shortcut else half)
    patch = half + sc.t_shrink + sc.t_compute
    return Costs(t_fail, restart_expected(sc),
                 (rounds - reorders) * in_place + reorders * patch)


@dataclass(frozen=True)
class StrategyTheory:
    """Everything the closed forms say about one strategy at one redundancy.

    ``availability`` and ``ttt_over_t0`` are the corrected model (``epoch_costs``: the
    restart as the slowest of N groups with resets, failures slowing as groups are masked,
    masked failures' own cost); ``*_paper`` are the paper's J with T_f = mu m and T_r as given.
    """

    redundancy: int
    mu: float
    overhead_lower_bound: float
    overhead: float
    ckpt_period_s: float
    ckpt_every_steps: int
    availability: float
    ttt_over_t0: float
    t_fail_s: float = 0.0            # restart end -> wipe-out, corrected (paper: mu * MTBF)
    restart_s: float = 0.0           # expected restart, corrected (paper: T_r)
    masked_overhead_s: float = 0.0   # masked failures' own cost per epoch
    availability_paper: float = 0.0
    ttt_over_t0_paper: float = 0.0


def corrected_availability(sc: Scenario, t_ckpt: float, c: Costs) -> float:
    """(1 - T_s/T_c) T_f / (T_f + E[R] + 0.5 T_a + T_c/2): the paper's A with the corrected
    epoch and the wipe-out's broken half all-reduce. Like the simulator's availability, it
    counts masked failures as up time; their cost enters J through ``masking_efficiency``."""
    if not (math.isfinite(t_ckpt) and math.isfinite(c.restart)) or t_ckpt <= sc.t_save:
        return 0.0
    down = c.restart + sc.allreduce_fail_scale * sc.allreduce
    return (1.0 - sc.t_save / t_ckpt) * c.t_fail / (c.t_fail + down + t_ckpt / 2.0)


def masking_efficiency(c: Costs) -> float:
    """Share of an epoch's up time that trains: (T_f - O_f) / T_f."""
    return max(0.0, 1.0 - c.masked_overhead / c.t_fail) if c.t_fail > 0 else 0.0


def _finish(sc: Scenario, r: int, m: float, lb: float, ov: float, step: float,
            strategy: str, step_paper: float | None = None) -> StrategyTheory:
    base = sc.t_compute + sc.allreduce
    t_fail = m * sc.system_mtbf
    a_paper = best_availability(sc.t_save, t_fail, sc.t_restart)
    step_paper = step if step_paper is None else step_paper
    j_paper = step_paper / (base * a_paper) if a_paper > 0 else math.inf
    c = epoch_costs(sc, r, step, strategy)
    # Same form as the paper's A in T_c, so Saxena's maximiser holds with T_f + E[R] + T_a/2
    # in place of T_f + T_r.
    tc = ckpt_period(sc.t_save, c.t_fail,
                     c.restart + sc.allreduce_fail_scale * sc.allreduce)
    a = corrected_availability(sc, tc, c)
    eff = masking_efficiency(c)
    j = step / (base * a * eff) if a * eff > 0 else math.inf
    every = max(1, int(tc // step)) if math.isfinite(tc) else 0
    return StrategyTheory(r, m, lb, ov, tc, every, a, j, c.t_fail, c.restart,
                          c.masked_overhead, a_paper, j_paper)


def spare(sc: Scenario, redundancy: int, mc_trials: int = 8, seed: int = 0,
          excess: float | None = None) -> StrategyTheory:
    """SPARe + checkpointing at redundancy r (mc_trials = 0 skips the Monte-Carlo excess;
    ``excess`` gives one measured elsewhere, e.g. within a budget)."""
    placement.check(sc.groups, redundancy)
    lb = overhead_lower_bound(sc.groups, redundancy)
    if excess is not None:
        ov = lb + excess
    else:
        ov = overhead(sc.groups, redundancy, mc_trials, seed) if mc_trials > 0 else lb
    return _finish(sc, redundancy, mu(sc.groups, redundancy), lb, ov,
                   time_weighted_step(sc, redundancy, ov - lb), "spare",
                   step_paper=step_time(sc, ov))


def replication(sc: Scenario, redundancy: int) -> StrategyTheory:
    """Replication (N/r replica sets, r-fold compute) + checkpointing."""
    if not 1 <= redundancy <= sc.groups:
        raise placement.PlacementError(
            f"redundancy {redundancy} outside [1, {sc.groups}] for replication")
    r = float(redundancy)
    return _finish(sc, redundancy, mu_replication(sc.groups, redundancy), r, r,
                   step_time(sc, r, jitter_scale=r), "rep")


def checkpoint_only(sc: Scenario) -> StrategyTheory:
    """Checkpoint/restart alone: every failure is a restart (mu = 1, one stack per step)."""
    return _finish(sc, 1, 1.0, 1.0, 1.0, step_time(sc, 1.0), "ckpt")


def ckpt_every(sc: Scenario, strategy: str, redundancy: int) -> int:
    """Checkpoint interval in steps: T_c* over the expected step time of the strategy (the
    whole run when T_c* is infinite: a restart that never ends makes saving pointless)."""
    if strategy == "spare":
        k = spare(sc, redundancy, mc_trials=0).ckpt_every_steps
    elif strategy == "rep":
        k = replication(sc, redundancy).ckpt_every_steps
    else:
        k = checkpoint_only(sc).ckpt_every_steps
    return k or sc.steps


def caveats(sc: Scenario, th: StrategyTheory) -> list[str]:
    """Why an answer may mean little, one line each (empty when the closed forms apply)."""
    out = []
    step = sc.t_compute + sc.allreduce
    if sc.system_mtbf < step:
        out.append(f"the system MTBF ({sc.system_mtbf:g} s) is shorter than one failure-free step "
                   f"({step:g} s): nearly every step sees failures, which these closed forms "
                   "(failures one at a time between steps) do not model; simulate instead")
    if not math.isfinite(th.restart_s):
        out.append(f"a restart never ends: with a system MTBF of {sc.system_mtbf:g} s some group "
                   f"fails within every T_r = {sc.t_restart:g} s window")
    if not math.isfinite(th.ttt_over_t0) or th.ttt_over_t0 > 100:
        out.append(f"TTT/T0 = {th.ttt_over_t0:.3g} at r = {th.redundancy}: training does not "
                   "progress in this scenario")
    return out


def r_star_closed_form(groups: int) -> int:
    """floor(log2 N + gamma / ln 2): where mu(N, r) reaches N/2 with S ~ 2."""
    return int(math.floor(math.log2(groups) + R_STAR_OFFSET))


def spare_sweep(sc: Scenario, mc_trials: int = 0) -> list[StrategyTheory]:
    """SPARe theory at every redundancy the layout supports (r >= 2)."""
    return [spare(sc, r, mc_trials) for r in range(2, placement.max_redundancy(sc.groups) + 1)]


def replication_sweep(sc: Scenario, r_max: int = 20) -> list[StrategyTheory]:
    return [replication(sc, r) for r in range(2, min(r_max, sc.groups) + 1)]


def best(points: list[StrategyTheory]) -> StrategyTheory:
    """The exact minimiser of J over the given redundancies."""
    return min(points, key=lambda p: p.ttt_over_t0)
