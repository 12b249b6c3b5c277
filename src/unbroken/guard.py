"""The guard on the coordinator, log-only: detectors in, ladder decisions journaled.

Why log-only by default: anything that can kill or evict part of a job must first prove itself
on real runs (the nvidia-resiliency-ext rule). So the guard runs every detector the coordinator
can feed and asks the one policy core (:func:`unbroken.core.ladder.decide`) what it would do;
it journals the detection (``detected``) and the decision (``ladder``, ``"mode": "log-only"``)
but executes nothing. Process deaths and hangs are already handled by the train runtime
(masking, spares, restarts); this adds the signals that runtime does not see.

Detectors wired here:

* **numeric** — a NaN/Inf or a more than 5x jump of the committed loss
  (:func:`unbroken.core.anomaly.numeric_event`): an implicit-failure fault;
* **XID** — new lines of a kernel-log file (``--xid-log``; dmesg saved to a file, so it can be
  tested here) mapped by the XID catalog to an action class
  (:class:`unbroken.detect.xid_source.XidSource`); a malformed line is journaled as a
  ``detector_warning`` and never stops anything.

A detector that fails is reported once and switched off; it never raises into the run.
"""

from __future__ import annotations

from typing import Callable

from unbroken.core.anomaly import numeric_event
from unbroken.core.ladder import Fault, FaultKind, LadderPolicy, LadderState, decide

__all__ = ["Guard"]

_XID_ACTION = {"restart_app": "restart-app", "reset_gpu": "reset-gpu",
               "reboot_node": "reboot", "investigate": "investigate", "ignore": None}


class Guard:
    def __init__(self, emit: Callable[[dict], None], *, standby: int = 0,
                 xid_log: str | None = None, policy: LadderPolicy | None = None) -> None:
        self.emit = emit
        self.state = LadderState(standby=standby)
        self.policy = policy or LadderPolicy()
        self.losses: list[float] = []
        self.seen: set[int] = set()
        self.xid = None
        self.broken: set[str] = set()
        if xid_log is not None:
            from unbroken.detect.xid_source import XidSource

            self.xid = XidSource(xid_log)

    def _ladder(self, fault: Fault, t: float, what: str) -> None:
        d, reason = decide(fault, self.state, self.policy, t)
        self.emit({"event": "ladder", "for": what, "mode": "log-only",
                   "rung": d.rung.name.lower() if d.rung is not None else None,
                   "groups": list(d.groups), "exit_code": d.exit_code, "reason": reason, "t": t})

    def _fail(self, name: str, exc: BaseException) -> None:
        if name not in self.broken:
            self.broken.add(name)
            self.emit({"event": "detector_warning", "detector": name,
                       "message": f"{name} detector switched off: {exc!r}"[:300]})

    def on_commit(self, ev: dict) -> None:
        """Feed the first commit of each step (its loss) to the numeric detector."""
        if "numeric" in self.broken or ev.get("step") in self.seen:
            return
        try:
            self.seen.add(ev["step"])
            loss = float(ev["loss"])
            found, reason = numeric_event(self.losses, loss)
            self.losses.append(loss)
            if found is not None:
                t = float(ev["t"])
                self.emit({"event": "detected", "how": "numeric", "group": None,
                           "step": ev["step"], "kind": found.kind, "value": loss,
                           "reason": reason, "t": t})
                self._ladder(Fault(FaultKind.IMPLICIT), t, f"numeric {found.kind}")
        except Exception as exc:  # a broken detector must not disturb training
            self._fail("numeric", exc)

    def poll(self, now: float) -> None:
        """New kernel-log lines: XID faults (and malformed lines as warnings)."""
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
                self.emit({"event": "detected", "how": "xid", "group": None,
                           "code": hit.event.code, "action": hit.action, "pci": hit.event.pci,
                           "reason": hit.reason, "t": now})
                action = _XID_ACTION.get(hit.action, hit.action)
                if action is not None:
                    self._ladder(Fault(FaultKind.XID, xid_action=action), now,
                                 f"xid {hit.event.code}")
        except Exception as exc:
            self._fail("xid", exc)
