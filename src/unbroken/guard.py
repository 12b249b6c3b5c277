"""The guard on the coordinator: detectors in, ladder decisions journaled (log-only by default).

Why log-only by default: anything that can kill or evict part of a job must first prove itself
on real runs (the nvidia-resiliency-ext rule). So the guard runs every detector the coordinator
can feed and asks the one policy core (:func:`unbroken.core.ladder.decide`) what it would do;
it journals the detection (``alert``: a detection nobody acted on, unlike the runtime's
``detected``) and the decision (``ladder``, ``"mode": "log-only"``) but executes nothing.
Process deaths and hangs are masked by the train runtime in-band; the supervisor asks this same
ladder what to do about them (see below).

Detectors wired here:

* **fail-slow** — every group journals its own compute time per step (commit times cannot show
  a straggler: a synchronous step waits for the slowest); rounds of 1 s, a group slower than
  1.5x its peers' median in 5 consecutive rounds is flagged (:func:`unbroken.core.anomaly.
  failslow`, ByteRobust's 5 rounds of 10 s scaled to the demo);
* **numeric** — a NaN/Inf or a more than 5x jump of the committed loss
  (:func:`unbroken.core.anomaly.numeric_event`): an implicit-failure fault;
* **health** — every group's agent (:mod:`unbroken.detect.health`) journals its CPU use, memory
  and threads once a second; each second the latest samples of the live groups are compared
  peer-relatively (:func:`unbroken.core.anomaly.peer_outliers`, backendai.md §2), and a group
  that stands out in 3 consecutive rounds is reported (an ``alert``, never an action);
* **node health** — each node agent's machine sample (memory, disk, load: ``nodes.health``)
  judged by :func:`unbroken.core.nodes.health_problems`; a problem is an ``alert`` once while
  it lasts (log-only); and against the other nodes' newest samples
  (:func:`unbroken.core.nodes.peer_health`: load per CPU, share of memory in use), a node
  above its peers in 3 consecutive samples is an ``alert`` (``node_peers``, log-only);
* **XID** — new lines of a kernel-log file (``--xid-log``; dmesg saved to a file, so it can be
  tested here) mapped by the XID catalog to an action class
  (:class:`unbroken.detect.xid_source.XidSource`); a malformed line is journaled as a
  ``detector_warning`` and never stops anything. On many machines each node agent reads its
  own kernel log (``unbroken agent --xid-log``) and forwards the hits, pids already mapped to
  its workers (``on_node_xid``): the same answer.

A detector that fails is reported once and switched off; it never raises into the run.

``act=True`` (``--guard act``) carries the decisions out. The guard does not touch processes
or the store itself: it appends typed actions (:mod:`unbroken.core.actions`, one pure mapping
from a rung to what it means for the processes) to ``self.orders`` and the supervisor carries
them out in order — ``Evict`` (SIGKILL, death notice), ``Replace`` (a warm spare takes the
slot), ``Respawn`` (a fresh process in the same slot: retry in place), ``Quarantine``,
``RestartJob`` (from the checkpoint, after a requeue's backoff), ``StopJob`` (the ladder gave
up: exit 6), ``PostCode`` (code record ``code/<n>``: every member hot-swaps at one step
boundary) and ``PostVerdict`` (the answer to a runtime incident, ``StackedRunner._incident``:
``retry``, ``replay``, ``restore`` or ``stop``).

Deaths and hangs (``on_member_lost``) and wipe-outs (``on_wipeout``) ask the same ladder, and
their answers are carried out in log-only mode too: masking and replacing a dead group is the
runtime's baseline, not a guard action that could kill a healthy job.

Runtime incidents, read from the groups' journals, map onto ladder faults: a step error ->
``CODE``, a non-finite sum -> ``IMPLICIT``, a bitwise mismatch of redundant hosts -> ``SDC``;
the replay's majority names the corrupt machine -> ``CORRUPT`` (evicted at once, then every
member restores the last checkpoint whose SDC check passed). Each answer is journaled as
``ladder`` (the decision and its reason) and, once carried out, ``resolved`` (what the report's
ETTR accounting charges the fault's time to).
"""

from __future__ import annotations

from typing import Callable

from unbroken.core.actions import Action, PostCode, PostVerdict, Replace, actions_for
from unbroken.core.nodes import PEER_ROUNDS, health_problems, peer_health
from unbroken.core.anomaly import (
    FailSlowPolicy,
    NumericPolicy,
    PeerPolicy,
    bucket_rounds,
    failslow,
    numeric_event,
    peer_outliers,
    persisting,
)
from unbroken.core.ladder import (
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
from unbroken.core.replay import majority_culprits, restore_target, verified_checkpoint
from unbroken.events import Event
from unbroken.protocol import verdict_key

__all__ = ["Guard"]


def _now() -> float:
    import time

    return time.time()

_XID_ACTION = {"restart_app": "restart-app", "reset_gpu": "reset-gpu",
               "reboot_node": "reboot", "investigate": "investigate", "ignore": None}


# gradient norms swing by 10-30x in the first tens of steps of a healthy run (the demo's GPT
# under AdamW: 61 at step 10, 6x its recent median at step 33), so their jump check waits for
# 50 committed steps and compares with the median of the last 50 (our choice)
_NUMERIC = {"loss": NumericPolicy(), "grad_norm": NumericPolicy(window=50, min_history=50)}

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
        self.ckpt_every = ckpt_every
        self.answered: set[tuple[str, int, int]] = set()  # (what, step, n) already answered
        self.health: dict[int, dict] = {}     # uid -> latest health sample
        self.health_hits: dict[int, int] = {}  # uid -> consecutive outlier rounds
        self.health_round = 0.0
        self.health_told: set[int] = set()
        self.node_told: set[tuple[int, str]] = set()  # (node, signal) problems alerted
        self.node_latest: dict[int, dict] = {}  # node -> newest machine sample
        self.node_hits: dict[int, int] = {}     # node -> consecutive samples above its peers
        self.opened: dict[tuple[int, int], float] = {}    # incident (step, n) -> first seen
        self.policy = policy or LadderPolicy()
        self.losses: list[float] = []
        self.gnorms: list[float] = []
        self.seen: set[int] = set()
        self.slow_policy = FailSlowPolicy.demo()
        self.samples: list[tuple[float, int, float]] = []  # (t, group uid, compute_s)
        self.slow_start: float | None = None
        self.slow_closed = 0  # closed fail-slow rounds already judged
        self._held_for: float | None = None  # the open replay a held verdict was reported for
        self.flagged: set[int] = set()
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
        self.state = advance(self.state, Tried(d), self.policy)

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
        target = restore_target(self.verified, self.top, self.ckpt_every)
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

    def on_check(self, ev: dict) -> None:
        """A passing SDC check at step k: the checkpoint written after it is verified."""
        target = verified_checkpoint(int(ev["step"]), self.ckpt_every) if ev.get("ok") else None
        if target is not None:
            self.verified = max(self.verified, target)

    def _failslow(self, now: float) -> None:
        if "fail-slow" in self.broken or self.slow_start is None:
            return
        if now - self.slow_start < self.slow_policy.round_s * self.slow_policy.rounds:
            return
        n_closed = int((now - self.slow_start) // self.slow_policy.round_s)
        if n_closed <= self.slow_closed:
            return  # the verdict changes only when a round closes (the supervisor's loop
            #         ticks 20 times a second: re-bucketing every sample each tick was its CPU)
        hold, why = held(self.state, self.policy, now)
        if hold:
            # seen in the soak: group 0 evicted mid-replay, "1/1 agree -> no culprit", the
            # corrupt machine stayed, the ladder gave up; judged once the replay is answered
            if self._held_for != self.state.replay_since:  # said once per replay
                self._held_for = self.state.replay_since
                self.emit({"event": Event.DETECTOR_WARNING, "detector": "fail-slow",
                           "message": f"verdict waits: {why}", "t": now})
            return
        self.slow_closed = n_closed
        # a verdict needs the last K rounds (twice that, so a streak's length still reads
        # right): older samples go, or every round re-buckets the whole run (O(steps^2))
        p = self.slow_policy
        keep = self.slow_start + max(0, n_closed - 2 * p.rounds) * p.round_s
        if self.samples and self.samples[0][0] < keep:
            self.samples = [x for x in self.samples if x[0] >= keep]
        try:
            rounds = bucket_rounds(self.samples, self.slow_start, self.slow_policy)
            # only closed rounds: the current one is still filling
            closed = rounds[:n_closed]
            flagged, reason = failslow(closed, self.slow_policy)
            for g in sorted(set(flagged) - self.flagged):
                self.flagged.add(g)
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
        step feeds the numeric detector (the step's loss)."""
        if uid is not None and "fail-slow" not in self.broken and "compute_s" in ev:
            try:
                t = float(ev["t"])
                if self.slow_start is None:
                    self.slow_start = t
                self.samples.append((t, uid, float(ev["compute_s"])))
            except Exception as exc:
                self._fail("fail-slow", exc)
        if "numeric" in self.broken or ev.get("step") in self.seen:
            return
        if isinstance(ev.get("step"), int) and ev["step"] > self.top:
            self.top = ev["step"]
            self.state = advance(self.state, Committed(1), self.policy)
        try:
            self.seen.add(ev["step"])
            # the committed loss and gradient norm: a NaN or a > 5x jump is an implicit
            # failure (journaled with the ladder's answer; the step is committed already, the
            # runtime's in-band check is what stops a NaN before it is)
            for signal, history in (("loss", self.losses), ("grad_norm", self.gnorms)):
                if signal not in ev:
                    continue
                value = float(ev[signal])
                # the window's tail only (a few non-finite entries may sit in it): the whole
                # history made this O(steps) per commit, O(steps^2) over a run
                found, reason = numeric_event(history[-4 * _NUMERIC[signal].window:], value,
                                              _NUMERIC[signal])
                history.append(value)
                if found is None:
                    continue
                t = float(ev["t"])
                self.emit({"event": Event.ALERT, "how": "numeric", "group": None,
                           "step": ev["step"], "kind": found.kind, "signal": signal,
                           "value": value, "reason": f"{signal}: {reason}", "t": t})
                what = f"numeric {found.kind}" + (" of grad norm" if signal != "loss" else "")
                self._ladder(Fault(FaultKind.IMPLICIT), t, what)
        except Exception as exc:  # a broken detector must not disturb training
            self._fail("numeric", exc)

    #: health signals compared across peers, and the rounds an outlier must persist (thread
    #: counts are reported, not compared: rank 0's checkpoint writer is one more, by design)
    HEALTH_SIGNALS = ("cpu_util", "rss_mb")
    HEALTH_ROUNDS = 3

    def on_health(self, ev: dict, uid: int) -> None:
        if "health" not in self.broken:
            self.health[uid] = ev

    def _health(self, now: float, live: set[int] | None) -> None:
        if "health" in self.broken or now - self.health_round < 1.0:
            return
        self.health_round = now
        try:
            fresh = {u: {k: float(e[k]) for k in self.HEALTH_SIGNALS if k in e}
                     for u, e in self.health.items()
                     if now - float(e.get("t", 0)) < 2.5 and (live is None or u in live)}
            flags, reason = peer_outliers({u: sig for u, sig in fresh.items() if sig},
                                          PeerPolicy())
            self.health_hits, due = persisting(self.health_hits, flags, self.HEALTH_ROUNDS)
            for u in due:
                if u not in self.health_told:
                    self.health_told.add(u)
                    self.emit({"event": Event.ALERT, "how": "health", "group": u,
                               "signals": {k: round(z, 2) for k, z in flags[u].items()},
                               "reason": f"{reason} ({self.HEALTH_ROUNDS} rounds in a row)",
                               "t": now})
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
        """A node's machine sample: each problem (``core.nodes.health_problems``) is an alert
        once while it lasts (log-only: for an operator, not a reason to kill a job)."""
        if "node_health" in self.broken:
            return
        try:
            node = ev["node"]
            now = {sig: why for sig, why in health_problems(ev)}
            for sig, why in now.items():
                if (node, sig) not in self.node_told:
                    self.node_told.add((node, sig))
                    self.emit({"event": Event.ALERT, "how": "node_health", "node": node,
                               "signal": sig, "group": None, "reason": why, "t": ev["t"]})
            self.node_told -= {(n, s) for n, s in self.node_told if n == node and s not in now}
            self._node_peers(node, ev)
            for msg in ev.get("xid_problems", ()):
                self.emit({"event": Event.DETECTOR_WARNING, "detector": "xid",
                           "message": f"node {node}: {msg}"[:300]})
        except Exception as exc:
            self._fail("node_health", exc)

    def _node_peers(self, node: int, ev: dict) -> None:
        """The node's sample against the other live nodes' newest (``core.nodes.peer_health``):
        above them for ``PEER_ROUNDS`` samples in a row is one alert, until it falls back."""
        self.node_latest[node] = ev
        live = {n: s for n, s in self.node_latest.items()
                if ev["t"] - s["t"] <= _NODE_SAMPLE_STALE_S}  # a lost node leaves the peers
        above, why = peer_health(live)
        if node not in above:
            self.node_hits[node] = 0
            return
        self.node_hits[node] = self.node_hits.get(node, 0) + 1
        if self.node_hits[node] == PEER_ROUNDS:
            self.emit({"event": Event.ALERT, "how": "node_peers", "node": node,
                       "signal": ",".join(sorted(above[node])), "group": None,
                       "reason": f"{why}, {PEER_ROUNDS} samples in a row", "t": ev["t"]})


#: a node sample older than this (five of its agent's 1 s samples) is not a peer any more
_NODE_SAMPLE_STALE_S = 5.0


def _incident_reason(ev: dict) -> str:
    kind = ev.get("kind")
    if kind == "code":
        return f"{ev.get('errors', '?')} member(s) failed the step on {ev.get('version', '?')}"
    if kind == "implicit":
        return f"{ev.get('nonfinite', '?')} non-finite gradient element(s) in the reduced sum"
    mism = ev.get("mismatch", {})
    return "bitwise mismatch: " + "; ".join(
        f"type {t} hosts {sorted(int(w) for w in hosts)}" for t, hosts in sorted(mism.items()))
