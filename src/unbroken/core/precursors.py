"""Failure precursors: the peer-relative, multi-signal detector, its calibration and its score.

Why peer-relative: a training cluster's load moves together — checkpoint saves, restarts, the
idle minutes between retry attempts, the daily cycle — so a fixed threshold on "interrupts per
second" either fires on every restart or misses a collapse. The Backend.AI report draws every
metric as the **P5-P95 band of the node's peers with the failing node overlaid** (backendai.md
§2): what is abnormal is a node leaving its peers, not a value. Why multi-signal: in the
report no single metric dominates across failure types (an NVLink fault collapses interrupts
and runnable processes — gpu071; an ECC fault spikes page-outs and NFS GETATTR latency —
gpu096), and one family alone fires on every short hiccup.

The rule (backendai.md §2's "implementable detector", vectorised over nodes and scrapes):

* for each signal at each scrape, the node's **peers** are the other live nodes (fewer than
  ``min_peers`` live peers: no decision — the report's "at least 3 live nodes");
* the node is an **outlier** when it lies outside the peers' P5-P95 band *and* its robust z,
  ``(x - median(peers)) / max(1.4826 MAD, rel_floor |median|, floor)``, exceeds ``z`` in size
  (the band alone fires on every node at every scrape 10 % of the time; the z alone fires on a
  tight cluster's rounding);
* a signal **fires** once it has been an outlier for ``persist`` consecutive scrapes;
* the node **alerts** while signals of at least ``families`` distinct families fire.

``calibrate`` picks (z, persist, families) on healthy data: the most sensitive setting (the
shortest persistence first: it is the lead time) whose false alarms per day stay within the
budget. The report's detector ran at ~0.84 false alarms per day with 10/10 failures found, 2
of them before the XID; ``score`` measures exactly those three numbers against failure times.

Pure: arrays in, arrays and plain data out; no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["DetectorPolicy", "Detection", "PeerStats", "peer_stats", "run_lengths", "detect",
           "episodes", "Failure", "Score", "score", "calibrate", "CalibrationRow",
           "DetectorError", "Peers", "robust_peers"]


class DetectorError(ValueError):
    """A policy value out of range or inputs of mismatched shapes (one line)."""


@dataclass(frozen=True)
class DetectorPolicy:
    z: float = 4.0            # robust z-score threshold (absolute)
    persist: int = 4          # consecutive outlier scrapes before a signal fires
    families: int = 2         # distinct metric families firing together
    min_peers: int = 3        # live peers needed for a decision
    band: tuple[float, float] = (5.0, 95.0)   # the peers' percentile band
    rel_floor: float = 0.05   # the z's scale is at least this share of the peers' median
    merge_gap: int = 20       # alerts this many scrapes apart or closer are one episode

    def check(self) -> "DetectorPolicy":
        if not self.z > 0:
            raise DetectorError(f"detector z {self.z}: expected a positive number")
        for name in ("persist", "families", "min_peers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise DetectorError(f"detector {name} {v!r}: expected an integer >= 1")
        lo, hi = self.band
        if not 0 <= lo < hi <= 100:
            raise DetectorError(f"detector band {self.band}: expected 0 <= lo < hi <= 100")
        return self


@dataclass
class PeerStats:
    """One signal against its peers: what does not depend on the thresholds."""
    z: np.ndarray          # (N, T) robust z against the peers (NaN where not live)
    outside: np.ndarray    # (N, T) bool: outside the peers' band
    lo: np.ndarray         # (T,) the band over all live nodes (for plots and rules)
    hi: np.ndarray
    median: np.ndarray


def _quantile(srt: np.ndarray, n: np.ndarray, q: float) -> np.ndarray:
    """Quantile q (linear interpolation) of each row's first n[t] sorted values; NaN for n=0.
    ``srt``: (T, N) sorted along the last axis."""
    pos = q * np.maximum(n - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    a = np.take_along_axis(srt, lo[:, None], axis=1)[:, 0]
    b = np.take_along_axis(srt, hi[:, None], axis=1)[:, 0]
    with np.errstate(invalid="ignore"):
        out = a + (pos - lo) * (b - a)
    return np.where(n > 0, out, np.nan)


def _loo_quantile(srt: np.ndarray, rank: np.ndarray, n: np.ndarray, q: float) -> np.ndarray:
    """Quantile q (linear) of each node's peers: the live values without the node itself.

    ``srt``: (T, N) values sorted per scrape, non-live last; ``rank``: (T, N) each node's
    position in ``srt``; ``n``: (T,) live count. The k-th peer is srt[k] below the node's rank,
    srt[k+1] from it on. Returns (T, N)."""
    m = np.maximum(n - 1, 1)[:, None]
    pos = q * (m - 1)
    lo = np.floor(pos).astype(np.int64)
    frac = pos - lo
    hi = np.minimum(lo + 1, m - 1)
    N = srt.shape[1]
    lo_i = np.clip(lo + (lo >= rank), 0, N - 1)
    hi_i = np.clip(hi + (hi >= rank), 0, N - 1)
    a = np.take_along_axis(srt, lo_i, axis=1)
    b = np.take_along_axis(srt, hi_i, axis=1)
    with np.errstate(invalid="ignore"):
        return a + frac * (b - a)


@dataclass
class Peers:
    """One signal's live values sorted per scrape, and what every detector reads from them."""
    xt: np.ndarray          # (T, N) values, NaN where not live
    ok: np.ndarray          # (T, N) live
    n: np.ndarray           # (T,) live count
    srt: np.ndarray         # (T, N) sorted, non-live last (inf)
    rank: np.ndarray        # (T, N) each node's position in srt
    med: np.ndarray         # (T, N) median of each node's peers (leave-one-out)
    med_all: np.ndarray     # (T,) median of all live
    scale: np.ndarray       # (T,) max(1.4826 MAD, rel_floor |median|, floor); NaN if 0

    def quantile(self, q: float) -> np.ndarray:
        """(T, N) quantile q of each node's peers."""
        return _loo_quantile(self.srt, self.rank, self.n, q)


def robust_peers(x: np.ndarray, live: np.ndarray, rel_floor: float, floor: float = 0.0
                 ) -> Peers:
    """Sort each scrape's live values once (scrape-major, contiguous along the nodes), read the
    leave-one-out median and the robust scale from the sorted array."""
    xt = np.where(live, np.asarray(x, float), np.nan).T.copy()       # (T, N)
    ok = np.isfinite(xt)
    n = ok.sum(axis=1)
    filled = np.where(ok, xt, np.inf)
    order = np.argsort(filled, axis=1, kind="stable")
    srt = np.take_along_axis(filled, order, axis=1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(xt.shape[1]), xt.shape), axis=1)
    med = _loo_quantile(srt, rank, n, 0.5)
    med_all = _quantile(srt, n, 0.5)
    dev = np.sort(np.where(ok, np.abs(xt - med_all[:, None]), np.inf), axis=1)
    mad = 1.4826 * _quantile(dev, n, 0.5)
    with np.errstate(all="ignore"):
        scale = np.fmax(np.fmax(mad, rel_floor * np.abs(med_all)), floor)
        scale = np.where(scale > 0, scale, np.nan)
    return Peers(xt, ok, n, srt, rank, med, med_all, scale)


def peer_stats(x: np.ndarray, live: np.ndarray, policy: DetectorPolicy,
               floor: float = 0.0) -> PeerStats:
    """Robust z and band membership of every node against its peers, at every scrape.

    Work is done scrape-major ((T, N), contiguous along the nodes) with one sort and one
    argsort per signal; the leave-one-out quantiles are read from the sorted array."""
    pr = robust_peers(x, live, policy.rel_floor, floor)
    xt, ok, n = pr.xt, pr.ok, pr.n
    lo_q, hi_q = policy.band[0] / 100.0, policy.band[1] / 100.0
    p_lo, p_hi = pr.quantile(lo_q), pr.quantile(hi_q)
    with np.errstate(all="ignore"):
        z = np.where(ok, (xt - pr.med) / pr.scale[:, None], np.nan)
        outside = ok & ((xt < p_lo) | (xt > p_hi))
    outside[n < policy.min_peers + 1, :] = False
    return PeerStats(z=z.T, outside=outside.T, lo=_quantile(pr.srt, n, lo_q),
                     hi=_quantile(pr.srt, n, hi_q), median=pr.med_all)


def run_lengths(flag: np.ndarray) -> np.ndarray:
    """(N, T) bool -> length of the run of True ending at each scrape (0 where False)."""
    c = np.cumsum(flag, axis=1, dtype=np.int64)
    last_false = np.maximum.accumulate(np.where(flag, 0, c), axis=1)
    return c - last_false


@dataclass
class Detection:
    alert: np.ndarray                  # (N, T) bool
    firing: dict[str, np.ndarray]      # signal -> (N, T) bool (persisted outlier)
    families_firing: np.ndarray        # (N, T) int
    policy: DetectorPolicy


def detect(stats: Mapping[str, PeerStats], family_of: Mapping[str, str],
           policy: DetectorPolicy) -> Detection:
    """Alerts from per-signal peer statistics under ``policy`` (thresholds only: cheap)."""
    policy.check()
    if not stats:
        raise DetectorError("no signals to detect on")
    firing = {}
    fams: dict[str, np.ndarray] = {}
    for name, st in stats.items():
        with np.errstate(invalid="ignore"):
            out = st.outside & (np.abs(st.z) > policy.z)
        f = run_lengths(out) >= policy.persist
        firing[name] = f
        fam = family_of.get(name, name)
        fams[fam] = f if fam not in fams else (fams[fam] | f)
    count = np.sum(np.stack(list(fams.values())), axis=0)
    return Detection(alert=count >= policy.families, firing=firing, families_firing=count,
                     policy=policy)


def episodes(alert: np.ndarray, merge_gap: int) -> list[tuple[int, int, int]]:
    """Alert episodes as (node, first scrape, last scrape); runs at most ``merge_gap`` scrapes
    apart are one episode."""
    out = []
    N, T = alert.shape
    padded = np.zeros((N, T + 2), bool)
    padded[:, 1:-1] = alert
    d = np.diff(padded.astype(np.int8), axis=1)
    for node in np.flatnonzero(alert.any(axis=1)):
        starts = np.flatnonzero(d[node] == 1)
        ends = np.flatnonzero(d[node] == -1) - 1
        cur = [int(starts[0]), int(ends[0])]
        for s, e in zip(starts[1:].tolist(), ends[1:].tolist()):
            if s - cur[1] - 1 <= merge_gap:
                cur[1] = e
            else:
                out.append((int(node), cur[0], cur[1]))
                cur = [s, e]
        out.append((int(node), cur[0], cur[1]))
    return sorted(out, key=lambda e: (e[1], e[0]))


@dataclass(frozen=True)
class Failure:
    node: int          # index into the node axis
    time: float        # the XID's time (same clock as the scrape times)


@dataclass
class Score:
    detected: list[float | None]       # per failure: first alert time matched, None if missed
    lead_s: list[float | None]         # per failure: xid_time - detected_time (> 0: before)
    fired: list[list[str]]             # per failure: signals firing in the matched episode
    false_alarms: list[tuple[int, float, float]]   # (node, start, end) of unmatched episodes
    days: float

    @property
    def n_detected(self) -> int:
        return sum(d is not None for d in self.detected)

    @property
    def before_xid(self) -> int:
        return sum(1 for x in self.lead_s if x is not None and x > 0)

    @property
    def false_alarms_per_day(self) -> float:
        return len(self.false_alarms) / self.days if self.days > 0 else float("nan")


def score(det: Detection, t: np.ndarray, failures: Sequence[Failure], pre_s: float = 1800.0,
          post_s: float = 1800.0) -> Score:
    """Match alert episodes to failures: an episode on the failing node overlapping
    [xid - pre_s, xid + post_s] detects it (the earliest such episode's start is the detection
    time); every other episode is a false alarm."""
    eps = episodes(det.alert, det.policy.merge_gap)
    used = set()
    detected, lead, fired = [], [], []
    for f in failures:
        hit = None
        for i, (node, a, b) in enumerate(eps):
            if node == f.node and t[b] >= f.time - pre_s and t[a] <= f.time + post_s:
                hit = i if hit is None or eps[i][1] < eps[hit][1] else hit
                used.add(i)
        if hit is None:
            detected.append(None)
            lead.append(None)
            fired.append([])
            continue
        node, a, b = eps[hit]
        detected.append(float(t[a]))
        lead.append(float(f.time - t[a]))
        fired.append(sorted(name for name, m in det.firing.items() if m[node, a:b + 1].any()))
    fa = [(n, float(t[a]), float(t[b])) for i, (n, a, b) in enumerate(eps) if i not in used]
    days = (float(t[-1] - t[0]) + (float(t[1] - t[0]) if len(t) > 1 else 0.0)) / 86400.0
    return Score(detected, lead, fired, fa, days)


@dataclass(frozen=True)
class CalibrationRow:
    z: float
    persist: int
    families: int
    false_alarms_per_day: float


def calibrate(stats: Mapping[str, PeerStats], family_of: Mapping[str, str], t: np.ndarray,
              budget_per_day: float, base: DetectorPolicy = DetectorPolicy(),
              zs: Sequence[float] = (3.0, 3.5, 4.0, 5.0, 6.0),
              persists: Sequence[int] = (2, 3, 4, 5, 6, 8, 10, 12),
              families: Sequence[int] = (2,)) -> tuple[DetectorPolicy, list[CalibrationRow],
                                                        str]:
    """The most sensitive policy whose false alarms per day on ``stats`` (healthy data: the
    caller has masked failures out of the live mask) are within ``budget_per_day``.

    Sensitivity order: fewer families first (a precursor may move only two), then a shorter
    persistence (it is the lead time), then a lower z. Returns the policy, the whole grid (for
    the report) and a reason line. When nothing meets the budget the least noisy setting is
    returned and the reason says so."""
    if not budget_per_day >= 0:
        raise DetectorError(f"false-alarm budget {budget_per_day}: expected >= 0 per day")
    rows = []
    days = max((float(t[-1] - t[0]) + float(t[1] - t[0])) / 86400.0, 1e-9) if len(t) > 1 else 1e-9
    fam_names = sorted({family_of.get(n, n) for n in stats})
    runs_by_z = {}
    for z in zs:        # the outlier runs depend on z only; persistence is a threshold on them
        with np.errstate(invalid="ignore"):
            runs_by_z[z] = {n: run_lengths(st.outside & (np.abs(st.z) > z))
                            for n, st in stats.items()}
    merge = base.merge_gap
    for s in sorted(families):
        for k in sorted(persists):
            for z in sorted(zs):
                count = np.zeros(next(iter(stats.values())).z.shape, np.int16)
                for fam in fam_names:
                    f = np.zeros_like(count, bool)
                    for n, r in runs_by_z[z].items():
                        if family_of.get(n, n) == fam:
                            f |= r >= k
                    count += f
                n_ep = len(episodes(count >= s, merge))
                rows.append(CalibrationRow(z, k, s, n_ep / days))
    ok = [r for r in rows if r.false_alarms_per_day <= budget_per_day]
    if ok:
        r = ok[0]
        why = (f"z {r.z:g}, persist {r.persist} scrapes, {r.families} families: "
               f"{r.false_alarms_per_day:.2f} false alarms/day on {days:.1f} healthy days "
               f"(budget {budget_per_day:g})")
    else:
        r = min(rows, key=lambda r: (r.false_alarms_per_day, -r.persist))
        why = (f"no setting meets {budget_per_day:g} false alarms/day on {days:.1f} days; "
               f"quietest: z {r.z:g}, persist {r.persist}, {r.families} families at "
               f"{r.false_alarms_per_day:.2f}/day")
    pol = DetectorPolicy(z=r.z, persist=r.persist, families=r.families,
                         min_peers=base.min_peers, band=base.band, rel_floor=base.rel_floor,
                         merge_gap=base.merge_gap)
    return pol, rows, why
