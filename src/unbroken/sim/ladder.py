"""What ETTR a recovery ladder gives on a cluster: a seeded discrete-event simulation.

Why
---
``core.ladder`` says *which* rung answers a fault; it cannot say what that policy is worth.
ETTR depends on how often each kind of fault comes, how long it takes to notice, what each rung
costs and whether it actually cures the fault — a retry cures a transient crash but not a
dead GPU, only a rollback cures a bad code version. This module plays a job through its faults
with the *same* ``core.ladder.decide`` / ``advance`` pair the runtime calls (no copy of the
policy), masking with the same ``core.rectlr.decide``, and books every second of wall clock
to productive work, checkpoint saves, detection or a rung. So ``unbroken plan --ladder``
answers "what ETTR would this ladder give on my cluster", and what a cheaper or stingier policy
would change.

The fault model and its modelling choices (arrivals, the default mix, hidden causes, detection
latencies, rung costs): :mod:`unbroken.sim.ladder_model`.

Pure: no I/O; one seeded ``numpy`` Generator, so one seed gives one result.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import replace

import numpy as np

from unbroken.core import ladder, placement, rectlr, standby, theory
from unbroken.core.ladder import Committed, Fault, FaultKind, LadderPolicy, Rung, Tried
from unbroken.core.scenario import Scenario
from unbroken.sim.ladder_model import (DEFAULT_DETECT, DEFAULT_IMPLICIT_CAUSES, DEFAULT_MIX,
                                       DEFAULT_XID_ACTIONS, K, LadderConfig, LadderResult,
                                       COST_NAMES, CURES, NAMED_KINDS, TO_WIPE_OUT, XID_RETRY)

__all__ = [
    "DEFAULT_MIX",
    "DEFAULT_XID_ACTIONS",
    "DEFAULT_DETECT",
    "DEFAULT_IMPLICIT_CAUSES",
    "LadderConfig",
    "LadderResult",
    "simulate_ladder",
    "CHEAP_RUNGS",
    "without_cheap_rungs",
    "summarize_ladder",
]

CHEAP_RUNGS = (Rung.MASK, Rung.EVICT, Rung.RETRY)


def without_cheap_rungs(base: LadderPolicy | None = None) -> LadderPolicy:
    """``base`` with zero attempts on MASK, EVICT and RETRY: what the cheap rungs are worth.

    ROLLBACK and REPLAY stay: they are the only cures of a bad version and of SDC.
    """
    base = base if base is not None else LadderPolicy()
    attempts = dict(base.max_attempts)
    attempts.update({r: 0 for r in CHEAP_RUNGS})
    return replace(base, max_attempts=attempts)


MAX_TTT_OVER_T0 = 100.0


def simulate_ladder(sc: Scenario, *, redundancy: int = 1, seed: int = 0,
                    policy: LadderPolicy | None = None, config: LadderConfig | None = None,
                    standby_count: int | None = None, ckpt_every: int | None = None,
                    max_ttt_over_t0: float = MAX_TTT_OVER_T0) -> LadderResult:
    """Play ``sc`` through its faults with the recovery ladder; one seed, one result.

    Raises:
        ValueError: a bad redundancy (``placement``), standby count or checkpoint interval,
            naming the value; ``LadderConfig`` / ``LadderPolicy`` validate themselves.
    """
    if isinstance(redundancy, bool) or not isinstance(redundancy, int) or redundancy < 1:
        raise ValueError(f"ladder: redundancy={redundancy!r} must be an integer >= 1")
    if redundancy >= 2:
        placement.check(sc.groups, redundancy)
    for name, v in (("standby_count", standby_count), ("ckpt_every", ckpt_every)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0
                              or (name == "ckpt_every" and v < 1)):
            raise ValueError(f"ladder: {name}={v!r} must be an integer >= "
                             f"{1 if name == 'ckpt_every' else 0}")
    if not isinstance(max_ttt_over_t0, (int, float)) or not max_ttt_over_t0 > 0:
        raise ValueError(f"ladder: max_ttt_over_t0={max_ttt_over_t0!r} must be > 0")
    return _Run(sc, redundancy, seed, policy or LadderPolicy(), config or LadderConfig(),
                standby_count, ckpt_every).run(max_ttt_over_t0 * sc.t0)


class _Run:
    def __init__(self, sc: Scenario, r: int, seed: int, policy: LadderPolicy,
                 cfg: LadderConfig, pool: int | None, k_ckpt: int | None) -> None:
        self.sc, self.r, self.seed, self.policy, self.cfg = sc, r, seed, policy, cfg
        self.rng = np.random.default_rng(seed)
        self.base = sc.t_compute + sc.allreduce           # failure-free step
        c = {n: getattr(cfg, n) for n in COST_NAMES}
        retry = c["retry_s"] if c["retry_s"] is not None else sc.t_restart / 11.04
        self.cost = {
            Rung.EVICT: c["evict_s"] if c["evict_s"] is not None else sc.t_restart / 10.87,
            Rung.RETRY: retry,
            Rung.ROLLBACK: c["rollback_s"] if c["rollback_s"] is not None else retry,
            Rung.REPLAY: c["replay_s"] if c["replay_s"] is not None
            else 2 * (retry + cfg.replay_steps * self.base),
            Rung.RESTART: c["restart_s"] if c["restart_s"] is not None else sc.t_restart,
            Rung.REQUEUE: c["requeue_s"] if c["requeue_s"] is not None else sc.t_restart,
        }
        self.mask_s = c["mask_s"]
        self.refill_s = c["refill_s"] if c["refill_s"] is not None else sc.t_restart
        if pool is None:
            p = standby.p_from_mtbf(sc.group_mtbf, self.refill_s) if self.refill_s > 0 else 0.0
            pool = standby.standby_size(sc.groups, p)
        self.pool = pool
        if k_ckpt is None:
            k_ckpt = theory.ckpt_every(sc, "spare" if r >= 2 else "ckpt", r)
        self.k_ckpt = k_ckpt
        self.kinds = [k for k, p in cfg.mix.items() if p > 0]
        self.kind_p = np.array([cfg.mix[k] for k in self.kinds])
        self.xids = list(cfg.xid_actions)
        self.xid_p = np.array([cfg.xid_actions[x] for x in self.xids])
        self.imp = list(cfg.implicit_causes)
        self.imp_p = np.array([cfg.implicit_causes[x] for x in self.imp])
        self.layout = placement.make_layout(sc.groups, r) if r >= 2 else None
        self.stacks = rectlr.initial_stacks(self.layout) if self.layout else None
        self.depth = 1
        self.live = np.ones(sc.groups, dtype=bool)
        self.masked: dict[int, FaultKind] = {}           # dead group -> kind, oldest first
        self.plan: rectlr.Plan | None = None             # rectlr's plan for the fault at hand
        self.next_fail = np.array([self.interval() for _ in range(sc.groups)])
        self.refills: list[float] = []
        self.state = ladder.LadderState()
        self.standby = pool                              # warm spares in the pool now
        self.versions = 0
        self.t = 0.0
        self.into = 0.0                                  # seconds into the current step
        self.cur_st = self.base                          # this step's length (set at its start)
        self.step = 0
        self.last_ckpt = 0
        self.ckpt_s = 0.0
        self.faults = 0
        self.by_kind: dict[str, float] = {}
        self.by_rung: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.gave_up: str | None = None

    # -- draws and books ---------------------------------------------------------------------
    def interval(self) -> float:
        sc = self.sc
        # the first of the group's R ranks' failures (a rank's failure is the group's)
        r = sc.ranks_per_group
        if sc.fail_dist == "weibull":
            draws = self.rng.weibull(sc.weibull_shape, r) if r > 1 else \
                [self.rng.weibull(sc.weibull_shape)]
            return float(min(draws)) * sc.rank_weibull_scale
        return float(min(self.rng.exponential(sc.rank_mtbf, r)) if r > 1
                     else self.rng.exponential(sc.group_mtbf))

    def pick(self, items: list, p: np.ndarray):
        return items[int(self.rng.choice(len(items), p=p))]

    def charge(self, bucket: str, kind: FaultKind, s: float) -> None:
        self.by_rung[bucket] = self.by_rung.get(bucket, 0.0) + s
        self.by_kind[kind.value] = self.by_kind.get(kind.value, 0.0) + s

    def detect(self, kind: FaultKind) -> float:
        d = self.cfg.detect.get(kind)
        return self.base if d is None else d

    # -- pool, masking, restarts -------------------------------------------------------------
    def take_refills(self) -> None:
        while self.refills and self.refills[0] <= self.t:
            heapq.heappop(self.refills)
            self.standby = min(self.pool, self.standby + 1)

    def revive(self, g: int) -> None:
        if g in self.masked:
            del self.masked[g]
        self.live[g] = True
        if math.isinf(self.next_fail[g]):
            self.next_fail[g] = self.t + self.interval()
        if not self.masked and self.layout is not None:
            self.stacks, self.depth = rectlr.initial_stacks(self.layout), 1

    def replace_masked(self) -> None:
        """Step boundary: warm standbys take the masked groups' places (outside the ladder)."""
        while self.masked and self.standby > 0:
            g = next(iter(self.masked))
            self.standby -= 1
            heapq.heappush(self.refills, self.t + self.refill_s)
            self.revive(g)

    def mask_plan(self, groups: tuple[int, ...]):
        live = self.live.copy()
        live[list(groups)] = False
        return rectlr.decide(self.layout, live, self.stacks, self.depth)

    def apply_mask(self, groups: tuple[int, ...], plan, kind: FaultKind) -> float:
        for g in groups:
            self.live[g] = False
            self.masked[g] = kind
            self.next_fail[g] = math.inf
        self.stacks, self.depth = plan.stacks, plan.depth
        if self.mask_s is not None:
            return self.mask_s
        most = max((len(v) for v in plan.patch.values()), default=0)
        return self.sc.t_shrink + most * self.sc.t_compute

    def fresh_start(self) -> None:
        """RESTART / REQUEUE: every group back; failures inside the window are absorbed."""
        for g in list(self.masked):
            self.revive(g)
        due = np.flatnonzero(self.next_fail <= self.t)
        for g in due:
            self.next_fail[g] = self.t + self.interval()

    # -- one fault ---------------------------------------------------------------------------
    def on_fault(self, g: int) -> None:
        self.faults += 1
        self.next_fail[g] = self.t + self.interval()
        kind = self.pick(self.kinds, self.kind_p)
        xid = None
        if kind is K.XID:
            xid = self.pick(self.xids, self.xid_p)
            cause = "transient" if xid in XID_RETRY else "machine"
        elif kind in (K.DEATH, K.HANG):
            cause = "transient" if self.rng.random() < self.cfg.transient else "machine"
        elif kind is K.IMPLICIT:
            cause = self.pick(self.imp, self.imp_p)
        else:
            cause = {K.SDC: "sdc", K.CODE: "code"}.get(kind, "machine")
        if cause == "code":  # a bad version just took effect (see the module docstring)
            self.versions += 1
            self.state = replace(self.state, running=f"v{self.versions}", running_steps=0)
        fault = self.named_fault(kind, (g,), xid) if kind in NAMED_KINDS else Fault(kind)
        self.incident(fault, cause, g)

    def named_fault(self, kind: FaultKind, groups: tuple[int, ...], xid: str | None) -> Fault:
        self.plan = None
        if self.layout is not None:
            plan = self.mask_plan(groups)
            if isinstance(plan, rectlr.Plan):
                self.plan = plan
            elif kind in TO_WIPE_OUT:
                kind = K.WIPE_OUT
        return Fault(kind, groups, maskable=self.plan is not None, xid_action=xid)

    def incident(self, fault: Fault, cause: str, culprit: int) -> None:
        kind0 = fault.kind
        det = self.detect(kind0)
        self.t += det
        self.charge("detect", kind0, det)
        while True:
            d, why = ladder.decide(fault, self.state, self.policy, self.t, self.standby)
            if d.rung is None:
                self.gave_up = why
                self.charge("detect", kind0, self.into)  # the step in progress is lost too
                self.into = 0.0
                return
            self.state = ladder.advance(self.state, Tried(d), self.policy)
            name = d.rung.name.lower()
            self.counts[name] = self.counts.get(name, 0) + 1
            cured, named = self.carry_out(d, fault, cause, kind0)
            if named:  # the replay named the corrupting machine: evict it, same incident
                fault, cause = self.named_fault(K.CORRUPT, (culprit,), None), "machine"
                continue
            if cured:
                return
            self.t += det  # the fault comes back as soon as training resumes
            self.charge("detect", kind0, det)

    def carry_out(self, d: ladder.Decision, fault: Fault, cause: str,
                  kind0: FaultKind) -> tuple[bool, bool]:
        """Book the rung's time; return (cured, replay named the culprit)."""
        rung, named, wasted = d.rung, False, 0.0
        if rung is Rung.MASK:
            cost = self.apply_mask(fault.groups, self.plan, kind0)
        else:
            cost = self.cost[rung]
            wasted, self.into = self.into, 0.0  # the step in progress is lost (already run)
            if rung is Rung.EVICT:
                self.standby -= d.replace  # the woken standbys leave the pool until refilled
                for g in d.groups[:d.replace]:
                    heapq.heappush(self.refills, self.t + self.refill_s)
                    self.revive(g)
                if d.mask:
                    cost += self.apply_mask(d.groups[d.replace:], self.plan, kind0)
            elif rung is Rung.REPLAY and cause == "sdc":
                named = self.rng.random() < self.cfg.replay_finds
            elif rung in (Rung.RESTART, Rung.REQUEUE):
                cost += d.backoff  # and the steps since the checkpoint, already run:
                wasted += (self.step - self.last_ckpt) * self.base
                self.step = self.last_ckpt
        self.t += cost
        self.charge(rung.name.lower(), kind0, cost + wasted)
        if rung in (Rung.RESTART, Rung.REQUEUE):
            self.fresh_start()
        if rung is not Rung.MASK:  # a new step starts at the current depth
            self.cur_st = self.step_len()
        return rung in CURES[cause], named

    # -- the run -----------------------------------------------------------------------------
    def step_len(self) -> float:
        return self.base + (self.depth - 1) * self.sc.t_compute

    def commit(self, n: int) -> None:
        extra = self.cur_st - self.base + (n - 1) * (self.step_len() - self.base)
        if extra > 0:  # degraded steps: booked to MASK and to the masked groups' kinds
            share = extra / max(1, len(self.masked))
            for kind in self.masked.values():
                self.charge("mask", kind, share)
            if not self.masked:
                self.by_rung["mask"] = self.by_rung.get("mask", 0.0) + extra
        self.step += n
        self.state = ladder.advance(self.state, Committed(n), self.policy)
        self.into = 0.0
        self.replace_masked()
        if self.step % self.k_ckpt == 0 and self.step < self.sc.steps:
            self.t += self.sc.t_save
            self.ckpt_s += self.sc.t_save
            self.last_ckpt = self.step
        self.cur_st = self.step_len()

    def run(self, t_cap: float) -> LadderResult:
        sc = self.sc
        while self.step < sc.steps and self.t < t_cap and self.gave_up is None:
            self.take_refills()
            g = int(np.argmin(self.next_fail))
            t_fail = max(self.t, float(self.next_fail[g]))
            end = self.t + self.cur_st - self.into
            if t_fail >= end:
                n = 1
                if not self.masked:  # nothing changes between faults: commit a batch
                    st = self.step_len()
                    fit = int((t_fail - end) // st) if math.isfinite(t_fail) else sc.steps
                    to_ckpt = self.k_ckpt - self.step % self.k_ckpt
                    n = max(1, min(1 + fit, to_ckpt, sc.steps - self.step))
                    end += (n - 1) * st
                self.t = end
                self.commit(n)
            else:
                self.into += t_fail - self.t
                self.t = t_fail
                self.on_fault(g)
        productive = self.step * self.base
        return LadderResult(
            seed=self.seed, redundancy=self.r, standby=self.pool, ckpt_every=self.k_ckpt,
            ettr=productive / self.t if self.t > 0 else 1.0, wall_s=self.t,
            productive_s=productive, checkpoint_s=self.ckpt_s, ttt_over_t0=self.t / sc.t0,
            lost_by_kind=dict(sorted(self.by_kind.items())),
            lost_by_rung=dict(sorted(self.by_rung.items())),
            rung_counts=dict(sorted(self.counts.items())), faults=self.faults,
            steps_done=self.step, completed=self.step >= sc.steps,
            gave_up=self.gave_up is not None, gave_up_reason=self.gave_up)


def summarize_ladder(results: list[LadderResult]) -> dict:
    """Means over seeds (ETTR's spread too), give-ups, and the per-seed headline numbers."""
    if not results:
        raise ValueError("ladder: no results to summarize")
    e = np.array([r.ettr for r in results])

    def mean_of(attr: str) -> dict[str, float]:
        keys = sorted({k for r in results for k in getattr(r, attr)})
        return {k: float(np.mean([getattr(r, attr).get(k, 0) for r in results])) for k in keys}

    first = results[0]
    return {
        "redundancy": first.redundancy, "standby": first.standby,
        "ckpt_every": first.ckpt_every,
        "ettr": float(e.mean()), "ettr_std": float(e.std(ddof=1)) if len(e) > 1 else 0.0,
        "ettr_min": float(e.min()), "ettr_max": float(e.max()),
        "ttt_over_t0": float(np.mean([r.ttt_over_t0 for r in results])),
        "gave_up": sum(r.gave_up for r in results),
        "completed": sum(r.completed for r in results),
        "faults": float(np.mean([r.faults for r in results])),
        "lost_by_rung": mean_of("lost_by_rung"), "lost_by_kind": mean_of("lost_by_kind"),
        "rung_counts": mean_of("rung_counts"),
        "per_seed": [{"seed": r.seed, "ettr": r.ettr, "wall_s": r.wall_s, "faults": r.faults,
                      "completed": r.completed, "gave_up": r.gave_up} for r in results],
    }
