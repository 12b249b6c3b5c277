"""The recovery ladder's vocabulary and budget: its rungs, the kinds of fault it answers, the
fault record a caller hands it, and :class:`LadderPolicy` (attempts per rung, the time budget,
backoff, quarantine; ``parse_policy`` reads one from ``key=value`` pairs). Why the ladder is
built this way is in :mod:`unbroken.core.ladder`, which decides with these.

Every value is checked where it is made (``__post_init__``): a bad one raises
:class:`LadderError` with one line naming it, so a CLI prints it and exits 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Mapping

from unbroken.core.exclusion import ExclusionPolicy
from unbroken.core.retry import RetryPolicy
from unbroken.protocol import ExitCode

__all__ = ["EXIT_NO_PROGRESS", "LadderError", "Rung", "FaultKind", "Fault", "LadderPolicy",
           "parse_policy"]


#: Exit code of a job whose ladder gave up: the one defined in ``protocol`` (a pure table)
EXIT_NO_PROGRESS = int(ExitCode.NO_PROGRESS)


class LadderError(ValueError):
    """A fault, state, policy or time the ladder cannot use; the message names the bad value."""


class Rung(IntEnum):
    """Recovery rungs, cheapest first (the value is the position on the ladder)."""

    MASK = 0
    EVICT = 1
    RETRY = 2
    ROLLBACK = 3
    REPLAY = 4
    RESTART = 5
    REQUEUE = 6


class FaultKind(str, Enum):
    DEATH = "death"          # a training process exited / was killed
    HANG = "hang"            # alive but silent (stale heartbeat, zero traffic)
    FAIL_SLOW = "fail-slow"  # a straggler (MFU decline, peer-relative step time)
    IMPLICIT = "implicit"    # NaN, loss or grad-norm spike: no culprit named
    SDC = "sdc"              # a bitwise mismatch between two hosts of one shard type
    CORRUPT = "corrupt"      # a machine proven corrupt (replay culprit, failed bitwise test)
    XID = "xid"              # a GPU XID with its action class
    CODE = "code"            # a user-space error traceable to the code (exception, bad update)
    WIPE_OUT = "wipe-out"    # every host of some shard type failed: rectlr cannot mask


@dataclass(frozen=True)
class Fault:
    """One detected fault, as the ladder sees it.

    Attributes:
        kind: a ``FaultKind`` (or its string value).
        groups: the groups (machines) the fault names; empty when no culprit is known.
        maskable: SPARe can mask it — every shard type of the failed groups still has a live
            host (the caller asks ``core.rectlr.decide`` and gets a ``Plan``, not a ``WipeOut``).
        xid_action: for ``XID`` faults, the action class as a plain string ("restart-app",
            "reset-gpu", "reboot", "investigate", ...); unknown classes climb the ordinary ladder.
    """

    kind: FaultKind | str
    groups: tuple[int, ...] = ()
    maskable: bool = False
    xid_action: str | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", FaultKind(self.kind))
        except ValueError:
            raise LadderError(f"unknown fault kind {self.kind!r} (one of "
                              f"{', '.join(k.value for k in FaultKind)})") from None
        groups = tuple(self.groups)
        for g in groups:
            if isinstance(g, bool) or not isinstance(g, int) or g < 0:
                raise LadderError(f"fault group {g!r} is not a non-negative integer")
        if len(set(groups)) != len(groups):
            raise LadderError(f"fault groups {groups} repeat a group")
        object.__setattr__(self, "groups", groups)
        if self.kind is FaultKind.XID:
            if not isinstance(self.xid_action, str) or not self.xid_action.strip():
                raise LadderError(f"xid fault needs an action class, got {self.xid_action!r}")
        elif self.xid_action is not None:
            raise LadderError(f"xid_action {self.xid_action!r} given for a {self.kind.value} fault")
        if self.kind is FaultKind.WIPE_OUT and self.maskable:
            raise LadderError("a wipe-out fault cannot be maskable")


#: the exclusion history's window and cool-down defaults (core.exclusion's, not a second copy)
_EXCLUSION = ExclusionPolicy()


_DEFAULT_ATTEMPTS = {Rung.MASK: 2, Rung.EVICT: 2, Rung.RETRY: 2, Rung.ROLLBACK: 1,
                     Rung.REPLAY: 1, Rung.RESTART: 2, Rung.REQUEUE: 3}


@dataclass(frozen=True)
class LadderPolicy:
    """The budget. Attempts are per rung and per incident; times are seconds.

    Attributes:
        max_attempts: rung -> tries allowed in one incident (missing rungs keep the default;
            0 skips the rung).
        time_budget: an incident older than this jumps to ``REQUEUE`` (no-progress guard).
        update_deadline: a queued code update is forced this long after it was queued (§7: 24 h).
        backoff_base, backoff_cap: requeue ``a`` waits ``min(cap, base * 2**a)`` (backendai §7;
            ``requeue`` is this as a ``core.retry`` policy).
        resolved_after: committed steps that end an incident.
        good_after: committed steps after which the running code version is *last good*.
        quarantine_after: evictions within ``quarantine_window`` after which a machine is
            quarantined (for ``quarantine_cooldown``): ``exclusion`` is this as the
            ``core.exclusion`` policy the ladder books evictions with.
        replay_hold: the longest an open replay holds a soft (fail-slow) eviction verdict.
    """

    max_attempts: Mapping[Rung, int] = field(default_factory=dict)
    time_budget: float = 3600.0
    update_deadline: float = 86400.0
    backoff_base: float = 600.0
    backoff_cap: float = 3600.0
    resolved_after: int = 10
    good_after: int = 100
    quarantine_after: int = 2
    quarantine_window: float = _EXCLUSION.window
    quarantine_cooldown: float = _EXCLUSION.cooldown
    replay_hold: float = 30.0

    def __post_init__(self) -> None:
        attempts = dict(_DEFAULT_ATTEMPTS)
        for key, n in dict(self.max_attempts).items():
            try:
                rung = key if isinstance(key, Rung) else Rung[str(key).upper()]
            except KeyError:
                raise LadderError(f"ladder policy: unknown rung {key!r}") from None
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise LadderError(f"ladder policy: max_attempts[{rung.name}]={n!r} must be an "
                                  f"integer >= 0")
            attempts[rung] = n
        if not any(attempts.values()):
            raise LadderError("ladder policy: zero attempts on every rung leaves no recovery")
        object.__setattr__(self, "max_attempts", attempts)
        for name in ("time_budget", "update_deadline", "backoff_base", "backoff_cap"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise LadderError(f"ladder policy: {name}={v!r} is not a finite number")
        for name in ("time_budget", "update_deadline"):
            if getattr(self, name) <= 0:
                raise LadderError(f"ladder policy: {name}={getattr(self, name)} must be > 0 s")
        if self.backoff_base <= 0:  # a zero base is no backoff: core.retry refuses it too
            raise LadderError(f"ladder policy: backoff_base={self.backoff_base} must be > 0 s")
        if self.backoff_cap < self.backoff_base:
            raise LadderError(f"ladder policy: backoff_cap={self.backoff_cap} is below "
                              f"backoff_base={self.backoff_base}")
        for name in ("resolved_after", "good_after", "quarantine_after"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise LadderError(f"ladder policy: {name}={v!r} must be an integer >= 1")
        for name in ("quarantine_window", "quarantine_cooldown", "replay_hold"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v <= 0:
                raise LadderError(f"ladder policy: {name}={v!r} must be a number > 0 s")

    @property
    def requeue(self) -> RetryPolicy:
        """The requeue backoff as ``core.retry`` computes it. No jitter: a decision carries no
        per-job seed, and one seed for every job would not de-synchronise them anyway."""
        return RetryPolicy(base=float(self.backoff_base), factor=2.0,
                           max_delay=float(self.backoff_cap), jitter=0.0)

    @property
    def exclusion(self) -> ExclusionPolicy:
        """The quarantine rule as ``core.exclusion`` applies it (validated above)."""
        return ExclusionPolicy(self.quarantine_after, float(self.quarantine_window),
                               float(self.quarantine_cooldown))

    def limit(self, rung: Rung) -> int:
        return self.max_attempts[rung]


_POLICY_FIELDS = ("time_budget", "update_deadline", "backoff_base", "backoff_cap",
                  "resolved_after", "good_after", "quarantine_after", "quarantine_window",
                  "quarantine_cooldown", "replay_hold")


def parse_policy(spec: str, base: LadderPolicy | None = None) -> LadderPolicy:
    """A policy from ``key=value`` pairs joined by commas, over ``base`` (the defaults).

    Keys are rung names (their attempts per incident: ``retry=1,rollback=0``) or policy
    fields (``time_budget=600``; seconds for the times, integers for the counts). Raises
    :class:`LadderError` naming the bad pair, or the impossible budget ``LadderPolicy`` finds.
    """
    base = base if base is not None else LadderPolicy()
    attempts = {r.name.lower(): n for r, n in base.max_attempts.items()}
    fields = {f: getattr(base, f) for f in _POLICY_FIELDS}
    for pair in str(spec).split(","):
        key, eq, value = (x.strip() for x in pair.partition("="))
        if not eq or not key or not value:
            raise LadderError(f"ladder policy: {pair.strip()!r} is not key=value")
        key = key.lower().replace("-", "_")
        try:
            num = float(value)
        except ValueError:
            raise LadderError(f"ladder policy: {key}={value!r} is not a number") from None
        if key in attempts or key in ("resolved_after", "good_after", "quarantine_after"):
            if not num.is_integer():
                raise LadderError(f"ladder policy: {key}={value!r} must be an integer")
            num = int(num)
        if key in attempts:
            attempts[key] = num
        elif key in fields:
            fields[key] = num
        else:
            raise LadderError(f"ladder policy: unknown key {key!r} (a rung: "
                              f"{', '.join(attempts)}; or {', '.join(_POLICY_FIELDS)})")
    return LadderPolicy(max_attempts=attempts, **fields)
