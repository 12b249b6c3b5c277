"""Per-node exclusion history: quarantine the repeat offenders.

Why: node faults are not spread evenly. In the Backend.AI operations report **the top 3 of 63
nodes account for more than 50 % of all node exclusions** (backendai.md §1 F3, §7). A scheduler
that re-admits an evicted node as soon as it looks healthy hands the next job the node most
likely to kill it. The report's remedy (§7, marked [I] there): keep per-node exclusion counters,
**quarantine a node after n exclusions in a window** instead of re-admitting it, and **prefer
nodes with a clean history** when choosing replacements. The XID catalog points the same way:
XID 79 repeated means hardware replacement (§3).

The reference gives no values for n, the window or the cool-down, so these are ours, in
``ExclusionPolicy``: **3 faults within 24 h** quarantine a node, and a quarantine lasts
**72 h** (long enough for a repair ticket, short enough that a healthy node comes back).

Rules
-----
* Every fault is recorded with its time (the caller's clock), per node, in time order.
* A fault counts towards quarantine if it lies in ``(t - window, t]`` and after the end of the
  node's last quarantine: a released node starts with a clean slate (it was looked at while
  out).
* A node that is not in quarantine when its counted faults reach ``threshold`` is quarantined
  from that fault's time. A fault recorded while the node is in quarantine is kept (it shows
  in the history) but does not extend the quarantine.
* A node is in quarantine at ``now`` iff ``quarantined_at <= now < quarantined_at + cooldown``:
  release is a matter of time, not of a call.

Who uses it: the recovery ladder (``core.ladder``) books every eviction here and reads its
quarantine decision back (``LadderPolicy.quarantine_after`` / ``quarantine_window`` /
``quarantine_cooldown`` are this module's policy). ``concentration`` (the hot-spot share) and
``rank_replacements`` (clean history first) read the same records; nothing in the runtime calls
them yet (its spares are fresh processes without a history), they are for the learn face.

Pure: state in, state out. The state is a plain ``dict`` of node -> ``NodeRecord`` (frozen);
no function mutates its input. Time is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "ExclusionError",
    "ExclusionPolicy",
    "NodeRecord",
    "ADMIT",
    "QUARANTINED",
    "record_fault",
    "node_status",
    "quarantined",
    "rank_replacements",
    "concentration",
    "records_json",
    "records_from_json",
]

ADMIT = "admit"
QUARANTINED = "quarantined"


class ExclusionError(ValueError):
    """A policy, time or history that cannot be used; the message names the bad value."""


def _finite(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ExclusionError(f"{name}={v!r} is not a finite number")
    return float(v)


@dataclass(frozen=True)
class ExclusionPolicy:
    threshold: int = 3           # faults within the window that quarantine a node (our choice)
    window: float = 86400.0      # s, 24 h (our choice)
    cooldown: float = 259200.0   # s, 72 h quarantine (our choice)

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int) \
                or self.threshold < 1:
            raise ExclusionError(f"exclusion threshold={self.threshold!r} must be an integer >= 1")
        for name in ("window", "cooldown"):
            if _finite(f"exclusion {name}", getattr(self, name)) <= 0:
                raise ExclusionError(f"exclusion {name}={getattr(self, name)} must be > 0 seconds")


@dataclass(frozen=True)
class NodeRecord:
    faults: tuple[float, ...] = ()        # every recorded fault time, ascending
    quarantined_at: float | None = None   # start of the latest quarantine
    quarantines: int = 0                  # how many times the node was quarantined

    def released_at(self, policy: ExclusionPolicy) -> float | None:
        """End of the latest quarantine (past or future), None if never quarantined."""
        return None if self.quarantined_at is None else self.quarantined_at + policy.cooldown

    def in_quarantine(self, now: float, policy: ExclusionPolicy) -> bool:
        return self.quarantined_at is not None and \
            self.quarantined_at <= now < self.quarantined_at + policy.cooldown

    def counted(self, now: float, policy: ExclusionPolicy) -> int:
        """Faults that count towards a quarantine at ``now`` (in the window, after release)."""
        since = now - policy.window
        rel = self.released_at(policy)
        return sum(1 for t in self.faults
                   if since < t <= now and (rel is None or t >= rel))


def record_fault(state: Mapping[Hashable, NodeRecord], node: Hashable, at: float,
                 policy: ExclusionPolicy = ExclusionPolicy()
                 ) -> tuple[dict[Hashable, NodeRecord], str]:
    """A new state with a fault of ``node`` at time ``at``, and the reason (the log line).

    Quarantines the node when this fault brings its counted faults to ``threshold``. Faults of
    one node must be recorded in time order (a fault before the node's last recorded one
    raises ExclusionError).
    """
    at = _finite("fault time", at)
    rec = state.get(node, NodeRecord())
    if rec.faults and at < rec.faults[-1]:
        raise ExclusionError(f"fault time {at} for node {node!r} is before its last recorded "
                             f"fault at {rec.faults[-1]} (record faults in time order)")
    was_out = rec.in_quarantine(at, policy)
    rec = NodeRecord(rec.faults + (at,), rec.quarantined_at, rec.quarantines)
    n = rec.counted(at, policy)
    out = dict(state)
    if was_out:
        reason = (f"node {node!r}: fault at t={at:g} while quarantined (until "
                  f"t={rec.released_at(policy):g}); recorded")
    elif n >= policy.threshold:
        rec = NodeRecord(rec.faults, at, rec.quarantines + 1)
        reason = (f"node {node!r}: {n} faults within {policy.window:g} s (threshold "
                  f"{policy.threshold}): quarantined until t={at + policy.cooldown:g} "
                  f"(quarantine #{rec.quarantines})")
    else:
        reason = (f"node {node!r}: fault {n}/{policy.threshold} within {policy.window:g} s; "
                  f"still admitted")
    out[node] = rec
    return out, reason


def node_status(state: Mapping[Hashable, NodeRecord], node: Hashable, now: float,
                policy: ExclusionPolicy = ExclusionPolicy()) -> tuple[str, str]:
    """``(ADMIT | QUARANTINED, reason)`` for ``node`` at ``now``; unknown nodes are admitted."""
    now = _finite("now", now)
    rec = state.get(node)
    if rec is None:
        return ADMIT, f"node {node!r}: no recorded faults"
    if rec.in_quarantine(now, policy):
        return QUARANTINED, (f"node {node!r}: quarantined since t={rec.quarantined_at:g} "
                             f"until t={rec.released_at(policy):g}")
    rel = rec.released_at(policy)
    released = f", released at t={rel:g}" if rel is not None and rel <= now else ""
    return ADMIT, (f"node {node!r}: {rec.counted(now, policy)}/{policy.threshold} faults in "
                   f"window{released}")


def quarantined(state: Mapping[Hashable, NodeRecord], now: float,
                policy: ExclusionPolicy = ExclusionPolicy()) -> list:
    """The nodes in quarantine at ``now`` (sorted by their repr, for stable output)."""
    now = _finite("now", now)
    return sorted((n for n, r in state.items() if r.in_quarantine(now, policy)), key=repr)


def rank_replacements(state: Mapping[Hashable, NodeRecord], candidates: Iterable[Hashable],
                      now: float, policy: ExclusionPolicy = ExclusionPolicy()
                      ) -> tuple[list, str]:
    """Candidates to take a replacement from, best first, and the reason.

    Quarantined candidates are left out; the rest are ordered by faults counted now, then by
    all recorded faults, then by the order given (clean history first, backendai.md §7).
    """
    now = _finite("now", now)
    cands = list(candidates)
    keep, dropped = [], []
    for i, c in enumerate(cands):
        rec = state.get(c, NodeRecord())
        if rec.in_quarantine(now, policy):
            dropped.append(c)
        else:
            keep.append((rec.counted(now, policy), len(rec.faults), i, c))
    keep.sort(key=lambda k: k[:3])
    ranked = [k[3] for k in keep]
    why = f"{len(ranked)} of {len(cands)} candidates admitted"
    if dropped:
        why += f"; quarantined, left out: {', '.join(map(repr, dropped))}"
    return ranked, why


def concentration(state: Mapping[Hashable, NodeRecord], top: int = 3) -> float:
    """Share of all recorded faults that fall on the ``top`` nodes with the most faults.

    The report's hot-spot figure is this with ``top=3`` over exclusions: more than 0.5 on 63
    nodes (backendai.md §1 F3). 0.0 when nothing was recorded.
    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ExclusionError(f"top={top!r} must be an integer >= 1")
    counts = sorted((len(r.faults) for r in state.values()), reverse=True)
    total = sum(counts)
    return 0.0 if total == 0 else sum(counts[:top]) / total


def records_json(state: Mapping[Hashable, NodeRecord]) -> dict[str, dict]:
    """``state`` as JSON (node -> its record): what a coordinator keeps in etcd, so that a
    standby that takes the job over quarantines the same nodes."""
    return {str(n): {"faults": list(r.faults), "quarantined_at": r.quarantined_at,
                     "quarantines": r.quarantines} for n, r in state.items()}


def records_from_json(data: object) -> dict[Hashable, NodeRecord]:
    """The inverse of :func:`records_json` (a node named by digits is an int again);
    ``ExclusionError`` naming the first bad value."""
    if not isinstance(data, dict):
        raise ExclusionError(f"exclusions {data!r} is not a JSON object")
    out: dict[Hashable, NodeRecord] = {}
    for name, rec in data.items():
        if not isinstance(rec, dict):
            raise ExclusionError(f"exclusions[{name!r}]={rec!r} is not a JSON object")
        faults = rec.get("faults", [])
        if not isinstance(faults, list):
            raise ExclusionError(f"exclusions[{name!r}].faults={faults!r} is not a list")
        at, n = rec.get("quarantined_at"), rec.get("quarantines", 0)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ExclusionError(f"exclusions[{name!r}].quarantines={n!r} must be an "
                                 f"integer >= 0")
        times = tuple(sorted(_finite(f"exclusions[{name!r}].faults", t) for t in faults))
        out[int(name) if str(name).lstrip("-").isdigit() else name] = NodeRecord(
            times, None if at is None else _finite(f"exclusions[{name!r}].quarantined_at", at),
            n)
    return out
