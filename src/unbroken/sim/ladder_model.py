"""The fault model the ladder simulator (:mod:`unbroken.sim.ladder`) plays a job through: which
faults come, how long each takes to notice, what each rung costs, what cures what.

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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Mapping

from unbroken.core.ladder import FaultKind, Rung

__all__ = ["DEFAULT_MIX", "DEFAULT_XID_ACTIONS", "DEFAULT_DETECT", "DEFAULT_IMPLICIT_CAUSES",
           "CAUSES", "LadderConfig", "LadderResult"]

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
CURES = {
    "machine": frozenset({Rung.MASK, Rung.EVICT, Rung.RESTART, Rung.REQUEUE}),
    "transient": frozenset(Rung),
    "code": frozenset({Rung.ROLLBACK}),
    "sdc": frozenset({Rung.REQUEUE}),
}
NAMED_KINDS = frozenset({K.DEATH, K.HANG, K.FAIL_SLOW, K.XID, K.CORRUPT})
TO_WIPE_OUT = frozenset({K.DEATH, K.HANG, K.FAIL_SLOW})
XID_RETRY = frozenset({"restart_app"})
COST_NAMES = ("mask_s", "evict_s", "retry_s", "rollback_s", "replay_s", "restart_s",
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
        for name in COST_NAMES:
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
