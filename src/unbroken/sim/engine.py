"""Discrete-event simulation of synchronous data-parallel training at cluster scale.

Why this shape
--------------
The SPARe authors validated their closed forms with a SimGrid simulator that takes minutes to
build and runs one actor per group. Their semantics fit in a loop over step attempts, because a
synchronous step is one barrier: what matters is *when* each group's renewal process fires
relative to the step's check points, and what the controller decides then. So the simulator
keeps one next-failure time per group and jumps from step to step, touching Python only where
something happens (a failure, a checkpoint, a restart). The slowest of n jittered groups is
drawn exactly, by inverting the CDF of the maximum of n normals.

Semantics (spare.md §6–§7, and the authors' ``spare``/``dpr``/``dp`` programs):

* Each group has its own renewal process (Weibull or exponential, per-group MTBF = MTBF x N).
  A failure is noticed at the next check point: before each stack's compute, at the
  all-reduce, and (leader only) at the checkpoint; the next interval is drawn from then.
* A failed group stays inactive (and stops failing) until the next global restart.
* A step that saw a failure pays ``allreduce_fail_scale`` x T_a for the all-reduce that broke,
  a communicator shrink (0.1 s) per masked failure, and then a retried all-reduce (T_a) on the
  shrunk communicator. For SPARe the controller is ``core.rectlr.decide`` — the same function
  the runtime calls. Phase ``fixed`` needs no recompute, so the all-reduce is retried at once;
  ``free``/``mcmf`` patch-compute the reassigned shards first. A failure noticed at the retry
  goes round the controller again. Replication masks when every replica set keeps a member,
  then retries the same way.
* ``Scenario.paper_shortcut`` restores the authors' accounting instead: a step answered in the
  fixed phase (or masked by replication) commits right after the shrink, with no retried
  all-reduce, and a checkpoint whose writer failed is skipped. A masked failure then costs
  *less* than a failure-free all-reduce (0.5 T_a + 0.1 s against T_a), so with a long
  all-reduce failures make training faster — physically impossible, which is why it is not
  the default. It exists to reproduce the published table (README, fidelity).
* A wipe-out (or any failure, for ``ckpt``; an emptied replica set, for ``rep``) starts a
  global restart: every group recovers for T_r, a failure during its recovery restarts its
  timer, the restart ends with the slowest group, and training resumes from the last
  checkpoint with the original layout and depth 1.
* A checkpoint every k committed steps (and at the end) costs T_s; a leader failure at that
  point counts as a failure at the next all-reduce, and the next live group (every one holds
  the model state) writes the checkpoint.
* Never faster than failure-free: every committed step pays at least its compute and one
  whole all-reduce, and a restart or a rollback only adds time (tests/sim/test_properties.py).
* Availability = 1 - (restart time + shrink time) / wall clock; rework and checkpoints count
  as up time. TTT/T0 = wall clock / (steps x (T_compute + T_a)).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
from scipy.special import ndtri

from unbroken.core import placement, theory
from unbroken.core.rectlr import FIXED, Plan, TopCover, decide, initial_stacks
from unbroken.core.scenario import Scenario

STRATEGIES = ("ckpt", "rep", "spare")
_CHUNK = 4096


@dataclass(frozen=True)
class RunResult:
    strategy: str
    redundancy: int
    seed: int
    ckpt_every: int
    ttt_over_t0: float
    availability: float
    wipeouts: int
    masked_failures: int
    mean_stack_depth: float
    failures_per_wipeout: float | None   # simulated mu (failures in epochs ended by a wipe-out)
    wall_clock_s: float
    restart_s: float
    committed_steps: int                 # including steps later rolled back
    completed: bool                      # False: stopped at the wall-clock cap (TTT is a floor)
    controller_phases: dict[str, int]
    stopped: str | None = None           # "cap" (100 x T0) or "budget" (wall time) when not done
    progress: float = 1.0                # steps reached / steps asked (rollbacks count back)

    def as_dict(self) -> dict:
        return asdict(self)


class _Draws:
    """Buffered random draws: failure intervals and maxima of n standard normals.

    Two independent streams spawned from the seed, one for failures and one for compute
    jitter (common random numbers): two runs with the same seed that differ only in their
    failures (another MTBF, no failures at all) see the same jitter sequence, and failure
    intervals are unit draws scaled by the per-group mean, so a shorter MTBF shortens every
    interval of the same seed in proportion. Comparisons between such runs then measure the
    failures, not the noise.
    """

    def __init__(self, sc: Scenario, seed: int) -> None:
        fail_ss, jit_ss = np.random.SeedSequence(seed).spawn(2)
        self.rng = np.random.default_rng(fail_ss)
        self.rng_jit = np.random.default_rng(jit_ss)
        self.sc = sc
        self._iv = np.empty(0)
        self._iv_i = 0
        self._u = np.empty(0)
        self._u_i = 0

    def _refill_intervals(self) -> None:
        sc = self.sc
        # a group's interval is the first of its R ranks' (a rank's failure is the group's)
        r = sc.ranks_per_group
        if sc.fail_dist == "weibull":
            self._iv = self.rng.weibull(sc.weibull_shape, (_CHUNK, r)).min(axis=1) \
                * sc.rank_weibull_scale
        else:
            self._iv = self.rng.standard_exponential((_CHUNK, r)).min(axis=1) * sc.rank_mtbf
        self._iv_i = 0

    def interval(self) -> float:
        if self._iv_i >= self._iv.size:
            self._refill_intervals()
        v = self._iv[self._iv_i]
        self._iv_i += 1
        return float(v)

    def intervals(self, k: int) -> np.ndarray:
        """The next k intervals of the same sequence ``interval`` walks, in one copy."""
        out = np.empty(k)
        i = 0
        while i < k:
            if self._iv_i >= self._iv.size:
                self._refill_intervals()
            take = min(k - i, self._iv.size - self._iv_i)
            out[i:i + take] = self._iv[self._iv_i:self._iv_i + take]
            self._iv_i += take
            i += take
        return out

    def max_normal(self, n: int) -> float:
        """One draw of max(Z_1..Z_n), Z standard normal: Phi^-1(U^(1/n))."""
        if self._u_i >= self._u.size:
            self._u = self.rng_jit.random(_CHUNK)
            self._u_i = 0
        u = self._u[self._u_i]
        self._u_i += 1
        return float(ndtri(u ** (1.0 / n))) if n > 1 else float(ndtri(u))


def validate(sc: Scenario, strategy: str, redundancy: int) -> None:
    """Raise ValueError naming the bad value for an unknown strategy or impossible r."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
    if strategy == "spare":
        placement.check(sc.groups, redundancy)
    elif strategy == "rep" and not 1 <= redundancy <= sc.groups:
        raise ValueError(f"redundancy {redundancy} outside [1, {sc.groups}] for replication")


#: A run that has not finished by this multiple of T0 is stopped (checkpoint/restart alone at
#: a 5-minute MTBF and a 60-minute restart "barely progresses": it would take centuries).
MAX_TTT_OVER_T0 = 100.0


def simulate(sc: Scenario, strategy: str, redundancy: int = 1, seed: int = 0,
             ckpt_every: int | None = None,
             max_ttt_over_t0: float = MAX_TTT_OVER_T0, deadline: float | None = None,
             on_progress: Callable[[int], None] | None = None) -> RunResult:
    """Run one seeded simulation to ``sc.steps`` committed steps and return its metrics.

    A run still unfinished at ``max_ttt_over_t0`` x T0 stops there with ``completed=False``
    and ``stopped="cap"``; one still unfinished at ``deadline`` (``time.monotonic()``) stops
    with ``stopped="budget"``. Either way its TTT/T0 is a lower bound and ``progress`` says
    how far it got. ``on_progress(step)`` is called about every 0.2 s of computing.
    """
    validate(sc, strategy, redundancy)
    if strategy == "ckpt":
        redundancy = 1
    k_ckpt = ckpt_every or theory.ckpt_every(sc, strategy, redundancy)
    return _Run(sc, strategy, redundancy, seed, k_ckpt).run(max_ttt_over_t0 * sc.t0, deadline,
                                                            on_progress)


class _OutOfBudget(Exception):
    """The wall-clock deadline passed inside a step (a step at N = 100,000 can take seconds)."""


class _Run:
    def __init__(self, sc: Scenario, strategy: str, r: int, seed: int, k_ckpt: int) -> None:
        self.sc, self.strategy, self.r, self.seed, self.k_ckpt = sc, strategy, r, seed, k_ckpt
        self.deadline: float | None = None
        self.t_cap = math.inf
        self.n = sc.groups
        self.draws = _Draws(sc, seed)
        self.t = 0.0
        first = self.draws.intervals(self.n)
        self.next_fail = first.copy()            # every group's next failure time
        self.nf_active = first.copy()            # the same, inf where inactive or pending
        self.active = np.ones(self.n, dtype=bool)
        self.pending: list[int] = []             # leader that failed at a checkpoint
        self.layout = placement.make_layout(self.n, r) if strategy == "spare" else None
        self.reset_layout()
        self.step = 0
        self.last_ckpt = 0
        # metrics
        self.restart_s = 0.0
        self.shrinks = 0
        self.wipeouts = 0
        self.masked = 0
        self.depth_sum = 0.0
        self.committed = 0
        self.epoch_failures = 0
        self.fatal_failures = 0
        self.phases: dict[str, int] = {}

    # -- state helpers ---------------------------------------------------------------------
    def reset_layout(self) -> None:
        self.depth = 1
        if self.layout is not None:
            self.stacks = initial_stacks(self.layout)
            self.cover = TopCover(self.stacks, self.active, self.depth)

    def fail_due(self, checks: list[float]) -> list[int]:
        """Active groups whose failure time has passed by the last check point; each is noticed
        at the first check point at or after its failure time and rescheduled from there."""
        t_last = checks[-1]
        if self.nf_active.min() > t_last:
            return []
        due = np.flatnonzero(self.nf_active <= t_last)
        for g in due:
            f = self.next_fail[g]
            seen = next(c for c in checks if c >= f)
            self.next_fail[g] = seen + self.draws.interval()
            self.nf_active[g] = math.inf
        return [int(g) for g in due]

    def deactivate(self, groups: list[int]) -> None:
        for g in groups:
            self.active[g] = False
            self.nf_active[g] = math.inf

    def compute_time(self, stacks_per_group: float, n: int, scale: float) -> float:
        """Slowest of n groups, each computing ``stacks_per_group`` stacks (sd ``scale``)."""
        if n <= 0 or stacks_per_group <= 0:
            return 0.0
        return self.sc.t_compute * (stacks_per_group
                                    + self.sc.jitter * scale * self.draws.max_normal(n))

    # -- restart ---------------------------------------------------------------------------
    def restart(self) -> None:
        t_r = self.sc.t_restart
        start = self.t
        now = np.full(self.n, start)
        nf = self.next_fail
        while True:
            # A group still recovering at the cap stops being redrawn: the run ends there
            # (stopped="cap"). At a per-group MTBF far below T_r a restart practically never
            # finishes (every group needs one interval longer than T_r), and this loop would
            # spin on it past any cap.
            hit = np.flatnonzero((nf < now + t_r) & (now < self.t_cap))
            if hit.size == 0:
                break
            now[hit] = np.maximum(now[hit], nf[hit])
            nf[hit] = nf[hit] + self.draws.intervals(hit.size)
        self.t = float(np.max(now + t_r))
        self.restart_s += self.t - start
        self.wipeouts += 1
        self.fatal_failures += self.epoch_failures
        self.epoch_failures = 0
        self.active[:] = True
        self.nf_active = nf.copy()
        self.pending = []
        self.reset_layout()
        self.step = self.last_ckpt

    # -- one step --------------------------------------------------------------------------
    def take_pending(self, failed: list[int]) -> list[int]:
        if self.pending:
            failed = sorted(set(failed) | set(self.pending))
            self.pending = []
        return failed

    def step_ckpt_or_rep(self) -> bool:
        """One step for ckpt / rep. Returns True if it committed."""
        sc, r = self.sc, self.r
        n_act = int(self.active.sum())
        t0 = self.t
        t_ar = t0 + self.compute_time(r, n_act, r)
        failed = self.take_pending(self.fail_due([t0, t_ar]))
        while failed:
            self.check_budget()
            self.t = t_ar + sc.allreduce_fail_scale * sc.allreduce
            self.epoch_failures += len(failed)
            if self.strategy != "rep" or not self.replicas_cover(failed):
                self.restart()
                return False
            self.deactivate(failed)
            self.masked += len(failed)
            self.shrinks += 1
            self.t += sc.t_shrink
            if sc.paper_shortcut:
                return True             # the authors' shortcut: commit with no retry
            t_ar = self.t               # retry the all-reduce on the shrunk communicator
            failed = self.fail_due([t_ar])
        self.t = t_ar + sc.allreduce
        return True

    def check_budget(self) -> None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise _OutOfBudget

    def replicas_cover(self, failed: list[int]) -> bool:
        """Does every replica set keep a live member once ``failed`` are gone?"""
        live = self.active.copy()
        live[failed] = False
        sets = np.arange(self.n) // self.r
        n_sets = -(-self.n // self.r)
        return np.count_nonzero(np.bincount(sets[live], minlength=n_sets)) == n_sets

    def step_spare(self) -> bool:
        sc = self.sc
        t0 = self.t
        n_act = int(self.active.sum())
        s = self.depth
        checks = [t0 + i * sc.t_compute for i in range(s)]
        t_ar = t0 + self.compute_time(s, n_act, math.sqrt(s))
        checks.append(t_ar)
        failed = self.take_pending(self.fail_due(checks))
        while failed:
            self.check_budget()
            self.t = t_ar + sc.allreduce_fail_scale * sc.allreduce
            self.epoch_failures += len(failed)
            if self.cover.survives(failed):
                # Phase 0 in O(r) per failure: exactly decide's answer (fixed, unchanged).
                phase = FIXED
                self.cover.remove(failed)
                self.deactivate(failed)
            else:
                live = self.active.copy()
                live[failed] = False
                d = decide(self.layout, live, self.stacks, self.depth)
                if not isinstance(d, Plan):
                    self.phases["wipeout"] = self.phases.get("wipeout", 0) + 1
                    self.restart()
                    return False
                phase = d.phase
                self.deactivate(failed)
                self.stacks, self.depth = d.stacks, d.depth
                self.cover = TopCover(self.stacks, self.active, self.depth)
            self.phases[phase] = self.phases.get(phase, 0) + 1
            self.masked += len(failed)
            self.shrinks += 1
            self.t += sc.t_shrink
            if phase == FIXED:
                if sc.paper_shortcut:
                    return True         # the authors' shortcut: commit with no retry
                # Nothing to recompute, but the gradients never reached everyone: retry the
                # all-reduce on the shrunk communicator.
                t_ar = self.t
                failed = self.fail_due([t_ar])
                continue
            # Patch compute, then retry the all-reduce.
            sizes = [len(v) for v in d.patch.values()]
            most = max(sizes, default=0)
            n_most = sizes.count(most)
            t1 = self.t
            t_ar = t1 + self.compute_time(most, n_most, math.sqrt(most))
            failed = self.fail_due([t1, t_ar])
        self.t = t_ar + sc.allreduce
        return True

    def maybe_checkpoint(self) -> None:
        if self.step % self.k_ckpt and self.step != self.sc.steps:
            return
        leader = int(np.argmax(self.active))
        if self.nf_active[leader] <= self.t:
            self.next_fail[leader] = self.t + self.draws.interval()
            self.nf_active[leader] = math.inf
            self.pending = [leader]
            if self.sc.paper_shortcut:
                return                  # the authors' shortcut: the save is skipped
            # Every live group holds the model state: the next one writes the checkpoint.
        self.t += self.sc.t_save
        self.last_ckpt = self.step

    def run(self, t_cap: float, deadline: float | None = None,
            on_progress: Callable[[int], None] | None = None) -> RunResult:
        sc = self.sc
        one_step = self.step_spare if self.strategy == "spare" else self.step_ckpt_or_rep
        depth_of = (lambda: self.depth) if self.strategy == "spare" else (lambda: self.r)
        stopped = None
        self.deadline, self.t_cap = deadline, t_cap
        next_report = time.monotonic() + 0.2
        while self.step < sc.steps:
            if self.t >= t_cap:
                stopped = "cap"
                break
            if deadline is not None or on_progress is not None:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    stopped = "budget"
                    break
                if on_progress is not None and now >= next_report:
                    on_progress(self.step)
                    next_report = now + 0.2
            d = depth_of()
            try:
                done = one_step()
            except _OutOfBudget:          # mid-step: the step is left uncommitted
                stopped = "budget"
                break
            if done:
                self.depth_sum += d
                self.committed += 1
                self.step += 1
                self.maybe_checkpoint()
        if on_progress is not None:
            on_progress(self.step)
        down = self.restart_s + self.shrinks * sc.t_shrink
        mu_sim = self.fatal_failures / self.wipeouts if self.wipeouts else None
        return RunResult(
            strategy=self.strategy, redundancy=self.r, seed=self.seed, ckpt_every=self.k_ckpt,
            ttt_over_t0=self.t / sc.t0, availability=1.0 - down / self.t,
            wipeouts=self.wipeouts, masked_failures=self.masked,
            mean_stack_depth=self.depth_sum / max(1, self.committed),
            failures_per_wipeout=mu_sim, wall_clock_s=self.t, restart_s=self.restart_s,
            committed_steps=self.committed, completed=self.step >= sc.steps,
            controller_phases=dict(self.phases), stopped=stopped,
            progress=self.step / sc.steps)
