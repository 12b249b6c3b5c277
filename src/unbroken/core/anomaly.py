"""Anomaly decisions on training and node signals: fail-slow, numeric (implicit) failure, and
peer-relative multi-signal outliers.

Why three detectors and not one threshold: the Backend.AI operations report found that *no
single metric dominates across failure types* (backendai.md §1 F1: 10/10 XID failures detected,
2/10 before the XID, ~0.84 false positives per day, from 751 metrics), and ByteRobust's agent
watches system signals, kernel events *and* training metrics (loss, grad-norm, MFU) at once
(byterobust.md §3). Each function below covers one family; the coordinator combines them with
the XID short-circuit (``core.xid``) and the heartbeat.

**Fail-slow** (``failslow``). A group that keeps training but slowly drags every collective to
its pace: nothing crashes, so only a comparison with its peers shows it. ByteRobust re-runs its
aggregation every **10 s** and decides after **5 rounds** (byterobust.md §6, [S2]); the demo
scales the round to **1 s** (byterobust.md §12 item 3, "scale the round down to 1 s on CPU"),
see ``FailSlowPolicy.demo()``. ByteRobust picks the group with the highest *cumulative* flag
count after 5 rounds; we ask for K = 5 *consecutive* slow rounds instead, which is stricter
(a group that is slow in 4 rounds and fine in the fifth is not evicted) and needs no memory
beyond the last K rounds. The slowness factor — step time above **1.5 ×** the median of the
*other* groups — is our choice: neither reference gives a number (the report's fail-slow rule
is a clock-event bitmask, backendai.md §4). 1.5 × is far above the few-percent jitter between
healthy data-parallel replicas and well below the 5 × that marks an outright numeric failure.
A round decides only when at least **3 groups** report in it (Algalon's rules are "gated on ≥ 3
live nodes", backendai.md §2); a round without enough peers, or without the group, breaks the
group's streak — absence is the heartbeat's business, not evidence of slowness.

**Numeric / implicit failure** (``numeric_event``). ByteRobust: "a jump of more than **5 ×** in
loss or grad-norm, or a **NaN**, marks the run faulty" (byterobust.md §3, [S]); its Table 1
lists NaN as 0.3 % of incidents. NaN and ±Inf fire at once, with no history needed. A jump is
the value over 5 × the median of the last ``window`` finite values (20, our choice: the
sliding-window length is an open item, byterobust.md §13), once at least ``min_history``
values (5, our choice) are there — the median of fewer values is too noisy to call a jump
against. The median, not the mean, so that one earlier spike does not raise the bar.

**Peer outliers** (``peer_outliers``). backendai.md §2's implementable detector: for each
signal, the robust peer z-score ``z = (x − median(peers)) / max(1.4826·MAD(peers), floor)``,
where the peers are the *other* groups, and the value must also lie outside the peers'
**P5–P95 band** (the report draws each metric as that band with the failing node overlaid).
``|z| > 4`` (the reference's "e.g. 4") and at least **3 live peers** (its "require ≥ 3 live
peers"). The floor ``max(0.05·|median|, 1e-9)`` is our choice: when the peers agree exactly
(MAD = 0) a deviation must still exceed 4 × 5 % = 20 % of the median to count, instead of any
difference becoming an infinite z. A group is flagged when at least ``min_signals`` signals
are outliers (default 1: one slow or hot group stands out; the reference suggests 2 distinct
metric families plus K = 3 consecutive scrapes when tuning for ~0.84 false positives per day —
persistence across snapshots is the caller's, e.g. by feeding this function's flags to the
same streak logic as ``failslow``). Both directions count: interrupts *collapsing* preceded
gpu071's failure (backendai.md §2), page-outs *spiking* preceded gpu096's.

Pure: no I/O and no clock (round boundaries and times are passed in). Bad input — a policy
that cannot work, a step time that is not a positive finite number, a signal that is not a
finite number — raises ``AnomalyError`` (a ValueError) with a one-line message naming the
value; the detect layer catches it and reports instead of disturbing training.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "AnomalyError",
    "FailSlowPolicy",
    "failslow",
    "bucket_rounds",
    "NumericPolicy",
    "NumericEvent",
    "NAN",
    "INF",
    "JUMP",
    "numeric_event",
    "PeerPolicy",
    "peer_outliers",
    "GROUP_MIN_GAP",
    "median",
    "robust_z",
]

#: Numeric event kinds.
NAN = "nan"
INF = "inf"
JUMP = "jump"

#: 1 / Φ⁻¹(3/4): makes the MAD a consistent estimator of σ for normal data (backendai.md §2).
MAD_SCALE = 1.4826


class AnomalyError(ValueError):
    """A policy, round, history or signal value that cannot be used; the message names it."""


def _finite(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise AnomalyError(f"{name}={v!r} is not a finite number")
    return float(v)


def _positive_int(name: str, v: object, low: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise AnomalyError(f"{name}={v!r} must be an integer >= {low}")
    return v


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence of numbers."""
    if not values:
        raise AnomalyError("median of no values")
    s = sorted(values)
    n = len(s)
    mid = n // 2
    return float(s[mid]) if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default method) of sorted values, q in [0, 100]."""
    n = len(sorted_values)
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def robust_z(x: float, peers: Sequence[float], rel_floor: float = 0.05,
             abs_floor: float = 1e-9) -> float:
    """``(x − median(peers)) / max(1.4826·MAD(peers), rel_floor·|median|, abs_floor)``."""
    med = median(peers)
    mad = MAD_SCALE * median([abs(p - med) for p in peers])
    return (x - med) / max(mad, rel_floor * abs(med), abs_floor)


# --------------------------------------------------------------------------------------------
# fail-slow


@dataclass(frozen=True)
class FailSlowPolicy:
    factor: float = 1.5     # step time > factor × peer median is a slow round (our choice)
    rounds: int = 5         # K consecutive slow rounds flag the group (byterobust.md §6)
    round_s: float = 10.0   # seconds per round (byterobust.md §6: every 10 s)
    min_groups: int = 3     # groups reporting in a round for it to decide (backendai.md §2)

    def __post_init__(self) -> None:
        factor = _finite("fail-slow policy factor", self.factor)
        if factor <= 1:
            raise AnomalyError(f"fail-slow policy factor={self.factor} must be > 1")
        round_s = _finite("fail-slow policy round_s", self.round_s)
        if round_s <= 0:
            raise AnomalyError(f"fail-slow policy round_s={self.round_s} must be > 0 seconds")
        _positive_int("fail-slow policy rounds", self.rounds)
        _positive_int("fail-slow policy min_groups", self.min_groups, low=2)

    @classmethod
    def demo(cls) -> FailSlowPolicy:
        """ByteRobust's 5 rounds with the round scaled from 10 s to 1 s (byterobust.md §12)."""
        return cls(round_s=1.0)

    @property
    def window_s(self) -> float:
        """The shortest time from the first slow step to a flag: ``rounds × round_s``."""
        return self.rounds * self.round_s


def _check_round(i: int, rnd: object) -> Mapping[Hashable, float]:
    if not isinstance(rnd, Mapping):
        raise AnomalyError(f"fail-slow round {i}={rnd!r} is not a mapping group -> step time")
    for g, v in rnd.items():
        st = _finite(f"step time of group {g!r} in round {i}", v)
        if st <= 0:
            raise AnomalyError(f"step time of group {g!r} in round {i}={v!r} must be > 0")
    return rnd


def _slow_in(rnd: Mapping[Hashable, float], g: Hashable, policy: FailSlowPolicy) -> bool:
    if g not in rnd or len(rnd) < policy.min_groups:
        return False
    peers = [v for h, v in rnd.items() if h != g]
    return rnd[g] > policy.factor * median(peers)


def failslow(rounds: Sequence[Mapping[Hashable, float]],
             policy: FailSlowPolicy | None = None) -> tuple[list[Hashable], str]:
    """The groups that were slow in each of the last ``policy.rounds`` rounds, and why.

    ``rounds`` is oldest first; each round maps group -> its step time (seconds; e.g. the
    median step time of that group within the round, see ``bucket_rounds``). A group is slow
    in a round when its step time exceeds ``policy.factor`` × the median step time of the
    *other* groups of that round, and the round has at least ``policy.min_groups`` groups.
    Flagged groups are those slow in every one of the last K rounds (a trailing streak: a
    group that recovered is not flagged), in the order of the latest round.
    """
    policy = policy or FailSlowPolicy()
    if not isinstance(rounds, Sequence) or isinstance(rounds, (str, bytes)):
        raise AnomalyError(f"fail-slow rounds={rounds!r} is not a sequence of rounds")
    checked = [_check_round(i, r) for i, r in enumerate(rounds)]
    k = policy.rounds
    if len(checked) < k:
        return [], (f"fail-slow: {len(checked)} of {k} rounds so far "
                    f"({k} × {policy.round_s:g} s needed); nothing flagged")
    last = checked[-k:]
    flagged: list[Hashable] = []
    streaks: dict[Hashable, int] = {}
    for g in last[-1]:
        streak = 0
        for rnd in reversed(checked):
            if not _slow_in(rnd, g, policy):
                break
            streak += 1
        streaks[g] = streak
        if streak >= k:
            flagged.append(g)
    if not flagged:
        best = max(streaks.values(), default=0)
        return [], (f"fail-slow: no group above {policy.factor:g} × the peer median in "
                    f"{k} consecutive rounds (longest streak {best})")
    detail = ", ".join(
        f"group {g} at {last[-1][g]:.4g} s vs peer median "
        f"{median([v for h, v in last[-1].items() if h != g]):.4g} s, "
        f"{streaks[g]} slow rounds" for g in flagged)
    return flagged, (f"fail-slow: {detail} (> {policy.factor:g} × in {k} consecutive "
                     f"{policy.round_s:g} s rounds)")


def bucket_rounds(samples: Iterable[tuple[float, Hashable, float]], start: float,
                  policy: FailSlowPolicy | None = None) -> list[dict[Hashable, float]]:
    """Rounds for ``failslow`` from timed samples ``(t, group, step_time)``.

    Round ``i`` covers ``[start + i·round_s, start + (i+1)·round_s)``; each group's value in a
    round is the median of its samples there (one stray slow step does not make a slow
    round). Samples before ``start`` are dropped; rounds run up to the latest sample, and a
    round with no samples is an empty dict (it decides nothing, so it breaks streaks).
    """
    policy = policy or FailSlowPolicy()
    start = _finite("bucket start", start)
    buckets: dict[int, dict[Hashable, list[float]]] = {}
    for s in samples:
        try:
            t, g, v = s
        except (TypeError, ValueError):
            raise AnomalyError(f"step-time sample {s!r} is not (t, group, step_time)") from None
        # the common case checked inline: formatting each sample's error name up front was
        # most of a verdict's cost (11 ms for ~500 samples, each second, in the supervisor)
        if not (type(t) is float and math.isfinite(t)):
            t = _finite("sample time", t)
        if not (type(v) is float and math.isfinite(v)):
            v = _finite(f"step time of group {g!r}", v)
        if v <= 0:
            raise AnomalyError(f"step time of group {g!r}={v!r} must be > 0")
        if t < start:
            continue
        i = int((t - start) // policy.round_s)
        buckets.setdefault(i, {}).setdefault(g, []).append(v)
    if not buckets:
        return []
    return [{g: median(vs) for g, vs in buckets.get(i, {}).items()}
            for i in range(max(buckets) + 1)]


# --------------------------------------------------------------------------------------------
# numeric / implicit failure


@dataclass(frozen=True)
class NumericPolicy:
    jump: float = 5.0       # value > jump × recent median is an event (byterobust.md §3)
    window: int = 20        # recent finite values the median is taken over (our choice)
    min_history: int = 5    # finite values needed before a jump can be called (our choice)

    def __post_init__(self) -> None:
        jump = _finite("numeric policy jump", self.jump)
        if jump <= 1:
            raise AnomalyError(f"numeric policy jump={self.jump} must be > 1")
        _positive_int("numeric policy window", self.window)
        _positive_int("numeric policy min_history", self.min_history)
        if self.min_history > self.window:
            raise AnomalyError(f"numeric policy min_history={self.min_history} exceeds "
                               f"window={self.window}")


@dataclass(frozen=True)
class NumericEvent:
    kind: str                 # NAN, INF or JUMP
    value: float
    baseline: float | None    # the recent median (JUMP only)
    ratio: float | None       # value / baseline (JUMP only)


def _number(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise AnomalyError(f"{name}={v!r} is not a number")
    return float(v)


def numeric_event(history: Sequence[float], value: float,
                  policy: NumericPolicy | None = None) -> tuple[NumericEvent | None, str]:
    """An implicit-failure event for a new loss or grad-norm ``value``, or None; and why.

    NaN or ±Inf is an event at once. Otherwise ``value`` is an event when it exceeds
    ``policy.jump`` × the median of the last ``policy.window`` finite values of ``history``
    (oldest first; non-finite entries — earlier events — are skipped), given at least
    ``policy.min_history`` of them and a positive median. Values that are not numbers raise
    AnomalyError.
    """
    policy = policy or NumericPolicy()
    v = _number("value", value)
    if math.isnan(v):
        return NumericEvent(NAN, v, None, None), "numeric: value is NaN"
    if math.isinf(v):
        return NumericEvent(INF, v, None, None), f"numeric: value is {v}"
    if isinstance(history, (str, bytes)) or not isinstance(history, Iterable):
        raise AnomalyError(f"history={history!r} is not a sequence of numbers")
    # a float is checked inline: naming every entry up front (``f"history[{i}]"``) made a
    # history of ~100 values cost ~0.9 ms a call in the supervisor's loop
    finite = [h for h in (x if type(x) is float else _number(f"history[{i}]", x)
                          for i, x in enumerate(history)) if math.isfinite(h)]
    recent = finite[-policy.window:]
    if len(recent) < policy.min_history:
        return None, (f"numeric: {len(recent)} of {policy.min_history} finite history values; "
                      f"no jump check yet")
    base = median(recent)
    if base <= 0:
        return None, f"numeric: recent median {base:.4g} is not positive; no jump check"
    ratio = v / base
    if ratio > policy.jump:
        return NumericEvent(JUMP, v, base, ratio), (
            f"numeric: {v:.4g} is {ratio:.2f} × the median {base:.4g} of the last "
            f"{len(recent)} values (> {policy.jump:g} ×)")
    return None, f"numeric: {v:.4g} is {ratio:.2f} × the recent median {base:.4g}; fine"


# --------------------------------------------------------------------------------------------
# peer-relative multi-signal outliers


@dataclass(frozen=True)
class PeerPolicy:
    z: float = 4.0            # |robust z| above this is an outlier (backendai.md §2, "e.g. 4")
    min_peers: int = 3        # other groups reporting the signal (backendai.md §2)
    band: float = 5.0         # value must lie outside [P(band), P(100-band)] of the peers (§2)
    rel_floor: float = 0.05   # z denominator floor, fraction of |median| (our choice)
    abs_floor: float = 1e-9   # z denominator floor, absolute (our choice)
    min_signals: int = 1      # outlier signals that flag a group (§2 suggests 2 in production)

    def __post_init__(self) -> None:
        if _finite("peer policy z", self.z) <= 0:
            raise AnomalyError(f"peer policy z={self.z} must be > 0")
        _positive_int("peer policy min_peers", self.min_peers)
        band = _finite("peer policy band", self.band)
        if not 0 <= band < 50:
            raise AnomalyError(f"peer policy band={self.band} must be in [0, 50) percent")
        if _finite("peer policy rel_floor", self.rel_floor) < 0:
            raise AnomalyError(f"peer policy rel_floor={self.rel_floor} must be >= 0")
        if _finite("peer policy abs_floor", self.abs_floor) <= 0:
            raise AnomalyError(f"peer policy abs_floor={self.abs_floor} must be > 0")
        _positive_int("peer policy min_signals", self.min_signals)


#: a training group's health against its peers (``guard.health``): the least difference from
#: the peers' median that is an outlier. Groups that all wait (a stalled peer holds every
#: group's op) read 0.00-0.01 of a core, and the z of 0.01 against a median of 0 is 1e7 (a CI
#: run alerted on two such groups); a fault moves a group's CPU use by most of a core.
#: Memory's median is large: its relative floor holds. (A node's gaps: ``core.nodes``.)
GROUP_MIN_GAP = {"cpu_util": 0.25}


def peer_outliers(signals: Mapping[Hashable, Mapping[str, float]],
                  policy: PeerPolicy | None = None, min_gap: Mapping[str, float] | None = None
                  ) -> tuple[dict[Hashable, dict[str, float]], str]:
    """Groups that stand out from their peers, with the robust z-score of each outlier signal.

    ``signals`` maps group -> {signal name -> value} for one snapshot (a scrape). For each
    group and signal, the peers are the *other* groups that report the signal; the value is an
    outlier when there are at least ``policy.min_peers`` of them, ``|z| > policy.z`` and the
    value lies outside the peers' [P5, P95] band. Returns ``{group: {signal: z}}`` for the
    groups with at least ``policy.min_signals`` outlier signals (z is signed: negative is
    below the peers), and a reason. ``min_gap``: signal -> the least distance from the
    peers' median that counts (default 0). The z-score's floors are relative to the median,
    so a signal whose peers all sit near zero (the CPU use of groups that all wait) gets a
    z of millions from a difference of 0.01; its gap says what difference means anything.
    """
    policy = policy or PeerPolicy()
    if not isinstance(signals, Mapping):
        raise AnomalyError(f"signals={signals!r} is not a mapping group -> {{signal: value}}")
    by_signal: dict[str, dict[Hashable, float]] = {}
    for g, sig in signals.items():
        if not isinstance(sig, Mapping):
            raise AnomalyError(f"signals of group {g!r}={sig!r} is not a mapping")
        for name, v in sig.items():
            by_signal.setdefault(name, {})[g] = _finite(f"signal {name!r} of group {g!r}", v)
    flags: dict[Hashable, dict[str, float]] = {}
    thin: set[str] = set()
    for name, values in by_signal.items():
        for g, x in values.items():
            peers = [v for h, v in values.items() if h != g]
            if len(peers) < policy.min_peers:
                thin.add(name)
                continue
            z = robust_z(x, peers, policy.rel_floor, policy.abs_floor)
            s = sorted(peers)
            lo, hi = _percentile(s, policy.band), _percentile(s, 100 - policy.band)
            gap = (min_gap or {}).get(name, 0.0)
            if abs(z) > policy.z and not lo <= x <= hi and abs(x - median(peers)) >= gap:
                flags.setdefault(g, {})[name] = z
    flags = {g: zs for g, zs in flags.items() if len(zs) >= policy.min_signals}
    note = (f"; too few peers for {', '.join(sorted(map(str, thin)))}" if thin else "")
    if not flags:
        return {}, (f"peers: no group beyond |z| > {policy.z:g} in {policy.min_signals}+ "
                    f"signals{note}")
    detail = "; ".join(
        f"group {g}: " + ", ".join(f"{n} z={z:+.1f}" for n, z in zs.items())
        for g, zs in flags.items())
    return flags, (f"peers: {detail} (|z| > {policy.z:g} and outside the peers' "
                   f"P{policy.band:g}-P{100 - policy.band:g}){note}")


#: No new committed step for this long while nobody is being re-formed suggests a stall that
#: heartbeats cannot see: a hang is found by staleness in 1 s and masked within 2 s, and a
#: wipe-out waiting for a cold spare shows every survivor in the same wait (which stack
#: aggregation leaves alone), so 3 s is past both.
STALL_S = 3.0


def stall_suspected(now: float, last_step_t: float, started: bool,
                    threshold: float = STALL_S) -> bool:
    """Whether to dump stacks: training has committed a step, and none for ``threshold`` s."""
    return started and now - last_step_t > threshold


def persisting(hits: Mapping[Hashable, int], flagged: Iterable[Hashable], rounds: int
               ) -> tuple[dict[Hashable, int], list[Hashable]]:
    """Consecutive-round counting for peer outliers: groups flagged this round add one, the
    others start over; returns the new counts and the groups that reached ``rounds`` now
    (one noisy scrape is not a fault — backendai.md §2 asks for persistence)."""
    flagged = set(flagged)
    new = {g: hits.get(g, 0) + 1 for g in flagged}
    return new, sorted((g for g, c in new.items() if c == rounds), key=repr)
