"""Failure precursors as peer-relative change: robust z against the peers, the unit's own
baseline removed, a clipped CUSUM per signal, signals combined by fitted thresholds.

Why not the peer band with a persistence (``core.precursors``): that rule asks a node to sit
outside its peers' P5-P95 band with a large z for K scrapes in a row on two families at once.
It sees the report's shapes — a collapse, a spike — and little else: a GPU drifting 8 °C hotter
over three hours is never "outside with |z| > 4" for long enough, an oscillating power draw
crosses the band every other scrape, a burst of correctable errors every ten minutes never
persists, and a precursor on one signal never makes two families. Tried on metrics from another
tool it warned before the XID for 0 of 10 failures.

What is assumed instead is only that a failing unit *moves away from its peers* and stays
away for a while, in any shape:

1. **peer z** — per signal and scrape, every unit (a node, or one GPU) against the other live
   units: ``(x - median(peers)) / max(1.4826 MAD, rel_floor |median|, floor)``. The cluster's
   common moves (checkpoints, restarts, the daily cycle, a job's end) cancel.
2. **own baseline** — a unit can sit at its own level among its peers for good (a warm slot,
   a chronic error rate). Its peer z is summarised per block (``block`` scrapes: median and
   MAD); the baseline is the median of its last ``history`` *accepted* blocks (at least
   three), lagged a block, kept per *regime* of the cluster (its level on a log2 scale: under
   load a GPU's offset among its peers shows, at idle it vanishes);
   a block whose median leaves the baseline by more than ``gate`` is not accepted (a precursor
   does not teach the baseline that it is normal), unless ``history`` blocks in a row were
   refused (then the unit has really moved: a replaced GPU, a re-seated node). ``r = (z -
   baseline) / max(own spread, spread_floor)``, the spread being the within-block and the
   between-block spreads together (a GPU whose temperature wanders slowly is not a GPU that
   moved). Dividing by the unit's *own* spread matters when the peers differ among
   themselves far more than each one varies: their spread (the z's scale) then hides a
   change that is large for the unit; the floor keeps a quantised, nearly constant signal
   (integer temperatures) from turning one degree into an alarm.
3. **clipped CUSUM** — ``S = max(0, S + min(|r|, cap) - k)`` (``up``-only signals use r's
   positive part). A step adds ``min(|r|, cap) - k`` per scrape, a drift more and more, an
   oscillation its mean ``|r|``, a burst of errors (counted over a window) its window; a
   short hiccup adds at most ``cap - k`` per scrape, so ``cap`` bounds how fast one burst can
   alarm without a persistence rule; ``k`` is the noise it forgives.
4. **combination** — a node's evidence on a signal is its worst unit's S over that signal's
   threshold ``h`` (fitted: ``core.changefit``). The node alerts when one signal exceeds 1,
   or two *families* exceed ``pair`` (<= 1) together: a strong change on one signal is
   enough, a weaker one needs corroboration. Strictly above: a threshold is a quantile of
   healthy evidence, and the largest healthy values come in ties (a healthy burst of errors
   saturates the same way every time).

No ramp shape, lead time or direction is assumed (except for error counters, where only up is
bad). The thresholds are the only fitted numbers and are never fitted on the cluster being
scored (``learn fit`` fits them on other synthetic clusters).

Pure: arrays in, arrays out; no clock, no I/O.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from unbroken.core.precursors import robust_peers

__all__ = ["ChangePolicy", "ChangeError", "peer_z", "own_baseline", "cusum", "deviation",
           "clipped_cusum", "regimes", "node_evidence", "combine", "combine_pairs",
           "ChangeDetection", "detect_change"]


MIN_BLOCKS = 3      # a baseline is the median of at least this many blocks (one bad block,
                    # say a failed node's last minutes, cannot become a unit's normal)


class ChangeError(ValueError):
    """A policy value out of range or inputs of mismatched shapes (one line)."""


@dataclass(frozen=True)
class ChangePolicy:
    k: float = 1.0                 # CUSUM allowance (robust z units forgiven per scrape)
    cap: float = 6.0               # |r| counts at most this much per scrape
    thresholds: dict = field(default_factory=dict)   # signal -> h (CUSUM units)
    pair: float = 0.6              # two families each at >= pair x h alert together
    block: int = 60                # baseline block, scrapes (30 min at 30 s)
    history: int = 12              # accepted blocks in the baseline (6 h at 30 s)
    gate: float = 2.0              # a block this far from the baseline is not accepted
    spread_floor: float = 1.0      # a unit's own spread is taken as at least this (z units)
    min_peers: int = 3             # live peer nodes needed for a decision
    rel_floor: float = 0.01        # the z's scale is at least this share of the peers' median
    merge_gap: int = 20            # alerts this many scrapes apart or closer are one episode

    def check(self) -> "ChangePolicy":
        for name in ("k", "cap", "gate", "rel_floor", "spread_floor"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and np.isfinite(v) and v >= 0):
                raise ChangeError(f"detector {name} {v!r}: expected a number >= 0")
        if not self.cap > self.k:
            raise ChangeError(f"detector cap {self.cap} <= k {self.k}: nothing would add up")
        if not 0 < self.pair <= 1:
            raise ChangeError(f"detector pair {self.pair}: expected 0 < pair <= 1")
        for name in ("block", "history", "min_peers", "merge_gap"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name in (
                    "history", "merge_gap") else 1):
                raise ChangeError(f"detector {name} {v!r}: expected a non-negative integer")
        for s, h in self.thresholds.items():
            if not (isinstance(h, (int, float)) and np.isfinite(h) and h > 0):
                raise ChangeError(f"detector threshold {s} {h!r}: expected a positive number")
        return self

    def with_thresholds(self, th: Mapping[str, float]) -> "ChangePolicy":
        return replace(self, thresholds=dict(th))


def peer_z(x: np.ndarray, live: np.ndarray, floor: float = 0.0, rel_floor: float = 0.01,
           ok_t: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(U, T) robust z of every unit against the other live units at the same scrape (NaN
    where the unit is not live, or where ``ok_t`` is False: too few live peers), and (T,) the
    median of all live units (the cluster's level, which tells its regimes apart)."""
    pr = robust_peers(x, live, rel_floor, floor)
    with np.errstate(all="ignore"):
        z = np.where(pr.ok & (pr.n[:, None] >= 2), (pr.xt - pr.med) / pr.scale[:, None], np.nan)
    if ok_t is not None:
        z[~np.asarray(ok_t, bool)] = np.nan
    return z.T, pr.med_all


def regimes(level: np.ndarray, floor: float) -> np.ndarray:
    """(T,) int: the cluster's regime per scrape, its level on a log2 scale (a training job
    and the idle minutes between its attempts are different regimes: a GPU's offset among its
    peers shows under load and vanishes at idle); -1 where there is no level."""
    with np.errstate(all="ignore"):
        r = np.floor(np.log2(np.fmax(np.abs(level), max(floor, 1e-12))))
    return np.where(np.isfinite(r), r, -1).astype(np.int64)


def nanmedian_last(a: np.ndarray) -> np.ndarray:
    """``np.nanmedian(a, axis=-1)``, the same values to the bit, without numpy's path for a
    short axis: under 600 values numpy takes each row's median through masked arrays, ~0.13
    ms a call for a (48, 8) history, and the baselines call it three times a block (fitting a
    detector spent 81 of its 144 s there). Sorted, NaN go last; the median is the middle of
    the values that are not NaN (the mean of the two middle ones for an even count, as
    numpy's); NaN for a row of NaN."""
    s = np.sort(a, axis=-1)
    n = (~np.isnan(a)).sum(axis=-1, keepdims=True)
    lo = np.take_along_axis(s, np.maximum(n - 1, 0) // 2, axis=-1)[..., 0]
    hi = np.take_along_axis(s, np.maximum(n // 2 - (n == 0), 0), axis=-1)[..., 0]
    n = n[..., 0]
    with np.errstate(all="ignore"):  # inf + -inf is NaN, as numpy's median gives
        return np.where(n == 0, np.nan, np.where(n % 2 == 1, lo, (lo + hi) / 2))


def _blocks(z: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-block median and robust spread (1.4826 MAD) of each row; NaN for blocks with fewer
    than a sixth of their scrapes."""
    U, T = z.shape
    nb = -(-T // block)
    zb = np.full((U, nb * block), np.nan)
    zb[:, :T] = z
    zb = zb.reshape(U, nb, block)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        med = nanmedian_last(zb)
        mad = 1.4826 * nanmedian_last(np.abs(zb - med[..., None]))
    few = np.isfinite(zb).sum(axis=2) < max(1, block // 6)
    med[few] = np.nan
    mad[few] = np.nan
    return med, mad


def own_baseline(z: np.ndarray, block: int, history: int, gate: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Each unit's baseline and spread per block (U, blocks): the median of the block medians
    and spreads of its last ``history`` accepted blocks, lagged one block (NaN: no history).
    See the module docstring for acceptance."""
    med, mad = _blocks(z, block)
    U, nb = med.shape
    base = np.full((U, nb), np.nan)
    spread = np.full((U, nb), np.nan)
    if history == 0:
        return base, spread
    buf_m = np.full((U, history), np.nan)
    buf_s = np.full((U, history), np.nan)
    ptr = np.zeros(U, np.int64)
    refused = np.zeros(U, np.int64)
    rows = np.arange(U)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for j in range(nb):
            enough = np.isfinite(buf_m).sum(axis=1) >= min(MIN_BLOCKS, history)
            b = nanmedian_last(buf_m)
            between = 1.4826 * nanmedian_last(np.abs(buf_m - b[:, None]))
            within = nanmedian_last(buf_s)
            base[:, j] = np.where(enough, b, np.nan)
            spread[:, j] = np.where(enough, np.hypot(within, between), np.nan)
            if j == 0:
                continue
            m, b, s = med[:, j - 1], base[:, j - 1], spread[:, j - 1]
            have = np.isfinite(m)
            near = ~np.isfinite(b) | (np.abs(m - b) <= gate * np.fmax(np.nan_to_num(s, nan=1.0),
                                                                      1.0))
            refused = np.where(have & ~near, refused + 1, np.where(have, 0, refused))
            force = refused >= history
            buf_m[force] = np.nan
            buf_s[force] = np.nan
            refused[force] = 0
            acc = have & (near | force)
            buf_m[rows[acc], ptr[acc]] = m[acc]
            buf_s[rows[acc], ptr[acc]] = mad[acc, j - 1]
            ptr[acc] = (ptr[acc] + 1) % history
    return base, spread


def cusum(x: np.ndarray) -> np.ndarray:
    """``S_t = max(0, S_{t-1} + x_t)``, S_0 = 0, along the last axis (Lindley: the running sum
    minus its running minimum, no Python loop)."""
    c = np.cumsum(x, axis=-1)
    return c - np.minimum(np.minimum.accumulate(c, axis=-1), 0.0)


def deviation(z: np.ndarray, policy: ChangePolicy, regime: np.ndarray | None = None
              ) -> np.ndarray:
    """(U, T) each unit's peer z less its own baseline in the current regime, over its own
    spread (at least ``spread_floor``); NaN (no evidence) until the unit has a baseline in
    that regime."""
    U, T = z.shape
    if policy.history == 0:
        return z.copy()
    regime = np.zeros(T, np.int64) if regime is None else np.asarray(regime)
    r = np.full((U, T), np.nan)
    bi = np.arange(T) // policy.block
    for g in np.unique(regime):
        if g < 0:
            continue
        at = regime == g
        zg = np.where(at[None, :], z, np.nan)
        base, spread = own_baseline(zg, policy.block, policy.history, policy.gate)
        b = base[:, bi[at]]
        s = np.fmax(np.nan_to_num(spread[:, bi[at]], nan=1.0), policy.spread_floor)
        r[:, at] = (z[:, at] - b) / s
    return r


def clipped_cusum(r: np.ndarray, k: float, cap: float, sides: str = "both") -> np.ndarray:
    """(U, T) ``S = max(0, S + min(|r|, cap) - k)`` (``up``: r's positive part); a scrape
    without data adds nothing (S decays by k)."""
    if sides == "up":
        e = np.clip(r, 0.0, cap)
    elif sides == "both":
        e = np.minimum(np.abs(r), cap)
    else:
        raise ChangeError(f"sides {sides!r}: expected 'both' or 'up'")
    return cusum(np.nan_to_num(e, nan=0.0) - k)


def node_evidence(S: np.ndarray, node_of: np.ndarray, N: int) -> np.ndarray:
    """(N, T): each node's worst unit."""
    node_of = np.asarray(node_of)
    if len(node_of) == N and np.array_equal(node_of, np.arange(N)):
        return S
    out = np.zeros((N, S.shape[1]), S.dtype)
    np.maximum.at(out, node_of, S)
    return out


@dataclass
class ChangeDetection:
    alert: np.ndarray                  # (N, T) bool
    firing: dict[str, np.ndarray]      # signal -> (N, T) bool: above ``pair`` x its h
    families_firing: np.ndarray        # (N, T) int
    level: np.ndarray                  # (N, T) float: max(best q, second family's q / pair)
    policy: ChangePolicy


def combine(evidence: Mapping[str, np.ndarray], family_of: Mapping[str, str],
            policy: ChangePolicy) -> ChangeDetection:
    """Alerts from per-signal node evidence (S, not yet divided by thresholds)."""
    return combine_pairs(evidence, family_of, policy, (policy.pair,))[0]


def combine_pairs(evidence: Mapping[str, np.ndarray], family_of: Mapping[str, str],
                  policy: ChangePolicy, pairs: tuple[float, ...]) -> list[ChangeDetection]:
    """``combine`` at each of ``pairs`` (the policy's other fields as given), sharing what
    the pair does not change: the evidence over its thresholds, each family's maximum and
    the top two families. A detector fit scores every pair of its grid on the same
    thresholds, and this shared part was most of its time."""
    used = [s for s in evidence if s in policy.thresholds]
    if not used:
        raise ChangeError("no signal with a threshold: the detector knows none of the "
                          f"input's signals ({', '.join(sorted(evidence)) or 'none'})")
    fams: dict[str, np.ndarray] = {}
    qs = {}
    for s in used:
        q = qs[s] = evidence[s] / policy.thresholds[s]
        f = family_of.get(s, s)
        fams[f] = q if f not in fams else np.maximum(fams[f], q)
    first, second = top_two(list(fams.values()))
    over = first > 1.0
    out = []
    for pair in pairs:
        out.append(ChangeDetection(
            alert=over | (second > pair), firing={s: q > pair for s, q in qs.items()},
            families_firing=sum((q > pair).astype(int) for q in fams.values()),
            level=np.maximum(first, second / pair),
            policy=policy if pair == policy.pair else replace(policy, pair=pair)))
    return out


def top_two(qs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Element-wise the largest and the second largest of same-shape arrays (the second is 0
    for one array), the values ``np.partition`` over a stack of them picks. A running
    max/min pass: the partition along the stack's first axis took 70 % of a detector fit
    (it copies every strided column). With a NaN the partition decides (it sorts NaN last)."""
    if len(qs) == 1:
        return qs[0], np.zeros_like(qs[0])
    first, second = np.maximum(qs[0], qs[1]), np.minimum(qs[0], qs[1])
    for q in qs[2:]:
        second = np.maximum(second, np.minimum(first, q))
        first = np.maximum(first, q)
    if np.isnan(first).any():  # np.maximum carries a NaN of any input into ``first``
        top2 = np.partition(np.stack(qs), len(qs) - 2, axis=0)
        return top2[-1], top2[-2]
    return first, second


def detect_change(values: Mapping[str, np.ndarray], node_of: Mapping[str, np.ndarray],
                  live: np.ndarray, floor: Mapping[str, float], sides: Mapping[str, str],
                  family_of: Mapping[str, str], policy: ChangePolicy
                  ) -> tuple[ChangeDetection, dict[str, np.ndarray]]:
    """The whole detector on (U, T) signals: alerts, and the per-signal node evidence (S)."""
    policy.check()
    N = live.shape[0]
    ok_t = live.sum(axis=0) >= policy.min_peers + 1
    ev = {}
    for s, x in values.items():
        if s not in policy.thresholds:
            continue
        if x.shape[1] != live.shape[1]:
            raise ChangeError(f"signal {s}: {x.shape[1]} scrapes, live mask {live.shape[1]}")
        z, level = peer_z(x, live[node_of[s]], floor.get(s, 0.0), policy.rel_floor, ok_t)
        r = deviation(z, policy, regimes(level, floor.get(s, 0.0)))
        S = clipped_cusum(r, policy.k, policy.cap, sides.get(s, "both"))
        ev[s] = node_evidence(S, node_of[s], N)
    return combine(ev, family_of, policy), ev
