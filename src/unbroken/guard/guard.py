"""The guard itself: every detector's findings in, the one ladder's decisions out.

What each detector watches and why is in its own module (:mod:`unbroken.guard.failslow`,
:mod:`~unbroken.guard.numeric`, :mod:`~unbroken.guard.health`, :mod:`~unbroken.guard.nodes`;
XID lines come from :class:`unbroken.detect.xid_source.XidSource`); the package docstring says
how they fit. This class owns what they share: the ladder's state and its answers, the
incidents the runtime waits on, the orders for the supervisor, and the rule that a detector
that fails is reported once and switched off, never raising into the run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from unbroken.core.actions import Action, PostCode, PostVerdict, Replace, actions_for
from unbroken.core.ladder import (
    Assigned,
    Committed,
    Decision,
    Fault,
    FaultKind,
    LadderPolicy,
    LadderState,
    Replayed,
    Rung,
    Tried,
    advance,
    decide,
    held,
    quarantined,
    queue_update,
    update_due,
)
from unbroken.core.exclusion import records_from_json, records_json
from unbroken.core.replay import majority_culprits, restore_target, verified_checkpoint
from unbroken.events import Event
from unbroken.guard.failslow import FailSlowRounds
from unbroken.guard.health import GroupHealth
from unbroken.guard.nodes import NodeWatch
from unbroken.guard.numeric import NumericWatch
from unbroken.protocol import verdict_key

__all__ = ["Guard"]


def _now() -> float:
    import time

    return time.time()

_XID_ACTION = {"restart_app": "restart-app", "reset_gpu": "reset-gpu",
               "reboot_node": "reboot", "investigate": "investigate", "ignore": None}

_INCIDENT_KIND = {"code": FaultKind.CODE, "implicit": FaultKind.IMPLICIT,
                  "sdc": FaultKind.SDC}


class Guard:
    def __init__(self, emit: Callable[[dict], None], *, standby: Callable[[], int] = lambda: 0,
                 xid_log: str | None = None, policy: LadderPolicy | None = None,
                 act: bool = False, base_model: str = "gpt",
                 uid_of_pid: Callable[[int], int | None] = lambda pid: None,
                 ckpt_every: int = 50,
                 maskable: Callable[[tuple[int, ...]], bool] = lambda groups: bool(groups),
                 ) -> None:
        self.emit = emit
        self.act = act
        # for the supervisor, carried out in order (core.actions: typed, one mapping per rung)
        self.orders: list[Action] = []
        self.uid_of_pid = uid_of_pid
        self.maskable = maskable  # can the survivors mask these groups (the supervisor knows)
        # the warm pool's size now: the supervisor owns the pool, the ladder reads it per decision
        self.standby = standby
        self.state = LadderState()
        self.models = {"v0": base_model}  # code version -> trainer factory
        self.code_n = 0                   # code records posted
        self.top = -1                     # newest committed step
        self.verified = 0                 # newest checkpoint step whose SDC check passed
        self.saved: set[int] = set()      # checkpoint steps on disk (written or loaded)
        self.ckpt_every = ckpt_every
        self.answered: set[tuple[str, int, int]] = set()  # (what, step, n) already answered
        self.opened: dict[tuple[int, int], float] = {}    # incident (step, n) -> first seen
        self.policy = policy or LadderPolicy()
        self.seen: set[int] = set()  # steps whose first commit was read
        # the detectors (one module each): their windows and what they reported already
        self.slow = FailSlowRounds()
        self.numeric = NumericWatch()
        self.health = GroupHealth()
        self.nodes = NodeWatch()
        self._held_for: float | None = None  # the open replay a held verdict was reported for
        self.xid = None
        self.broken: set[str] = set()
        if xid_log is not None:
            from unbroken.detect.xid_source import XidSource

            self.xid = XidSource(xid_log)

    def _ladder(self, fault: Fault, t: float, what: str, actionable: bool = False,
                how: str = "fail-slow", answered: bool = False, always: bool = False):
        """Decide and journal; ``actionable`` decisions become the supervisor's actions here
        (``core.actions.actions_for``) when acting, or ``always`` (deaths and hangs: masking and
        replacing them is the runtime's baseline, not a guard action); ``answered`` ones
        (runtime incidents) are carried out by the caller."""
        # spares promised to orders the supervisor has not carried out yet are not free
        free = max(0, self.standby() - sum(isinstance(o, Replace) for o in self.orders))
        d, reason = decide(fault, self.state, self.policy, t, free)
        acting = (self.act or always) and actionable
        mode = "act" if acting or (answered and self.act) else "log-only"
        self.emit({"event": Event.LADDER, "for": what, "fault": fault.kind.value, "mode": mode,
                   "rung": d.rung.name.lower() if d.rung is not None else None,
                   "groups": list(d.groups), "exit_code": d.exit_code, "reason": reason, "t": t})
        if acting:
            self.orders.extend(actions_for(d, how, reason,
                                           quarantined(self.state, self.policy, t)))
            self._tried(d)
        return d

    def on_assigned(self, new: int, old: int) -> None:
        """Spare ``new`` took the slot of ``old``: a failure of ``new`` before the incident
        closed climbs the ladder from where ``old``'s left it (``core.ladder.Assigned``)."""
        self.state = advance(self.state, Assigned(old, new), self.policy)

    def on_member_lost(self, uid: int, how: str, now: float) -> Decision:
        """A member died (``how`` = "exit") or hung (the survivors re-formed without it:
        "heartbeat"): the ladder answers, normally with its mask rung; the actions (evict,
        replace from the pool, respawn, restart, stop) go to the supervisor."""
        kind = FaultKind.HANG if how == "heartbeat" else FaultKind.DEATH
        return self._ladder(Fault(kind, groups=(uid,), maskable=self.maskable((uid,))), now,
                            f"{kind.value} group {uid}", actionable=True, how=how, always=True)

    def on_wipeout(self, groups: tuple[int, ...], now: float, what: str) -> Decision:
        """Slots no survivor can cover (``groups``: their last holders; empty when every
        member is gone): the ladder's evict / retry / restart / requeue rungs answer it."""
        return self._ladder(Fault(FaultKind.WIPE_OUT, groups=tuple(groups)), now, what,
                            actionable=True, how="wipe-out", always=True)

    # ------------------------------------------------------------------ acting
    def _tried(self, d: Decision) -> None:
        """Book a carried-out decision; a lazily queued update it carries is posted now."""
        if d.version is not None and d.version != self.state.running:
            self._post_code(d.version)
        before = self.state.exclusions
        self.state = advance(self.state, Tried(d), self.policy)
        if self.state.exclusions != before:  # an eviction booked: durable (etcd) state
            self.emit({"event": Event.EXCLUSIONS,
                       "exclusions": records_json(self.state.exclusions)})

    def restore_exclusions(self, data: object) -> None:
        """Take the eviction history over (a standby: what its predecessor kept in etcd), so
        that the nodes it quarantined stay quarantined; ``ExclusionError`` when malformed."""
        self.state = replace(self.state, exclusions=records_from_json(data))
        self.emit({"event": Event.EXCLUSIONS, "restored": True,
                   "exclusions": records_json(self.state.exclusions)})

    def _post_code(self, version: str) -> int:
        self.code_n += 1
        self.orders.append(PostCode(self.code_n,
                                    {"version": version, "model": self.models[version]}))
        return self.code_n

    def queue_update(self, version: str, model: str, now: float) -> None:
        """A code update arrives: queued, applied lazily at the next restart the ladder
        decides, forced after ``policy.update_deadline`` (byterobust §7)."""
        self.models[version] = model
        self.state = queue_update(self.state, version, now)
        self.emit({"event": Event.LADDER, "for": f"update {version}", "fault": "update",
                   "mode": "act" if self.act
                   else "log-only", "rung": None, "groups": [], "exit_code": None,
                   "reason": f"update {version} queued: applied at the next restart, forced "
                             f"after {self.policy.update_deadline:g}s", "t": now})

    def _forced_update(self, now: float) -> None:
        d, reason = update_due(self.state, self.policy, now)
        if d is None or not self.act:
            return
        self.emit({"event": Event.LADDER, "for": f"update {d.version}", "fault": "update",
                   "mode": "act",
                   "rung": "retry", "groups": [], "exit_code": None, "reason": reason, "t": now})
        self._tried(d)

    def new_attempt(self) -> None:
        """A relaunched job (new processes, a new store) numbers its incidents from 0 again:
        the previous attempt's answers must not hide them."""
        self.answered.clear()
        self.opened.clear()
        self.state = advance(self.state, Replayed(), self.policy)  # its replay went with it

    def _verdict(self, step: int, n: int, obj: dict) -> None:
        self.orders.append(PostVerdict(verdict_key(step, n), obj))

    def _resolved(self, incident: str, t: float, detected: float, how: str,
                  **extra) -> None:
        self.emit({"event": Event.RESOLVED, "incident": incident, "detected_t": detected,
                   "how": how, "t": t, **extra})

    def on_incident(self, ev: dict, now: float) -> None:
        """A member's ``incident`` line (every member writes one; the first is answered)."""
        key = ("incident", int(ev["step"]), int(ev["n"]))
        if key in self.answered:
            return
        self.answered.add(key)
        step, n = key[1], key[2]
        try:
            kind = _INCIDENT_KIND.get(ev.get("kind"))
            if kind is None:
                raise ValueError(f"unknown incident kind {ev.get('kind')!r}")
            t_seen = float(ev.get("t", now))
            self.emit({"event": Event.ALERT, "how": ev["kind"], "group": None, "step": step,
                       "reason": _incident_reason(ev), "t": t_seen})
            self._answer(Fault(kind), ev, step, n, now, t_seen)
        except Exception as exc:
            self._unanswerable(exc, step, n)

    def _unanswerable(self, exc: BaseException, step: int, n: int) -> None:
        """The guard itself failed on an incident the members wait on: say so and stop them
        (exit 6) rather than leave them waiting or guess an answer."""
        self._fail("incident", exc)
        if self.act:
            self._verdict(step, n, {"action": "stop",
                                    "reason": f"the guard could not answer: {exc!r}"[:300]})

    def _answer(self, fault: Fault, ev: dict, step: int, n: int, now: float,
                t_seen: float) -> None:
        what = f"{fault.kind.value} at step {step}"
        d = self._ladder(fault, now, what, answered=True)
        if not self.act:
            return
        incident = ev.get("kind", fault.kind.value)
        if d.rung is None or d.rung is Rung.REQUEUE:
            # requeueing needs a scheduler this demo does not have: stopping is what is left
            self._verdict(step, n, {"action": "stop", "reason": f"ladder: {what} -> "
                                    f"{d.rung.name.lower() if d.rung else 'give up'}"})
            self.state = advance(self.state, Tried(d), self.policy)
            return
        if d.rung is Rung.REPLAY:  # the mismatched types; none named (a NaN): every type
            types = sorted(int(t) for t in ev.get("mismatch", {}))
            self._verdict(step, n, {"action": "replay", "types": types})
            self.state = advance(self.state, Tried(d), self.policy)
            self.opened[(step, n + 1)] = t_seen
            return
        if d.rung in (Rung.RETRY, Rung.ROLLBACK):
            code = self._post_code(d.version) if d.version not in (None,
                                                                    self.state.running) else 0
            self.state = advance(self.state, Tried(d), self.policy)
            self._verdict(step, n, {"action": "retry", **({"code": code} if code else {})})
            how = (f"rollback {ev.get('version', '?')} -> {d.version}" if d.rung is Rung.ROLLBACK
                   else "retry in place" + (f" with update {d.version}" if code else ""))
            self._resolved(incident, now, t_seen, how, step=step)
            return
        # RESTART (or anything that needs the committed state rebuilt): the verified checkpoint
        self.state = advance(self.state, Tried(d), self.policy)
        self._restore(step, n, incident, now, t_seen, f"{d.rung.name.lower()} from checkpoint")

    def _restore(self, step: int, n: int, incident: str, now: float, t_seen: float,
                 how: str) -> None:
        """Verdict: every member restores the roll-back target; journal it as a restart."""
        target = restore_target(self.verified, self.top, self.ckpt_every, self.saved)
        self._verdict(step, n, {"action": "restore", "step": target})
        self.emit({"event": Event.RESTART, "step": target, "source": "checkpoint",
                   "incident": incident,  # the fault it answers (core.ettr books it there)
                   "reason": f"{incident}: roll back to step {target}", "t": now,
                   "t_ready": now})
        self._resolved(incident, now, t_seen, f"{how} @ step {target}", step=target,
                       restart=True)

    def on_replay(self, ev: dict, now: float) -> None:
        """The digests every member replayed: the majority names the corrupt machine, which
        is evicted at once; then every member restores the verified checkpoint."""
        step, n = int(ev["step"]), int(ev["n"])
        key = ("replay", step, n)
        if key in self.answered:
            return
        self.answered.add(key)
        try:
            self._replayed(ev, step, n, now)
        except Exception as exc:
            self._unanswerable(exc, step, n + 1)

    def _replayed(self, ev: dict, step: int, n: int, now: float) -> None:
        self.state = advance(self.state, Replayed(), self.policy)
        t_seen = self.opened.pop((step, n + 1), float(ev.get("t", now)))
        digests = {int(t): {int(w): int(d) for w, d in ds.items()}
                   for t, ds in ev.get("digests", {}).items()}
        slots, why = majority_culprits(digests)
        uids = tuple(int(ev["uids"][str(s)]) for s in slots if str(s) in ev.get("uids", {}))
        self.emit({"event": Event.ALERT, "how": "replay", "group": list(uids) or None,
                   "step": step, "reason": why, "t": now})
        if not uids:  # inconclusive: nothing to evict, the state is suspect: roll back
            d = self._ladder(Fault(FaultKind.IMPLICIT), now, f"replay at step {step}: {why}",
                             answered=True)
            if self.act and d.rung is not None:
                self.state = advance(self.state, Tried(d), self.policy)
                self._restore(step, n + 1, "sdc", now, t_seen, "inconclusive replay: restore")
            return
        d = self._ladder(Fault(FaultKind.CORRUPT, groups=uids, maskable=self.maskable(uids)), now,
                         f"corrupt {list(uids)}", actionable=True, how="replay")
        if self.act:
            self._restore(step, n + 1, "sdc", now, t_seen,
                          f"replay named {list(uids)}: {d.rung.name.lower() if d.rung else '?'}"
                          f", restore")

    def on_checkpoint(self, ev: dict) -> None:
        """A checkpoint on disk: one written (``checkpoint``) or loaded (a ``restore`` from a
        checkpoint). Only these are roll-back targets: a verified step's save can die with
        its writer."""
        if ev.get("event") == Event.CHECKPOINT or ev.get("source") == "checkpoint":
            self.saved.add(int(ev["step"]))

    def on_check(self, ev: dict) -> None:
        """A passing SDC check at step k: the checkpoint written after it is verified."""
        target = verified_checkpoint(int(ev["step"]), self.ckpt_every) if ev.get("ok") else None
        if target is not None:
            self.verified = max(self.verified, target)

    def _failslow(self, now: float) -> None:
        if "fail-slow" in self.broken:
            return
        n_closed = self.slow.closing(now)
        if n_closed is None:
            return
        hold, why = held(self.state, self.policy, now)
        if hold:
            # seen in the soak: group 0 evicted mid-replay, "1/1 agree -> no culprit", the
            # corrupt machine stayed, the ladder gave up; judged once the replay is answered
            if self._held_for != self.state.replay_since:  # said once per replay
                self._held_for = self.state.replay_since
                self.emit({"event": Event.DETECTOR_WARNING, "detector": "fail-slow",
                           "message": f"verdict waits: {why}", "t": now})
            return
        try:
            new, reason = self.slow.judge(n_closed)
            for g in new:
                self.emit({"event": Event.ALERT, "how": "fail-slow", "group": g,
                           "reason": reason, "t": now})
                self._ladder(Fault(FaultKind.FAIL_SLOW, groups=(int(g),),
                                   maskable=self.maskable((int(g),))),
                             now, f"fail-slow group {g}", actionable=True)
        except Exception as exc:
            self._fail("fail-slow", exc)

    def on_stall(self, chosen, reason: str) -> None:
        """The stack-dump vote over a stall (``detect.stacks.locate_stall``, run by the
        supervisor off its loop): the odd one's group goes to the ladder."""
        self.emit({"event": Event.ALERT, "how": "stack", "group": list(chosen.ranks)
                   if chosen else None, "reason": reason})
        if chosen is not None:
            stalled = tuple(int(u) for u in chosen.ranks)
            self._ladder(Fault(FaultKind.HANG, groups=stalled,
                               maskable=self.maskable(stalled)), _now(),
                         f"stall of {list(chosen.ranks)}", actionable=True, how="stack")

    def stall_failed(self, exc: BaseException) -> None:
        self._fail("stack", exc)

    def _fail(self, name: str, exc: BaseException) -> None:
        if name not in self.broken:
            self.broken.add(name)
            self.emit({"event": Event.DETECTOR_WARNING, "detector": name,
                       "message": f"{name} detector switched off: {exc!r}"[:300]})

    def on_commit(self, ev: dict, uid: int | None = None) -> None:
        """Every group's commit feeds fail-slow (its compute time); the first commit of each
        step feeds the numeric detector (the step's loss and gradient norm)."""
        if uid is not None and "fail-slow" not in self.broken and "compute_s" in ev:
            try:
                self.slow.add(float(ev["t"]), uid, float(ev["compute_s"]))
            except Exception as exc:
                self._fail("fail-slow", exc)
        if "numeric" in self.broken or ev.get("step") in self.seen:
            return
        if isinstance(ev.get("step"), int) and ev["step"] > self.top:
            self.top = ev["step"]
            self.state = advance(self.state, Committed(1), self.policy)
        try:
            self.seen.add(ev["step"])
            for f in self.numeric.observe(ev):
                t = float(ev["t"])
                self.emit({"event": Event.ALERT, "how": "numeric", "group": None,
                           "step": ev["step"], "kind": f.kind, "signal": f.signal,
                           "value": f.value, "reason": f"{f.signal}: {f.reason}", "t": t})
                what = f"numeric {f.kind}" + (" of grad norm" if f.signal != "loss" else "")
                self._ladder(Fault(FaultKind.IMPLICIT), t, what)
        except Exception as exc:  # a broken detector must not disturb training
            self._fail("numeric", exc)

    def on_health(self, ev: dict, uid: int) -> None:
        if "health" not in self.broken:
            self.health.add(uid, ev)

    def _health(self, now: float, live: set[int] | None) -> None:
        if "health" in self.broken:
            return
        try:
            for u, signals, reason in self.health.judge(now, live):
                self.emit({"event": Event.ALERT, "how": "health", "group": u,
                           "signals": signals, "reason": reason, "t": now})
        except Exception as exc:
            self._fail("health", exc)

    def poll(self, now: float, live: set[int] | None = None) -> None:
        """Fail-slow over the rounds so far; health outliers among ``live`` groups; a queued
        update past its deadline; new kernel-log lines: XID faults (malformed lines as
        warnings)."""
        self._failslow(now)
        self._health(now, live)
        self._forced_update(now)
        if self.xid is None or "xid" in self.broken:
            return
        try:
            read = self.xid.poll()
            for msg in read.problems:
                self.emit({"event": Event.DETECTOR_WARNING, "detector": "xid", "message": msg})
            for bad in read.malformed:
                self.emit({"event": Event.DETECTOR_WARNING, "detector": "xid",
                           "message": f"line {bad.lineno}: {bad.error}"[:300]})
            for hit in read.hits:
                uid = self.uid_of_pid(hit.event.pid) if hit.event.pid is not None else None
                self._xid(uid, hit.event.code, hit.action, hit.reason, hit.event.pci, now)
        except Exception as exc:
            self._fail("xid", exc)

    def _xid(self, uid: int | None, code: int, action: str, reason: str, pci: str,
             now: float, **where) -> None:
        """One XID line, its worker ``uid`` (None: no worker of this job named): an alert,
        and the ladder's answer to its action class."""
        self.emit({"event": Event.ALERT, "how": "xid", "group": uid, "code": code,
                   "action": action, "pci": pci, "reason": reason, **where, "t": now})
        action = _XID_ACTION.get(action, action)
        if action is not None:
            groups = (uid,) if uid is not None else ()
            d = self._ladder(Fault(FaultKind.XID, groups=groups, xid_action=action,
                                   maskable=bool(groups) and self.maskable(groups)), now,
                             f"xid {code}", actionable=True, how="xid")
            if self.act and groups and d.rung in (Rung.MASK, Rung.EVICT, Rung.RETRY):
                verb = "restart in place" if d.rung is Rung.RETRY else "evict"
                self._resolved("xid", now, now, f"{verb} group {uid}", group=uid, code=code)

    def on_node_xid(self, ev: dict, now: float) -> None:
        """An XID of a node's own kernel log, its pid mapped to a worker by that node's agent
        (``nodes.health``): answered as the coordinator's own ``--xid-log`` lines are."""
        if "xid" in self.broken:
            return
        try:
            uid = ev.get("uid")
            self._xid(int(uid) if uid is not None else None, int(ev["code"]), str(ev["action"]),
                      str(ev["reason"]), str(ev.get("pci", "")), now, node=ev.get("node"))
        except Exception as exc:
            self._fail("xid", exc)

    def on_node_health(self, ev: dict) -> None:
        """A node's machine sample (:mod:`unbroken.guard.nodes`): its alerts, log-only."""
        if "node_health" in self.broken:
            return
        try:
            for alert in self.nodes.observe(ev):
                self.emit(alert)
            for msg in ev.get("xid_problems", ()):
                self.emit({"event": Event.DETECTOR_WARNING, "detector": "xid",
                           "message": f"node {ev['node']}: {msg}"[:300]})
        except Exception as exc:
            self._fail("node_health", exc)


def _incident_reason(ev: dict) -> str:
    kind = ev.get("kind")
    if kind == "code":
        return f"{ev.get('errors', '?')} member(s) failed the step on {ev.get('version', '?')}"
    if kind == "implicit":
        return f"{ev.get('nonfinite', '?')} non-finite gradient element(s) in the reduced sum"
    mism = ev.get("mismatch", {})
    return "bitwise mismatch: " + "; ".join(
        f"type {t} hosts {sorted(int(w) for w in hosts)}" for t, hosts in sorted(mism.items()))
