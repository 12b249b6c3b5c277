"""Checkpoint I/O: save and load phases from the cluster's NFS rates, and what limits them.

Why from the NFS rates: a cluster's monitoring already has every client's NFS byte counters;
summed over nodes they show each checkpoint as a burst, without instrumenting the trainer. The
phase rules are the report's as Algalon encodes them (backendai.md §5):

* SAVE while the cluster-wide write rate exceeds 20 GB/s;
* LOAD while the read rate exceeds 2 GB/s **and** mean GPU utilisation is below 50 % (a restart
  loading, not the data loader feeding a busy job).

A phase's edges are refined below the scrape: the scrapes on either side that carry part of the
burst (above a tenth of the threshold) are included, and the burst's length is its bytes over
its plateau rate, so a 225 s save scraped every 30 s is measured to a few seconds.

Why the diagnosis: the report's **bandwidth paradox** (F2) — saves at ~16 % of the storage's
write maximum and 1.4-10.4 % of the RoCE links while **93 % of WRITE latency was client-side
queue time** — means the limit is the NFS client's RPC slot table (128 sunrpc slots), not the
network: more bandwidth would not help; more slots (``sunrpc.tcp_max_slot_table_entries``),
``nconnect`` or staggered, sharded saves would. ``diagnose`` says which case the data shows.

Pure: arrays in, phases and a diagnosis out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CkptPolicy", "Phase", "segment", "Diagnosis", "diagnose"]


@dataclass(frozen=True)
class CkptPolicy:
    save_Bps: float = 20e9           # cluster write rate that marks a save
    load_Bps: float = 2e9            # cluster read rate that marks a load (with low GPU util)
    load_util_below: float = 50.0
    max_write_Bps: float = 250e9     # the storage's maximum (report: 250 GB/s write)
    max_read_Bps: float = 700e9      # (report: 700 GB/s read)
    link_Bps: float = 25e9           # one node's network link (200 Gbps RoCE)
    queue_share_alert: float = 0.9   # the report's alert: queue share > 0.9
    rpc_slots: int = 128


@dataclass(frozen=True)
class Phase:
    kind: str            # "save" or "load"
    start: float
    end: float
    bytes: float
    mean_Bps: float      # bytes / duration
    peak_Bps: float
    share_of_max: float  # mean rate / the storage's maximum for that direction
    queue_share: float   # client queue time / request time during the phase (NaN if unknown)

    @property
    def duration(self) -> float:
        return self.end - self.start


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    d = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(d == 1).tolist(), (np.flatnonzero(d == -1) - 1).tolist()))


def segment(t: np.ndarray, write_Bps: np.ndarray, read_Bps: np.ndarray,
            util_mean: np.ndarray | None = None, write_queue_share: np.ndarray | None = None,
            read_queue_share: np.ndarray | None = None,
            policy: CkptPolicy = CkptPolicy()) -> list[Phase]:
    """Save and load phases. Rates are per scrape interval (t - dt, t], cluster-wide."""
    dt = float(t[1] - t[0]) if len(t) > 1 else 30.0
    w = np.nan_to_num(np.asarray(write_Bps, float))
    r = np.nan_to_num(np.asarray(read_Bps, float))
    util = np.full(len(t), 0.0) if util_mean is None else np.nan_to_num(util_mean, nan=0.0)
    out = []
    for kind, rate, cond, thr, qs, mx in (
            ("save", w, w > policy.save_Bps, policy.save_Bps, write_queue_share,
             policy.max_write_Bps),
            ("load", r, (r > policy.load_Bps) & (util < policy.load_util_below), policy.load_Bps,
             read_queue_share, policy.max_read_Bps)):
        for a, b in _runs(cond):
            # the background (a data loader's reads, logs) around the burst is not checkpoint
            around = np.concatenate([rate[max(0, a - 6):a], rate[b + 1:b + 7]])
            around = around[around <= thr]
            base = float(np.median(around)) if len(around) else 0.0
            ex = np.clip(rate - base, 0.0, None)
            core = ex[a:b + 1]
            a0, b0 = a, b
            # the plateau: the burst's full scrapes (the two lowest may be its partial edges)
            top = np.sort(core)[::-1][:max(1, len(core) - 2)]
            plateau = float(np.median(top))
            if plateau <= 0:
                continue
            # a burst that does not start or end on a scrape leaves part of it in the scrape
            # on either side
            if a > 0 and not cond[a - 1] and ex[a - 1] > 0.05 * plateau:
                a -= 1
            if b + 1 < len(t) and not cond[b + 1] and ex[b + 1] > 0.05 * plateau:
                b += 1
            seg = ex[a:b + 1]
            total = float(seg.sum() * dt)
            dur = total / plateau
            # the burst sits inside [t[a] - dt, t[b]]: place it by its partial first scrape
            start = float(t[a]) - dt * min(1.0, seg[0] / plateau)
            end = start + dur
            q = float("nan")
            if qs is not None:
                qv = np.asarray(qs, float)[a0:b0 + 1]     # the full scrapes of the burst
                ok = np.isfinite(qv)
                if ok.any():
                    q = float(np.mean(qv[ok]))
            out.append(Phase(kind, start, end, total, total / dur, float(rate[a:b + 1].max()),
                             (total / dur) / mx, q))
    return sorted(out, key=lambda p: p.start)


@dataclass(frozen=True)
class Diagnosis:
    bottleneck: str          # "rpc_slots", "bandwidth", "none" or "unknown"
    reason: str
    fix: str
    save_share_of_max: float
    load_share_of_max: float
    link_utilisation: float  # mean save rate / (nodes x link rate)
    save_queue_share: float


def diagnose(phases: list[Phase], nodes: int, policy: CkptPolicy = CkptPolicy()) -> Diagnosis:
    saves = [p for p in phases if p.kind == "save"]
    loads = [p for p in phases if p.kind == "load"]
    if not saves:
        return Diagnosis("unknown", "no checkpoint save found in the NFS write rates", "",
                         float("nan"), float("nan"), float("nan"), float("nan"))
    w = float(np.mean([p.mean_Bps for p in saves]))
    save_share = w / policy.max_write_Bps
    load_share = (float(np.mean([p.mean_Bps for p in loads])) / policy.max_read_Bps
                  if loads else float("nan"))
    link = w / (max(nodes, 1) * policy.link_Bps)
    qs = [p.queue_share for p in saves if np.isfinite(p.queue_share)]
    q = float(np.mean(qs)) if qs else float("nan")
    facts = (f"saves average {w / 1e9:.1f} GB/s ({save_share:.1%} of the storage's "
             f"{policy.max_write_Bps / 1e9:g} GB/s write maximum, {link:.1%} of {nodes} x "
             f"{policy.link_Bps * 8 / 1e9:g} Gbps links)")
    if np.isfinite(q) and q > policy.queue_share_alert and link < 0.5 and save_share < 0.5:
        return Diagnosis(
            "rpc_slots",
            f"{facts}, and {q:.1%} of WRITE latency is client-side queue time: the NFS "
            f"client's RPC slot table ({policy.rpc_slots} slots) is saturated, not the network",
            "raise sunrpc.tcp_max_slot_table_entries, mount with nconnect=N, or stagger and "
            "shard the checkpoint writes across nodes",
            save_share, load_share, link, q)
    if link >= 0.5 or save_share >= 0.5:
        return Diagnosis("bandwidth", f"{facts}: the links or the storage are the limit",
                         "add storage bandwidth or write less (sharded, incremental or "
                         "compressed checkpoints)", save_share, load_share, link, q)
    return Diagnosis("none", f"{facts}; queue share {q:.1%}: no saturation visible", "",
                     save_share, load_share, link, q)
