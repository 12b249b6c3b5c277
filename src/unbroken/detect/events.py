"""Fault events: what every detector hands the coordinator, and the journal line it writes.

Why one event type: the detectors (XID lines from the kernel log, fail-slow step times,
loss / grad-norm NaN or jumps, peer-relative signal outliers, the heartbeat) see different
things, but the coordinator acts on one question — *which group, since when, and how do we
know* — and the recovery ladder (``core.ladder``) picks its rung from the kind. Keeping the
form fixed keeps the journal readable by ``core.ettr`` (time to detect) and ``demo_view``.

The journal line is the demo's existing ``detected`` event, extended::

    {"event": "detected", "group": 3, "how": "xid", "step": 120, "t": 1712.5,
     "source": "/var/log/kern.log", "detail": {"xid": 79, "action": "reboot_node", ...}}

``how`` carries the kind (the demo already writes ``"how": "heartbeat"`` / ``"exit"``, and
``demo_view`` prints it), so old readers keep working; ``step``, ``source`` and ``detail`` are
additions they ignore. The journal's writer adds its own ``src`` (which process wrote the line)
and any ``slot``; ``source`` here names where the detector read its evidence.

``t`` is the caller's clock (seconds); this module reads no clock.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from unbroken.core.anomaly import NumericEvent

__all__ = [
    "FaultEventError",
    "FaultEvent",
    "XID",
    "FAIL_SLOW",
    "NUMERIC",
    "PEER_OUTLIER",
    "HEARTBEAT",
    "EXIT",
    "KINDS",
]

XID = "xid"                    # a kernel-log XID line (core.xid)
FAIL_SLOW = "fail_slow"        # K consecutive slow rounds (core.anomaly.failslow)
NUMERIC = "numeric"            # loss / grad-norm NaN, Inf or jump (core.anomaly.numeric_event)
PEER_OUTLIER = "peer_outlier"  # robust peer z-score outlier (core.anomaly.peer_outliers)
HEARTBEAT = "heartbeat"        # the demo's missed-heartbeat detection
EXIT = "exit"                  # the demo's process-exit detection
KINDS = (XID, FAIL_SLOW, NUMERIC, PEER_OUTLIER, HEARTBEAT, EXIT)


class FaultEventError(ValueError):
    """A fault event field or journal line that cannot be used; the message names the value."""


def _jsonable(v: Any) -> Any:
    """``v`` with anything JSON cannot hold made a string (NaN/Inf too: JSON has no NaN)."""
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


@dataclass(frozen=True)
class FaultEvent:
    kind: str                    # one of KINDS (others allowed: a new detector's name)
    group: Hashable              # the group (uid) the fault is attributed to; None if unknown
    step: int | None             # the training step when detected, if known
    t: float                     # the caller's clock when detected (seconds)
    source: str                  # where the evidence was read (a file, "dmesg", "step_time")
    detail: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind:
            raise FaultEventError(f"fault event kind={self.kind!r} is not a non-empty string")
        s = self.step
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or s < 0):
            raise FaultEventError(f"fault event step={s!r} must be an integer >= 0 or None")
        t = self.t
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise FaultEventError(f"fault event t={t!r} is not a finite time")
        if not isinstance(self.source, str):
            raise FaultEventError(f"fault event source={self.source!r} is not a string")
        if not isinstance(self.detail, Mapping):
            raise FaultEventError(f"fault event detail={self.detail!r} is not a mapping")

    def to_dict(self) -> dict[str, Any]:
        """The journal event as a dict (the coordinator may add ``slot`` before writing)."""
        return {"event": "detected", "group": _jsonable(self.group), "how": self.kind,
                "step": self.step, "t": float(self.t), "source": self.source,
                "detail": _jsonable(self.detail)}

    def to_json(self) -> str:
        """One journal line (no trailing newline); never fails on an odd detail value."""
        return json.dumps(self.to_dict(), sort_keys=False, allow_nan=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FaultEvent:
        """The event of a ``detected`` journal dict (also the demo's older ones without
        ``step``/``source``/``detail``)."""
        if not isinstance(d, Mapping) or d.get("event") != "detected":
            raise FaultEventError(f"journal event {d!r} is not a 'detected' event")
        if "how" not in d or "t" not in d:
            raise FaultEventError(f"journal event {d!r} lacks 'how' or 't'")
        return cls(kind=d["how"], group=d.get("group"), step=d.get("step"), t=d["t"],
                   source=d.get("source", ""), detail=d.get("detail") or {})

    @classmethod
    def from_json(cls, line: str) -> FaultEvent:
        try:
            d = json.loads(line)
        except (TypeError, ValueError):
            raise FaultEventError(f"journal line {line!r} is not JSON") from None
        return cls.from_dict(d)

    # --- constructors from the detectors' outputs -------------------------------------------

    @classmethod
    def from_xid(cls, hit: Any, group: Hashable, t: float, step: int | None = None,
                 source: str = "dmesg") -> FaultEvent:
        """From an ``XidHit`` (``detect.xid_source``) or a bare ``core.xid.XidEvent``."""
        ev = getattr(hit, "event", hit)
        action = getattr(hit, "action", None) or ev.action
        detail = {"xid": ev.code, "action": action, "pci": ev.pci, "pid": ev.pid,
                  "message": ev.message, "kernel_t": ev.timestamp}
        reason = getattr(hit, "reason", None)
        if reason:
            detail["reason"] = reason
        return cls(XID, group, step, t, source, detail)

    @classmethod
    def from_numeric(cls, event: NumericEvent, group: Hashable, t: float, step: int | None,
                     metric: str, reason: str = "") -> FaultEvent:
        detail = {"metric": metric, "what": event.kind, "value": event.value,
                  "baseline": event.baseline, "ratio": event.ratio}
        if reason:
            detail["reason"] = reason
        return cls(NUMERIC, group, step, t, metric, detail)

    @classmethod
    def from_failslow(cls, group: Hashable, t: float, step: int | None, reason: str,
                      source: str = "step_time") -> FaultEvent:
        return cls(FAIL_SLOW, group, step, t, source, {"reason": reason})

    @classmethod
    def from_peer(cls, group: Hashable, zscores: Mapping[str, float], t: float,
                  step: int | None, reason: str = "", source: str = "metrics") -> FaultEvent:
        detail: dict[str, Any] = {"z": dict(zscores)}
        if reason:
            detail["reason"] = reason
        return cls(PEER_OUTLIER, group, step, t, source, detail)
