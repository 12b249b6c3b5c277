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

Modelling choices (byterobust.md = BR, backendai.md = BA; "our choice" = no reference number)
-------------------------------------------------------------------------------------------
* **Arrivals.** Every group keeps the scenario's renewal process (Weibull or exponential,
  per-group MTBF = MTBF x N), as in ``sim.engine``; the scenario's MTBF covers *every* incident,
  and each arrival draws its kind from the mix (our choice: kinds independent of the group).
  A group that is masked and waiting for a replacement does not fail; a replaced one starts a
  fresh interval.
* **Default mix** (fractions of incidents; ``DEFAULT_MIX``): BR §11 Table 1 for the kinds it
  names — CUDA error 36.1 % -> ``XID``, job hang 9.9 % -> ``HANG``, MFU decline 0.8 % ->
  ``FAIL_SLOW``, NaN 0.3 % -> ``IMPLICIT``; BR §2's resolution shares for the two it does not —
  rollback 9.20 % -> ``CODE``, dual-phase replay 1.23 % -> ``SDC``; the remainder (42.47 %) is an
  ordinary process death naming its group (our choice). Table 1's manual code/data adjustments
  (17.3 %) are planned restarts, not faults, and are left out (our choice).
* **XID action classes** (``DEFAULT_XID_ACTIONS``): reset-gpu 29.4 % (BA §3: NVLink errors,
  XID 145/149, are 29.4 % of events), reboot-node 10 % (our choice), restart-app the rest.
* **Hidden cause.** Each fault has a cause the ladder does not see, and the cause says which
  rungs cure it: ``machine`` (cured by MASK, EVICT, RESTART, REQUEUE: the machine is taken out),
  ``transient`` (cured by MASK and by any rung that restarts processes), ``code`` (cured by
  ROLLBACK only), ``sdc`` (an unnamed corrupting machine: REPLAY names it with probability
  ``replay_finds`` — 0.9, our choice, BR §5 warns that non-reproducing SDC escapes — and the
  named machine becomes a ``CORRUPT`` fault that is evicted in the same incident; REQUEUE also
  cures it, our choice: the fresh allocation's self-check catches the machine, BR §8).
  Death and hang are transient with probability ``transient`` = 0.27 (BR §2: "73 % of explicit
  failures are resolved by automatic eviction plus restart"; we read the other 27 % as
  transient); fail-slow, corrupt and reset/reboot XIDs are machines; restart-app XIDs are
  transient; an implicit fault (NaN, spike) is transient / code / sdc in the ratio of BR §2's
  reattempt / rollback / replay shares, 22.70 : 9.20 : 1.23.
* **A bad code version.** A ``code`` cause means a new version just took effect: the simulator
  sets ``running`` to a fresh version (``last_good`` keeps the previous one), so the ladder sees
  what the runtime would see after a bad hot update. Lazy hot updates (``queue_update`` /
  ``update_due``) are not modelled.
* **A cure that fails.** When a rung does not cure the fault, it recurs as soon as training
  resumes (no step commits in between) and is detected again; the ladder then climbs with the
  attempts it has counted. Rungs are carried out successfully (``Tried(ok=True)``); "not cured"
  is the hidden cause's business.
* **Detection latency** (``DEFAULT_DETECT``, seconds): death and XID 10 s (BR §3 Table 3: GPU lost,
  GPU driver hang); hang 600 s (BR §3: zero RDMA traffic for 10 min); fail-slow 50 s (BR §6:
  5 rounds of 10 s); code 2 s (our choice: an exception exits at once; Table 3's fastest row);
  NaN / spike and SDC one failure-free step (our choice: seen when the step's loss or checksum
  is); corrupt 0 (found by the replay or an off-line test); a wipe-out takes its trigger's.
* **Rung costs** (seconds; ``None`` derives from the scenario): MASK = ``t_shrink`` + the
  patch compute of ``core.rectlr``'s plan (most shards one survivor must add, x T_compute);
  EVICT = T_restart / 10.87 (BR §8: warm standby 10.87x faster than requeue, and requeue is
  read as one global restart); RETRY and ROLLBACK = T_restart / 11.04 (BR §8: in-place hot
  update 11.04x faster than requeue); REPLAY = two rounds (BR §5) of an in-place restart plus
  ``replay_steps`` = 10 steps each (our choice); RESTART = T_restart + the work since the last
  durable checkpoint; REQUEUE = the decision's backoff + T_restart + the work since the last
  durable checkpoint. Every rung but MASK also loses the step in progress.
* **Snapshots.** Rungs that keep the allocation (EVICT, RETRY, ROLLBACK, REPLAY) resume from
  the every-step in-memory snapshot (BR §9), losing only the step in progress; RESTART and
  REQUEUE go back to the durable checkpoint, saved every ``ckpt_every`` steps (default: the
  engine's ``theory.ckpt_every``) at ``t_save`` each.
* **Masking** (``Fault.maskable``): a named-group fault asks ``core.rectlr.decide`` with that
  group dead (redundancy r >= 2, the SPARe layout); a ``Plan`` makes it maskable, a ``WipeOut``
  turns a death / hang / fail-slow into ``WIPE_OUT`` naming that group (replacing it restores
  its shard types). Masked groups raise the stack depth: each step costs (depth - 1) x
  T_compute more ("degraded", booked to MASK) until a warm standby replaces them at a step
  boundary (free: the spare copies state while the others train). r = 1: nothing is maskable.
* **Warm standbys.** Pool size defaults to ``core.standby``: P99 of Binomial(N, p) with p the
  per-group failure probability over one refill window; a used standby comes back
  ``refill_s`` later (default T_restart, our choice). RESTART and REQUEUE bring every masked
  group back (a fresh start), and absorb the failures that fall inside them (our choice; the
  engine lengthens its restart instead). A failure during any other rung or a save is handled
  right after it.
* **Accounting.** wall = productive + checkpoint saves + detection + the rungs' time
  (``lost_by_rung``; ``detect`` is its own key); productive = the distinct steps committed x
  (T_compute + T_a); ETTR = productive / wall. A run stops at ``max_ttt_over_t0`` x T0 or when
  the ladder gives up (``EXIT_NO_PROGRESS``).

Pure: no I/O; one seeded ``numpy`` Generator, so one seed gives one result.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Mapping

import numpy as np

from unbroken.core import ladder, placement, rectlr, standby, theory
from unbroken.core.ladder import Committed, Fault, FaultKind, LadderPolicy, Rung, Tried
from unbroken.core.scenario import Scenario

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

K = FaultKind
DEFAULT_MIX: dict[FaultKind, float] = {
    K.XID: 0.361, K.HANG: 0.099, K.FAIL_SLOW: 0.008, K.IMPLICIT: 0.003,  # BR Table 1
    K.CODE: 0.092, K.SDC: 0.0123,                                         # BR §2 shares
    K.DEATH: 1.0 - (0.361 + 0.099 + 0.008 + 0.003 + 0.092 + 0.0123),      # the rest: our choice
    K.CORRUPT: 0.0,
}
DEFAULT_XID_ACTIONS: dict[str, float] = {"reset_gpu": 0.294, "reboot_node": 0.10,
                                         "restart_app": 1.0 - 0.294 - 0.10}
#: None: one failure-free step.
DEFAULT_DETECT: dict[FaultKind, float | None] = {
    K.DEATH: 10.0, K.XID: 10.0, K.HANG: 600.0, K.FAIL_SLOW: 50.0, K.CODE: 2.0,
    K.IMPLICIT: None, K.SDC: None, K.CORRUPT: 0.0}
_BR_SHARES = {"transient": 22.70, "code": 9.20, "sdc": 1.23}  # reattempt / rollback / replay
DEFAULT_IMPLICIT_CAUSES = {k: v / sum(_BR_SHARES.values()) for k, v in _BR_SHARES.items()}

CAUSES = ("machine", "transient", "code", "sdc")
#: Rungs that cure each cause (REPLAY cures ``sdc`` by naming the machine, handled apart).
_CURES = {
    "machine": frozenset({Rung.MASK, Rung.EVICT, Rung.RESTART, Rung.REQUEUE}),
    "transient": frozenset(Rung),
    "code": frozenset({Rung.ROLLBACK}),
    "sdc": frozenset({Rung.REQUEUE}),
}
_NAMED = frozenset({K.DEATH, K.HANG, K.FAIL_SLOW, K.XID, K.CORRUPT})
_TO_WIPE_OUT = frozenset({K.DEATH, K.HANG, K.FAIL_SLOW})
_XID_RETRY = frozenset({"restart_app"})
_COST_NAMES = ("mask_s", "evict_s", "retry_s", "rollback_s", "replay_s", "restart_s",
               "requeue_s", "refill_s")


def _kind(key: object, what: str) -> FaultKind:
    try:
        return FaultKind(key.value if isinstance(key, FaultKind) else str(key))
    except ValueError:
        raise ValueError(f"ladder config: {what} has unknown fault kind {key!r} (one of "
                         f"{', '.join(k.value for k in FaultKind)})") from None


def _num(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"ladder config: {name}={v!r} must be a finite number >= 0")
    return float(v)


def _fractions(name: str, d: Mapping, allowed: tuple[str, ...] | None = None) -> None:
    for k, p in d.items():
        if allowed is not None and k not in allowed:
            raise ValueError(f"ladder config: {name} has unknown key {k!r} (one of "
                             f"{', '.join(allowed)})")
        if _num(f"{name}[{getattr(k, 'value', k)}]", p) > 1:
            raise ValueError(f"ladder config: {name}[{getattr(k, 'value', k)}]={p!r} "
                             f"is above 1")
    total = sum(d.values())
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        raise ValueError(f"ladder config: {name} fractions sum to {total:g}, not 1")


@dataclass(frozen=True)
class LadderConfig:
    """The fault model and the rungs' costs (seconds). ``None`` derives from the scenario.

    Attributes:
        mix: fault kind -> fraction of incidents (sums to 1; ``wipe-out`` is derived, not drawn).
        xid_actions: XID action class -> fraction of XID faults (sums to 1).
        detect: fault kind -> detection latency; None: one failure-free step. Missing kinds
            keep ``DEFAULT_DETECT``.
        transient: probability that a death or hang is transient (an in-place retry cures it).
        implicit_causes: cause -> fraction of NaN / spike faults (``transient``, ``code``,
            ``sdc``; sums to 1).
        replay_finds: probability that the dual-phase replay names an SDC machine.
        replay_steps: steps replayed per replay round (two rounds).
        mask_s .. requeue_s: rung costs, without the lost work RESTART / REQUEUE add.
        refill_s: time for a used standby to come back to the pool.
    """

    mix: Mapping[FaultKind | str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    xid_actions: Mapping[str, float] = field(
        default_factory=lambda: dict(DEFAULT_XID_ACTIONS))
    detect: Mapping[FaultKind | str, float | None] = field(default_factory=dict)
    transient: float = 0.27
    implicit_causes: Mapping[str, float] = field(
        default_factory=lambda: dict(DEFAULT_IMPLICIT_CAUSES))
    replay_finds: float = 0.9
    replay_steps: int = 10
    mask_s: float | None = None
    evict_s: float | None = None
    retry_s: float | None = None
    rollback_s: float | None = None
    replay_s: float | None = None
    restart_s: float | None = None
    requeue_s: float | None = None
    refill_s: float | None = None

    def __post_init__(self) -> None:
        mix = {_kind(k, "mix"): p for k, p in dict(self.mix).items()}
        if len(mix) != len(self.mix):
            raise ValueError(f"ladder config: mix names a kind twice ({list(self.mix)})")
        if mix.get(K.WIPE_OUT):
            raise ValueError(f"ladder config: mix[wipe-out]={mix[K.WIPE_OUT]!r}: a wipe-out "
                             f"is derived from the layout, not drawn")
        _fractions("mix", mix)
        object.__setattr__(self, "mix", mix)
        xids = {str(k).strip().lower().replace("-", "_"): p
                for k, p in dict(self.xid_actions).items()}
        _fractions("xid_actions", xids)
        object.__setattr__(self, "xid_actions", xids)
        detect = dict(DEFAULT_DETECT)
        for k, v in dict(self.detect).items():
            kind = _kind(k, "detect")
            detect[kind] = None if v is None else _num(f"detect[{kind.value}]", v)
        object.__setattr__(self, "detect", detect)
        _fractions("implicit_causes", dict(self.implicit_causes),
                   ("transient", "code", "sdc"))
        for name in ("transient", "replay_finds"):
            if _num(name, getattr(self, name)) > 1:
                raise ValueError(f"ladder config: {name}={getattr(self, name)!r} is a "
                                 f"probability, above 1")
        r = self.replay_steps
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise ValueError(f"ladder config: replay_steps={r!r} must be an integer >= 0")
        for name in _COST_NAMES:
            if getattr(self, name) is not None:
                _num(name, getattr(self, name))


@dataclass(frozen=True)
class LadderResult:
    """One seeded run. Times in seconds; ``lost_by_rung`` has a ``detect`` key too."""

    seed: int
    redundancy: int
    standby: int
    ckpt_every: int
    ettr: float
    wall_s: float
    productive_s: float
    checkpoint_s: float
    ttt_over_t0: float
    lost_by_kind: dict[str, float]
    lost_by_rung: dict[str, float]
    rung_counts: dict[str, int]
    faults: int
    steps_done: int
    completed: bool          # every step committed (False: gave up or hit the wall-clock cap)
    gave_up: bool            # the ladder reached exit 6 (EXIT_NO_PROGRESS)
    gave_up_reason: str | None

    def as_dict(self) -> dict:
        return asdict(self)


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
        c = {n: getattr(cfg, n) for n in _COST_NAMES}
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
        if sc.fail_dist == "weibull":
            return float(self.rng.weibull(sc.weibull_shape)) * sc.weibull_scale
        return float(self.rng.exponential(sc.group_mtbf))

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
            cause = "transient" if xid in _XID_RETRY else "machine"
        elif kind in (K.DEATH, K.HANG):
            cause = "transient" if self.rng.random() < self.cfg.transient else "machine"
        elif kind is K.IMPLICIT:
            cause = self.pick(self.imp, self.imp_p)
        else:
            cause = {K.SDC: "sdc", K.CODE: "code"}.get(kind, "machine")
        if cause == "code":  # a bad version just took effect (see the module docstring)
            self.versions += 1
            self.state = replace(self.state, running=f"v{self.versions}", running_steps=0)
        fault = self.named_fault(kind, (g,), xid) if kind in _NAMED else Fault(kind)
        self.incident(fault, cause, g)

    def named_fault(self, kind: FaultKind, groups: tuple[int, ...], xid: str | None) -> Fault:
        self.plan = None
        if self.layout is not None:
            plan = self.mask_plan(groups)
            if isinstance(plan, rectlr.Plan):
                self.plan = plan
            elif kind in _TO_WIPE_OUT:
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
        return rung in _CURES[cause], named

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
