"""The recovery ladder: one escalation order and one budget for every fault.

Why one ladder
--------------
A fault can be answered in many ways, and their costs differ by orders of magnitude: masking a
dead data-parallel group (SPARe, ``core.rectlr``) loses nothing and takes well under a second;
requeueing the job loses the allocation, the warm caches and ten minutes of scheduling. ByteRobust
(byterobust.md §2, Fig. 5) resolves most incidents with the cheap mechanisms — eviction 32.52 %,
reattempt 22.70 %, rollback 9.20 %, dual-phase replay 1.23 % — and keeps the expensive ones for
what the cheap ones could not fix. So every fault enters the ladder at the cheapest rung that can
handle its kind, and climbs one rung when that rung has used up its attempts:

==========  =========================================================================
``MASK``      survivors compute the failed groups' shard types (rectlr); no restart
``EVICT``     evict the groups and wake warm standbys in their place (§8); the job restarts
              in place around them, no rescheduling
``RETRY``     restart the training processes in place, same pods, same machines (§7)
``ROLLBACK``  hot-update the code back to the last version that trained well (§7)
``REPLAY``    dual-phase replay to find a silently corrupting machine (§5, ``core.replay``)
``RESTART``   restart the whole job from the snapshot / durable checkpoint
``REQUEUE``   give the allocation back and resubmit after an exponential backoff
==========  =========================================================================

Past ``REQUEUE`` the ladder gives up: the decision carries ``EXIT_NO_PROGRESS`` (6), which tells a
launcher "automatic recovery stopped on purpose" apart from a crash (3), a wipe-out without
replacements (4) and a lost coordinator (5).

Rules taken from the references
-------------------------------
* High-confidence hardware faults skip diagnosis and evict at once (byterobust.md §2); the XID
  action classes ``reset_gpu`` and ``reboot_node`` (backendai.md §3: XID 119/145/149, 79) are
  such faults; ``restart_app`` (XID 31/43/94) restarts the application in place (§3, §7).
  A machine that the replay (§5) or a bitwise test (§4) proved corrupt is evicted at once too.
* A user-space error traceable to code rolls the code back (byterobust.md §2, §7).
* A crash or NaN with no clear culprit: reattempt in place; if it fails again, roll back the
  recent code; if still failing, dual-phase replay (byterobust.md §2).
* Code updates are lazy: queued, applied at the next restart the job needs anyway, forced after a
  deadline (24 h by default, byterobust.md §7).
* Requeue backs off exponentially, ``min(cap, base · 2**a)`` with the report's 10 min base
  (backendai.md §7, marked [U/I] there; the 1 h cap is ours): ``core.retry.backoff_delay``
  computes it, the ladder only names the attempt.
* Repeat offenders are quarantined: every eviction is booked in the machine's exclusion history
  (``core.exclusion``, the same record the learn face reads), and a machine evicted
  ``quarantine_after`` times within ``quarantine_window`` is not re-admitted for
  ``quarantine_cooldown`` (backendai.md §7 [I]: 3 of 63 nodes cause more than half of the
  exclusions). One rule: the ladder keeps no counter of its own.

Rules chosen here (not in the references)
-----------------------------------------
* **Mask before evict.** SPARe's masking loses nothing, so a death, hang or fail-slow whose
  shard types still have a live host (``Fault.maskable``, computed by the caller with rectlr) is
  masked first; replacing the group from the standby pool happens at a step boundary, outside
  the ladder. ByteRobust has no masking, so its ladder starts at eviction.
* **Evict only with a full replacement**, except for the hardware classes above, which are
  evicted whatever the pool holds as long as the survivors can carry on (standbys or masking);
  otherwise the fault climbs to ``RETRY`` (for a reboot-class XID, a reboot and an in-place
  restart of the same machine).
* **Replay only without a culprit**: for NaN / loss spikes, for SDC mismatches, and for crashes
  that name no group. A process death that names its group never replays, nor does a
  wipe-out (the in-memory state a replay would recompute from is gone).
* **An incident** begins with the first fault after a quiet period and ends once
  ``resolved_after`` steps have been committed (default 10): a bug that fires every few steps
  must not reset the ladder with every committed step. Attempts are counted per incident: a rung
  *tried* ``max_attempts[rung]`` times in the incident is skipped from then on, whatever the
  outcome of each try — a try that "worked" but was followed by another fault before the
  incident ended did not solve it.
* **Other machines, other incident.** A fault that names groups, none of which the open
  incident has named, starts an incident of its own (fresh attempts, fresh clock): at 10k+
  GPUs independent failures arrive minutes apart, and pooling them into one incident would
  spend its attempts and time budget on unrelated machines until the ladder gave up on a job
  that masking keeps healthy (``sim.ladder`` found exactly that at a 5-minute MTBF). A fault
  naming no group (NaN, SDC) may be a consequence of anything in flight, so it joins the open
  incident; so does a fault on a group the incident already named (a recurring problem),
  or on the spare that replaced one (``Assigned``).
* **No step, no new incident -- unless masking answers it.** A maskable fault on new groups
  always opens its own incident (masking keeps pace with independent failures, which is
  SPARe's argument). An unmaskable one (a wipe-out) separates only once a step was committed
  since the incident began: replacements that die as they start because no node is left are
  one incident that climbs to restart. Otherwise each new replacement uid opened a fresh
  incident and the ladder retried in place forever (seen: 4,990 respawns onto no live node
  in three minutes, until the descriptors ran out).
* **One vote at a time.** A replay collects every member's digests and names the corrupt
  machine by majority; evicting another member while it is in flight leaves the vote short
  ("1/1 agree -> no culprit") and the corrupt machine stays. So a *soft* eviction verdict --
  a statistical one, fail-slow, that may as well be judged later -- waits (:func:`held`)
  while a replay is open, at most ``replay_hold`` s (default 30); the replay's answer
  (``Replayed``) closes it. Hard evidence (a hang, a hardware XID) is not held: that member
  cannot vote anyway. One replay is open at a time (the guard runs them one by one).
* **The no-progress guard**: an incident older than ``time_budget`` (default 1 h) jumps straight
  to ``REQUEUE``; when ``REQUEUE`` has used its attempts too, the ladder gives up.
* The lazily queued update is applied by every rung that restarts processes (``EVICT``,
  ``RETRY``, ``RESTART``, ``REQUEUE``), never by ``MASK`` (nothing restarts) or ``REPLAY`` (a
  replay must run the code that produced the reference); a version that was rolled back is never
  applied again. A version becomes *last good* after ``good_after`` committed steps (default 100).

The ladder's vocabulary and budget (rungs, fault kinds, the fault record, ``LadderPolicy`` and
its parse) are in :mod:`unbroken.core.ladder_policy`, re-exported here; this module holds what
the ladder remembers and how it decides.

Pure: no I/O, no clock (``now`` is passed in), no processes — the simulator and the runtime both
drive the same ``decide`` / ``advance`` pair; the caller journals the decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping

from unbroken.core.exclusion import NodeRecord, record_fault
from unbroken.core.exclusion import quarantined as _quarantined_at
from unbroken.core.ladder_policy import (EXIT_NO_PROGRESS, Fault, FaultKind, LadderError,
                                         LadderPolicy, Rung, parse_policy)
from unbroken.core.retry import backoff_delay

__all__ = [
    "EXIT_NO_PROGRESS",
    "LadderError",
    "Rung",
    "FaultKind",
    "Fault",
    "LadderPolicy",
    "LadderState",
    "Decision",
    "Tried",
    "Assigned",
    "Committed",
    "Replayed",
    "decide",
    "held",
    "advance",
    "quarantined",
    "queue_update",
    "update_due",
    "parse_policy",
]


#: Rungs that restart training processes (a lazily queued code update rides along).
_RESTARTS = frozenset({Rung.EVICT, Rung.RETRY, Rung.RESTART, Rung.REQUEUE})


#: XID action-class names, normalised (lower case, "-" -> "_"), that evict at once / retry.
_XID_EVICT = frozenset({"reset_gpu", "reboot", "reboot_node", "restart_bm"})
_XID_RETRY = frozenset({"restart_app"})
_NO_CULPRIT = frozenset({FaultKind.IMPLICIT, FaultKind.SDC})


def _norm_xid(action: str) -> str:
    return action.strip().lower().replace("-", "_")


@dataclass(frozen=True)
class LadderState:
    """What the ladder remembers between decisions (the caller keeps it, e.g. in the journal).

    Attributes:
        running: code version running now; last_good: the last version that trained well.
        pending: a queued code update (applied lazily), queued at ``pending_since``.
        attempts: rung -> tries in the current incident.
        incident_start: when the current incident began (None: no incident).
        steps: steps committed since the incident began; running_steps: on ``running``.
        incident_groups: the groups the open incident's faults named.
        exclusions: machine -> its eviction history (``core.exclusion.NodeRecord``): which
            machines are quarantined at a time is read from it (:func:`quarantined`).
        rejected: code versions rolled back (never applied again).
        replay_since: when the open replay was tried (None: none is open).
    """

    running: str = "v0"
    last_good: str = "v0"
    pending: str | None = None
    pending_since: float | None = None
    attempts: Mapping[Rung, int] = field(default_factory=dict)
    incident_start: float | None = None
    steps: int = 0
    running_steps: int = 0
    exclusions: Mapping[int, NodeRecord] = field(default_factory=dict)
    rejected: frozenset[str] = frozenset()
    incident_groups: frozenset[int] = frozenset()  # groups the open incident has named
    replay_since: float | None = None

    def __post_init__(self) -> None:
        for name in ("running", "last_good"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise LadderError(f"ladder state: {name}={getattr(self, name)!r} is not a version")
        if (self.pending is None) != (self.pending_since is None):
            raise LadderError(f"ladder state: pending={self.pending!r} and pending_since="
                              f"{self.pending_since!r} must be given together")
        for rung, n in self.attempts.items():
            if not isinstance(rung, Rung) or not isinstance(n, int) or n < 0:
                raise LadderError(f"ladder state: attempts[{rung!r}]={n!r} is not a count")

    def tries(self, rung: Rung) -> int:
        return self.attempts.get(rung, 0)


@dataclass(frozen=True)
class Decision:
    """What to do now. ``rung`` is None when the ladder gives up (then ``exit_code`` is set).

    Attributes:
        rung: the rung to carry out.
        at: the ``now`` it was decided at (the incident starts here if none is open).
        groups: the groups it acts on — masked (MASK), evicted (EVICT), excluded on resubmit
            (REQUEUE), or the fault's groups for the other rungs.
        replace: standbys to wake in the evicted groups' place (EVICT).
        mask: the survivors keep training masked meanwhile (EVICT with too few standbys).
        version: code version to run after this restart: the lazily applied update, or the
            rollback target (ROLLBACK); None keeps the running code.
        backoff: seconds to wait before resubmitting (REQUEUE).
        quarantine: evicted machines this eviction quarantines (their ``quarantine_after``-th
            within the window; one already in quarantine is not listed again).
        exit_code: ``EXIT_NO_PROGRESS`` when the ladder gives up.
        incident: False for a restart that answers no fault (``update_due``): trying it opens
            no incident and uses no attempt.
        separate: the fault opened an incident of its own (the open one is left to its
            groups' faults): ``advance`` starts the new incident's attempts from zero.
    """

    rung: Rung | None
    at: float
    groups: tuple[int, ...] = ()
    replace: int = 0
    mask: bool = False
    version: str | None = None
    backoff: float = 0.0
    quarantine: tuple[int, ...] = ()
    exit_code: int | None = None
    incident: bool = True
    separate: bool = False

    @property
    def restarts(self) -> bool:
        """Whether training processes restart (ETTR books it as restart time, not masking)."""
        return self.rung in _RESTARTS or self.rung is Rung.ROLLBACK


@dataclass(frozen=True)
class Tried:
    """The decision was carried out; ``ok`` is False when the action itself failed."""

    decision: Decision
    ok: bool = True


@dataclass(frozen=True)
class Committed:
    """``steps`` training steps were committed since the last outcome."""

    steps: int


@dataclass(frozen=True)
class Replayed:
    """The open replay was answered (its digests came back, or the attempt it ran in ended)."""


@dataclass(frozen=True)
class Assigned:
    """The slot of ``old`` (a group the ladder answered) went to ``new``: the replacement
    carries its predecessor's open incident. Without this, each replacement's uid is a group
    the incident never named, so a slot whose replacements keep failing (their node is gone,
    their start-up breaks) would open a fresh incident per replacement and retry forever
    instead of climbing to restart, requeue and give-up."""

    old: int
    new: int


Outcome = Tried | Committed | Replayed | Assigned


def _check_time(name: str, t: object) -> float:
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise LadderError(f"{name}={t!r} is not a finite time")
    return float(t)


def _start(fault: Fault, state: LadderState) -> tuple[Rung, bool, str]:
    """The rung a fault enters at, whether eviction is forced, and why."""
    kind = fault.kind
    if kind is FaultKind.XID:
        action = _norm_xid(fault.xid_action or "")
        if action in _XID_EVICT:
            return Rung.EVICT, True, f"xid {action}: hardware, evict at once"
        if action in _XID_RETRY:
            return Rung.RETRY, False, f"xid {action}: restart the application in place"
        kind = FaultKind.DEATH  # investigate / unknown: an ordinary crash
    if kind is FaultKind.CORRUPT:
        return Rung.EVICT, True, "proven corrupt: evict at once"
    if kind is FaultKind.SDC:
        return Rung.REPLAY, False, "sdc mismatch: replay to name the culprit"
    if kind is FaultKind.IMPLICIT:
        return Rung.RETRY, False, "no culprit: reattempt in place"
    if kind is FaultKind.CODE:
        if state.running != state.last_good:
            return Rung.ROLLBACK, False, "code error: roll back the code"
        return Rung.RETRY, False, "code error, nothing to roll back: retry in place"
    return Rung.MASK, False, "cheapest rung first"


def _applicable(rung: Rung, fault: Fault, state: LadderState, forced: bool,
                standby: int) -> bool:
    if rung is Rung.MASK:
        return fault.maskable and bool(fault.groups)
    if rung is Rung.EVICT:
        if not fault.groups:
            return False
        full = standby >= len(fault.groups)
        return full or (forced and fault.maskable)
    if rung is Rung.ROLLBACK:
        return state.running != state.last_good
    if rung is Rung.REPLAY:  # a wipe-out lost the state a replay would recompute
        return fault.kind is not FaultKind.WIPE_OUT and (
            fault.kind in _NO_CULPRIT or not fault.groups)
    return True


def _lazy_update(state: LadderState) -> str | None:
    if state.pending is not None and state.pending not in state.rejected:
        return state.pending
    return None


def decide(fault: Fault, state: LadderState, policy: LadderPolicy, now: float,
           standby: int = 0) -> tuple[Decision, str]:
    """The next rung for ``fault``, given the incident so far and ``standby`` warm spares.

    The pool size is an argument, not part of the state: the pool belongs to whoever starts and
    assigns spares (the supervisor, the simulator), so the ladder reads it at each decision
    rather than keep a copy that must be kept in step with it.

    The fault enters at the cheapest rung its kind allows (XID classes and proven corruption
    short-circuit), then climbs past every rung that does not apply or has used its attempts in
    this incident. An incident older than ``policy.time_budget`` jumps to ``REQUEUE``; past
    ``REQUEUE`` the ladder gives up with ``EXIT_NO_PROGRESS``.

    Returns:
        (decision, reason): the reason is one line that doubles as the log line.

    Raises:
        LadderError: a bad fault/state/policy type, a non-finite ``now``, or a ``now`` before the
            incident began.
    """
    if not isinstance(fault, Fault):
        raise LadderError(f"fault {fault!r} is not a ladder.Fault")
    if not isinstance(state, LadderState):
        raise LadderError(f"state {state!r} is not a ladder.LadderState")
    if not isinstance(policy, LadderPolicy):
        raise LadderError(f"policy {policy!r} is not a ladder.LadderPolicy")
    now = _check_time("now", now)
    if isinstance(standby, bool) or not isinstance(standby, int) or standby < 0:
        raise LadderError(f"standby={standby!r} must be an integer >= 0")
    separate = _separate(fault, state)
    if separate:
        state = replace(state, attempts={}, incident_start=None, steps=0,
                        incident_groups=frozenset())
    spent = 0.0
    if state.incident_start is not None:
        spent = now - state.incident_start
        if spent < 0:
            raise LadderError(f"now={now} is before the incident start {state.incident_start}")
    start, forced, why = _start(fault, state)
    where = f"{fault.kind.value} on {list(fault.groups) or 'no named group'}"
    if spent >= policy.time_budget and start < Rung.REQUEUE:
        start, why = Rung.REQUEUE, (f"no progress for {spent:g}s >= budget "
                                    f"{policy.time_budget:g}s")
    skipped: list[str] = []
    for rung in Rung:
        if rung < start:
            continue
        if state.tries(rung) >= policy.limit(rung):
            skipped.append(f"{rung.name.lower()} used {state.tries(rung)}/{policy.limit(rung)}")
            continue
        if not _applicable(rung, fault, state, forced, standby):
            continue
        d, reason = _make(rung, fault, state, policy, now, standby, where, why, skipped)
        return replace(d, separate=separate), reason
    reason = (f"give up: {where}; {why}; " + (", ".join(skipped) or "no rung left")
              + f" (exit {EXIT_NO_PROGRESS})")
    return Decision(rung=None, at=now, groups=fault.groups, exit_code=EXIT_NO_PROGRESS), reason


def _separate(fault: Fault, state: LadderState) -> bool:
    """A fault on groups the open incident never named starts an incident of its own: a
    maskable one always (SPARe masks each failure by itself; pooling them spent the mask
    rung's attempts, and at 600 groups with a 1 h MTBF the simulated ladder gave up in 5 of 5
    seeds instead of 2), an unmaskable one once a step was committed since the incident began
    (replacements that die as they start, with no progress between them, must climb the
    ladder, not reset it with every new uid they name)."""
    if state.incident_start is None or not fault.groups or not state.incident_groups \
            or set(fault.groups) & state.incident_groups:
        return False
    return fault.maskable or state.steps > 0


def _make(rung: Rung, fault: Fault, state: LadderState, policy: LadderPolicy, now: float,
          standby: int, where: str, why: str, skipped: list[str]) -> tuple[Decision, str]:
    n = state.tries(rung) + 1
    head = f"{rung.name.lower()} (try {n}/{policy.limit(rung)}): {where}; {why}"
    if skipped:
        head += "; escalated past " + ", ".join(skipped)
    version = _lazy_update(state) if rung in _RESTARTS else None
    if rung is Rung.ROLLBACK:
        version = state.last_good
    d = Decision(rung=rung, at=now, groups=fault.groups, version=version)
    extra = ""
    if rung is Rung.EVICT:
        replace_n = min(standby, len(fault.groups))
        quarantine = _newly_quarantined(fault.groups, state, policy, now)
        d = replace(d, replace=replace_n, mask=replace_n < len(fault.groups),
                    quarantine=quarantine)
        extra = f"; {replace_n} standby of {standby}"
        if d.mask:
            extra += ", survivors mask the rest"
        if quarantine:
            extra += f"; quarantine {list(quarantine)}"
    elif rung is Rung.REQUEUE:
        backoff = backoff_delay(state.tries(Rung.REQUEUE), policy.requeue)
        d = replace(d, backoff=backoff)
        extra = f"; resubmit after {backoff:g}s excluding {list(fault.groups)}"
    if rung is Rung.ROLLBACK:
        extra += f"; {state.running} -> {version}"
    elif version is not None:
        extra += f"; apply queued update {version}"
    return d, head + extra


def _book(exclusions: Mapping[int, NodeRecord], groups: tuple[int, ...], at: float,
          policy: LadderPolicy) -> dict[int, NodeRecord]:
    """``exclusions`` with an eviction of each of ``groups`` at ``at``."""
    out = dict(exclusions)
    for g in groups:
        rec = out.get(g)
        # a wall clock that stepped back books the eviction at the machine's last one rather
        # than refuse to record an eviction that did happen
        t = max(at, rec.faults[-1]) if rec is not None and rec.faults else at
        out, _ = record_fault(out, g, t, policy.exclusion)
    return out


def _newly_quarantined(groups: tuple[int, ...], state: LadderState, policy: LadderPolicy,
                       now: float) -> tuple[int, ...]:
    """The groups an eviction at ``now`` would put into quarantine (what ``advance`` books)."""
    after = _book(state.exclusions, groups, now, policy)
    return tuple(g for g in groups
                 if after[g].quarantines > state.exclusions.get(g, NodeRecord()).quarantines)


def quarantined(state: LadderState, policy: LadderPolicy, now: float) -> frozenset[int]:
    """Machines in quarantine at ``now``: not to be restarted in place or re-admitted."""
    return frozenset(_quarantined_at(state.exclusions, _check_time("now", now),
                                     policy.exclusion))


def advance(state: LadderState, outcome: Outcome, policy: LadderPolicy | None = None,
            ) -> LadderState:
    """The state after ``outcome``: a rung tried (``Tried``) or steps committed (``Committed``).

    ``Tried`` opens the incident if none is open (at the decision's time), counts the try,
    and applies the rung's side effects: the evictions booked in the exclusion history (EVICT,
    even when the replacement failed; the spares it used are the pool owner's to count), and,
    when ``ok``, the code version switched (ROLLBACK, or a lazily applied update; a rolled-back
    version is rejected for good).
    ``Committed`` counts steps: ``policy.resolved_after`` of them close the incident, and
    ``policy.good_after`` on the running version make it the last good one. ``Assigned``
    extends the open incident to the replacement of a group it named.
    """
    policy = policy if policy is not None else LadderPolicy()
    if isinstance(outcome, Replayed):
        return replace(state, replay_since=None)
    if isinstance(outcome, Assigned):
        if state.incident_start is None or outcome.old not in state.incident_groups:
            return state  # the incident is closed (or never named it): nothing carries over
        return replace(state, incident_groups=state.incident_groups | {outcome.new})
    if isinstance(outcome, Committed):
        n = outcome.steps
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise LadderError(f"committed steps {n!r} must be an integer >= 0")
        running_steps = state.running_steps + n
        last_good = state.running if running_steps >= policy.good_after else state.last_good
        if state.incident_start is None:
            return replace(state, running_steps=running_steps, last_good=last_good)
        steps = state.steps + n
        if steps >= policy.resolved_after:
            return replace(state, running_steps=running_steps, last_good=last_good,
                           attempts={}, incident_start=None, steps=0,
                           incident_groups=frozenset())
        return replace(state, running_steps=running_steps, last_good=last_good, steps=steps)
    if not isinstance(outcome, Tried):
        raise LadderError(f"outcome {outcome!r} is not Tried, Committed, Replayed or Assigned")
    d = outcome.decision
    if d.rung is None:
        return state  # gave up: nothing was carried out
    new = state
    if d.incident:
        if d.separate:  # the previous incident is left for its own faults
            state = replace(state, attempts={}, incident_start=None, steps=0,
                            incident_groups=frozenset())
        attempts = dict(state.attempts)
        attempts[d.rung] = attempts.get(d.rung, 0) + 1
        new = replace(state, attempts=attempts, incident_start=(
            d.at if state.incident_start is None else state.incident_start),
            incident_groups=state.incident_groups | frozenset(d.groups))
    if d.rung is Rung.EVICT:
        new = replace(new, exclusions=_book(state.exclusions, d.groups, d.at, policy))
    if d.rung is Rung.REPLAY and outcome.ok:
        new = replace(new, replay_since=d.at)
    if outcome.ok and d.version is not None and d.version != state.running:
        rejected = state.rejected | {state.running} if d.rung is Rung.ROLLBACK else state.rejected
        pending, since = state.pending, state.pending_since
        if d.version == pending or (pending is not None and pending in rejected):
            pending, since = None, None
        new = replace(new, running=d.version, running_steps=0, rejected=frozenset(rejected),
                      pending=pending, pending_since=since)
    return new


def held(state: LadderState, policy: LadderPolicy, now: float) -> tuple[bool, str]:
    """Whether a soft (fail-slow) eviction verdict must wait now, and why: a replay is open
    (its vote needs every member) and has not been open ``replay_hold`` s yet."""
    now = _check_time("now", now)
    since = state.replay_since
    if since is None:
        return False, "no replay is open"
    if now - since >= policy.replay_hold:
        return False, (f"the replay open since {since:.1f} is {now - since:.1f}s old, past "
                       f"the {policy.replay_hold:g}s hold")
    return True, (f"a replay is open since {since:.1f}: evicting a member now would leave "
                  f"its vote short of a majority")


def queue_update(state: LadderState, version: str, now: float) -> LadderState:
    """Queue a code update to be applied lazily (a newer one replaces an older one)."""
    if not isinstance(version, str) or not version:
        raise LadderError(f"code version {version!r} is not a version")
    now = _check_time("now", now)
    if version in state.rejected:
        raise LadderError(f"code version {version!r} was rolled back; queue a new version")
    return replace(state, pending=version, pending_since=now)


def update_due(state: LadderState, policy: LadderPolicy, now: float,
               ) -> tuple[Decision | None, str]:
    """A forced restart for the queued update when it has waited ``update_deadline`` (§7).

    Returns ``(None, reason)`` when nothing is due, or during an incident (the ladder's next
    restart applies the update anyway).
    """
    now = _check_time("now", now)
    if state.pending is None or state.pending_since is None:
        return None, "no queued update"
    if state.incident_start is not None:
        return None, f"update {state.pending} waits: an incident is open"
    waited = now - state.pending_since
    if waited < policy.update_deadline:
        return None, (f"update {state.pending} waits for the next restart "
                      f"({waited:g}s of {policy.update_deadline:g}s)")
    d = Decision(rung=Rung.RETRY, at=now, version=state.pending, incident=False)
    return d, (f"retry in place to apply update {state.pending}: queued {waited:g}s ago, "
               f"deadline {policy.update_deadline:g}s")


