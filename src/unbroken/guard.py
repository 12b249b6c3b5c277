"""The guard on the coordinator: detectors in, ladder decisions journaled (log-only by default).

Why log-only by default: anything that can kill or evict part of a job must first prove itself
on real runs (the nvidia-resiliency-ext rule). So the guard runs every detector the coordinator
can feed and asks the one policy core (:func:`unbroken.core.ladder.decide`) what it would do;
it journals the detection (``alert``: a detection nobody acted on, unlike the runtime's
``detected``) and the decision (``ladder``, ``"mode": "log-only"``) but executes nothing. Process deaths and hangs are already handled by the train runtime
(masking, spares, restarts); this adds the signals that runtime does not see.

Detectors wired here:

* **fail-slow** — every group journals its own compute time per step (commit times cannot show
  a straggler: a synchronous step waits for the slowest); rounds of 1 s, a group slower than
  1.5x its peers' median in 5 consecutive rounds is flagged (:func:`unbroken.core.anomaly.
  failslow`, ByteRobust's 5 rounds of 10 s scaled to the demo);
* **numeric** — a NaN/Inf or a more than 5x jump of the committed loss
  (:func:`unbroken.core.anomaly.numeric_event`): an implicit-failure fault;
* **XID** — new lines of a kernel-log file (``--xid-log``; dmesg saved to a file, so it can be
  tested here) mapped by the XID catalog to an action class
  (:class:`unbroken.detect.xid_source.XidSource`); a malformed line is journaled as a
  ``detector_warning`` and never stops anything.

A detector that fails is reported once and switched off; it never raises into the run.

``act=True`` (``unbroken demo --guard act``) lets one decision through: a straggler the ladder
would mask or evict is evicted by the launcher (SIGKILL, death notice), the runtime masks it
and a warm spare takes its slot. Everything else stays log-only until its rung exists.
"""

from __future__ import annotations

from typing import Callable

from unbroken.core.anomaly import FailSlowPolicy, bucket_rounds, failslow, numeric_event
from unbroken.core.ladder import Fault, FaultKind, LadderPolicy, LadderState, Rung, decide

__all__ = ["Guard"]


def _now() -> float:
    import time

    return time.time()

_XID_ACTION = {"restart_app": "restart-app", "reset_gpu": "reset-gpu",
               "reboot_node": "reboot", "investigate": "investigate", "ignore": None}


class Guard:
    def __init__(self, emit: Callable[[dict], None], *, standby: int = 0,
                 xid_log: str | None = None, policy: LadderPolicy | None = None,
                 act: bool = False) -> None:
        self.emit = emit
        # act=True: a straggler the ladder would mask or evict is handed to the launcher in
        # ``evictions`` (it kills the group; the runtime masks it and a spare takes over)
        self.act = act
        self.evictions: list[tuple[int, str]] = []  # (group uid, which detector)
        self.state = LadderState(standby=standby)
        self.policy = policy or LadderPolicy()
        self.losses: list[float] = []
        self.seen: set[int] = set()
        self.slow_policy = FailSlowPolicy.demo()
        self.samples: list[tuple[float, int, float]] = []  # (t, group uid, compute_s)
        self.slow_start: float | None = None
        self.flagged: set[int] = set()
        self.xid = None
        self.broken: set[str] = set()
        if xid_log is not None:
            from unbroken.detect.xid_source import XidSource

            self.xid = XidSource(xid_log)

    def _ladder(self, fault: Fault, t: float, what: str, actionable: bool = False,
                how: str = "fail-slow"):
        d, reason = decide(fault, self.state, self.policy, t)
        acting = self.act and actionable and d.rung in (Rung.MASK, Rung.EVICT)
        self.emit({"event": "ladder", "for": what, "mode": "act" if acting else "log-only",
                   "rung": d.rung.name.lower() if d.rung is not None else None,
                   "groups": list(d.groups), "exit_code": d.exit_code, "reason": reason, "t": t})
        if acting:
            self.evictions.extend((g, how) for g in d.groups)
        return d

    def _failslow(self, now: float) -> None:
        if "fail-slow" in self.broken or self.slow_start is None:
            return
        if now - self.slow_start < self.slow_policy.round_s * self.slow_policy.rounds:
            return
        try:
            rounds = bucket_rounds(self.samples, self.slow_start, self.slow_policy)
            # only closed rounds: the current one is still filling
            closed = rounds[:int((now - self.slow_start) // self.slow_policy.round_s)]
            flagged, reason = failslow(closed, self.slow_policy)
            for g in sorted(set(flagged) - self.flagged):
                self.flagged.add(g)
                self.emit({"event": "alert", "how": "fail-slow", "group": g,
                           "reason": reason, "t": now})
                self._ladder(Fault(FaultKind.FAIL_SLOW, groups=(int(g),), maskable=True),
                             now, f"fail-slow group {g}", actionable=True)
        except Exception as exc:
            self._fail("fail-slow", exc)

    def localise_stall(self, pids: dict[int, int], slots: dict[int, int], fault_dir,
                       rounds: int = 5) -> None:
        """No step for a while but every heartbeat fresh: dump every member's stacks (py-spy,
        else faulthandler), up to ``rounds`` times until two rounds agree on the outlier's
        data-parallel group (byterobust §6), and hand it to the ladder."""
        try:
            from unbroken.core.stacks import Coord, vote
            from unbroken.detect.stacks import localise

            coords = {u: Coord(slots[u], 0, 0) for u in pids}
            verdicts, reason, chosen = [], "", None
            for _ in range(rounds):
                verdicts.append(localise(pids, coords, fault_dir=fault_dir).verdict)
                chosen, reason = vote(verdicts)
                if chosen is not None:
                    break
            self.emit({"event": "alert", "how": "stack", "group": list(chosen.ranks)
                       if chosen else None, "reason": reason})
            if chosen is not None:
                self._ladder(Fault(FaultKind.HANG, groups=tuple(int(u) for u in chosen.ranks),
                                   maskable=True), _now(), f"stall of {list(chosen.ranks)}",
                             actionable=True, how="stack")
        except Exception as exc:
            self._fail("stack", exc)

    def _fail(self, name: str, exc: BaseException) -> None:
        if name not in self.broken:
            self.broken.add(name)
            self.emit({"event": "detector_warning", "detector": name,
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
        try:
            self.seen.add(ev["step"])
            loss = float(ev["loss"])
            found, reason = numeric_event(self.losses, loss)
            self.losses.append(loss)
            if found is not None:
                t = float(ev["t"])
                self.emit({"event": "alert", "how": "numeric", "group": None,
                           "step": ev["step"], "kind": found.kind, "value": loss,
                           "reason": reason, "t": t})
                self._ladder(Fault(FaultKind.IMPLICIT), t, f"numeric {found.kind}")
        except Exception as exc:  # a broken detector must not disturb training
            self._fail("numeric", exc)

    def poll(self, now: float) -> None:
        """Fail-slow over the rounds so far; new kernel-log lines: XID faults (malformed lines
        as warnings)."""
        self._failslow(now)
        if self.xid is None or "xid" in self.broken:
            return
        try:
            read = self.xid.poll()
            for msg in read.problems:
                self.emit({"event": "detector_warning", "detector": "xid", "message": msg})
            for bad in read.malformed:
                self.emit({"event": "detector_warning", "detector": "xid",
                           "message": f"line {bad.lineno}: {bad.error}"[:300]})
            for hit in read.hits:
                self.emit({"event": "alert", "how": "xid", "group": None,
                           "code": hit.event.code, "action": hit.action, "pci": hit.event.pci,
                           "reason": hit.reason, "t": now})
                action = _XID_ACTION.get(hit.action, hit.action)
                if action is not None:
                    self._ladder(Fault(FaultKind.XID, xid_action=action), now,
                                 f"xid {hit.event.code}")
        except Exception as exc:
            self._fail("xid", exc)
