"""Precursor shapes for the synthetic cluster: families a detector can be fitted on and held out of.

Why families: a detector tuned on one generator learns that generator's shapes. The report
describes a few (an interrupt collapse with runnable processes at zero — gpu071; page-out and
NFS latency spikes — gpu096); real GPUs also drift hot, lose power or clock, leak memory, slow
their network, oscillate under a power cap or throw bursts of correctable errors, on one
signal or several, minutes or hours ahead, or not at all. ``learn synth --shapes FAMILY``
draws every early precursor of a cluster from one family, so that ``learn fit`` can be fitted
on some families and scored on another:

* ``report``      — the report's collapses and spikes (the failure type decides which), 6-15 min
  ahead (the generator's original shape);
* ``step``        — a level shift on 2-3 GPU or node signals, 5 min - 3 h ahead;
* ``drift``       — a slow ramp (linear or convex) on 1-2 signals, reaching its size at the
  XID, 1-8 h ahead;
* ``oscillation`` — a periodic swing (period 2-20 min) on 1-2 signals, 10 min - 3 h ahead;
* ``burst``       — bursts of correctable ECC errors and/or PCIe replays, more frequent
  towards the XID, 20 min - 6 h ahead;
* ``single``      — one signal only, with a step, a drift or an oscillation, 10 min - 4 h ahead.

Sizes are moderate on purpose (a few robust standard deviations of the peers, not tens): some
precursors are meant to be hard. A failure may also have no precursor at all
(``SynthSpec.silent``). Whatever the family, the failure itself shows at the XID (the GPU
stops; the failure type's collapse) — that is detection after the fact, not a precursor.

Pure functions of a ``numpy.random.Generator``; ``Effects`` holds the deviations the metric
generator multiplies in or adds.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["FAMILIES", "CHANNELS", "Effects", "draw_precursor", "apply_precursor", "envelope",
           "assign_precursors"]

FAMILIES = ("report", "step", "drift", "oscillation", "burst", "single")

# channel -> (how it acts, per-GPU?, size range): "mul" multiplies the metric by
# (1 + size x envelope), "add" adds size x envelope, "burst" adds error counts
CHANNELS = {
    "gpu_temp": ("add", True, (4.0, 10.0)),         # degrees C, up
    "power": ("mul", True, (-0.25, -0.08)),          # share of the GPU's power, down
    "sm_clock": ("mul", True, (-0.15, -0.05)),       # share of the SM clock, down
    "gpu_util": ("mul", True, (-0.30, -0.10)),       # share of utilisation, down
    "fb_used": ("add", True, (2048.0, 12288.0)),     # MiB, up (a leak)
    "net_rx": ("mul", False, (-0.35, -0.12)),        # share of the node's receive rate, down
    "ecc_sbe": ("burst", True, (2.0, 12.0)),         # correctable errors per burst (mean)
    "pcie_replay": ("burst", True, (2.0, 12.0)),     # PCIe replays per burst (mean)
}
_LEVEL = ("gpu_temp", "power", "sm_clock", "gpu_util", "fb_used", "net_rx")
_SWING = ("gpu_temp", "power", "sm_clock", "gpu_util")

# family -> (lead range s, log-uniform?, channels to choose from, how many)
_FAMILY = {
    "step": ((300.0, 3 * 3600.0), True, _LEVEL, (2, 3)),
    "drift": ((3600.0, 8 * 3600.0), True, ("gpu_temp", "power", "sm_clock", "fb_used",
                                            "net_rx"), (1, 2)),
    "oscillation": ((600.0, 3 * 3600.0), True, _SWING, (1, 2)),
    "burst": ((1200.0, 6 * 3600.0), True, ("ecc_sbe", "pcie_replay"), (1, 2)),
    "single": ((600.0, 4 * 3600.0), True, _LEVEL + ("ecc_sbe",), (1, 1)),
}


class Effects:
    """Deviations of the metrics from health, created on first use: ``mul[ch]`` multiplies,
    ``add[ch]`` adds, ``burst[ch]`` adds counts per scrape. Per-GPU channels are (N, G, T),
    node channels (N, T)."""

    def __init__(self, N: int, G: int, T: int) -> None:
        self.N, self.G, self.T = N, G, T
        self.mul: dict[str, np.ndarray] = {}
        self.add: dict[str, np.ndarray] = {}
        self.burst: dict[str, np.ndarray] = {}

    def _arr(self, table: dict, ch: str, fill: float) -> np.ndarray:
        if ch not in table:
            shape = (self.N, self.G, self.T) if CHANNELS[ch][1] else (self.N, self.T)
            table[ch] = np.full(shape, fill)
        return table[ch]

    def target(self, ch: str) -> np.ndarray:
        kind = CHANNELS[ch][0]
        if kind == "mul":
            return self._arr(self.mul, ch, 1.0)
        return self._arr(self.add if kind == "add" else self.burst, ch, 0.0)

    def mul_of(self, ch: str, default=1.0):
        return self.mul.get(ch, default)

    def add_of(self, ch: str, default=0.0):
        return self.add.get(ch, default)


def _lead(rng, lo: float, hi: float, log: bool) -> float:
    if log:
        return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    return float(rng.uniform(lo, hi))


def draw_precursor(rng: np.random.Generator, family: str, gpus: int) -> dict:
    """One early precursor of ``family`` (not ``report``, which the failure type decides): its
    shape, lead, GPU and channels with their sizes. Plain data (it goes into truth.json)."""
    if family not in _FAMILY:
        raise ValueError(f"--shapes {family}: expected one of {', '.join(FAMILIES)}")
    (lo, hi), log, chans, (kmin, kmax) = _FAMILY[family]
    k = int(rng.integers(kmin, kmax + 1))
    picked = [str(c) for c in rng.choice(chans, size=min(k, len(chans)), replace=False)]
    shape = {"step": "step", "drift": "drift", "oscillation": "oscillation",
             "burst": "burst"}.get(family)
    if family == "single":
        shape = "burst" if picked[0] == "ecc_sbe" else str(
            rng.choice(["step", "drift", "oscillation"]))
        if shape == "oscillation" and picked[0] not in _SWING:
            shape = "step"
    out = {"family": family, "shape": shape, "lead_s": _lead(rng, lo, hi, log),
           "gpu": int(rng.integers(gpus)), "channels": []}
    if shape == "oscillation":
        out["period_s"] = float(rng.uniform(120.0, 1200.0))
    if shape == "drift":
        out["convex"] = bool(rng.random() < 0.5)
    for ch in picked:
        a, b = CHANNELS[ch][2]
        size = float(rng.uniform(a, b))
        if shape == "drift" and CHANNELS[ch][0] != "burst":
            size *= 1.3                       # a drift reaches this size only at the XID
        out["channels"].append({"channel": ch, "size": size})
    return out


def envelope(shape: str, t: np.ndarray, onset: float, xid: float, p: dict,
             rng: np.random.Generator) -> np.ndarray:
    """The precursor's time course, 0 before ``onset``: 1 (step), 0 -> 1 at the XID (drift),
    sin (oscillation, -1..1) or burst counts' multiplier (burst: 0 or a burst's relative size)."""
    e = np.zeros(len(t))
    on = t >= onset
    span = max(xid - onset, 1.0)
    frac = np.clip((t - onset) / span, 0.0, 1.0)
    if shape == "step":
        e[on] = 1.0
    elif shape == "drift":
        e[on] = (frac[on] ** 2) if p.get("convex") else frac[on]
    elif shape == "oscillation":
        e[on] = np.sin(2 * np.pi * (t[on] - onset) / p["period_s"])
    elif shape == "burst":
        dt = float(t[1] - t[0]) if len(t) > 1 else 30.0
        # one burst every 3-20 min at first, every ~2 min at the XID
        rate = (1.0 / rng.uniform(180.0, 1200.0)) * (1 + 5 * frac) * dt
        hit = on & (rng.random(len(t)) < rate)
        e[hit] = rng.exponential(1.0, int(hit.sum())) + 0.5
    else:
        raise ValueError(f"unknown precursor shape {shape!r}")
    return e


def apply_precursor(fx: Effects, p: dict, n: int, t: np.ndarray, onset: float, xid: float,
                    until: float, rng: np.random.Generator) -> None:
    """Put precursor ``p`` of node ``n`` into the effects, from ``onset`` to ``until``."""
    env = envelope(p["shape"], t, onset, xid, p, rng)
    env[t >= until] = 0.0
    g = p["gpu"]
    for c in p["channels"]:
        ch, size = c["channel"], c["size"]
        arr = fx.target(ch)
        row = arr[n, g] if CHANNELS[ch][1] else arr[n]
        kind = CHANNELS[ch][0]
        if kind == "mul":
            row *= np.maximum(1.0 + size * env, 0.0)
        elif kind == "add":
            row += size * env
        else:
            row += np.round(size * env)


def assign_precursors(family: str, seed: int, early: int, gpus: int, t: np.ndarray,
                      failures: list[dict], fx: Effects) -> None:
    """The early precursors of a family other than the report's, from their own generator
    (seeded by the cluster's seed: the timeline does not move when the family changes).

    Each precursor goes to a failure with room for it (its XID at least lead + 1 h into the
    data), longest lead first; without room, to the failure with the most history, the lead
    shortened (truth.json has the lead used). Silent failures get none; the rest ("late")
    only show at their XID."""
    if family == "report":
        for f in failures:
            f["precursor"] = {"family": "report", "shape": "collapse",
                              "lead_s": f["precursor_lead_s"]} if f["role"] != "silent" else None
        return
    srng = np.random.default_rng([seed, 30])
    t0 = float(t[0])
    precs = sorted((draw_precursor(srng, family, gpus) for _ in range(early)),
                   key=lambda p: -p["lead_s"])
    n_early = sum(f["role"] == "early" for f in failures)
    silent = sum(f["role"] == "silent" for f in failures)
    for f in failures:
        f["role"], f["precursor"] = "late", None
        f["precursor_onset"], f["precursor_lead_s"] = f["xid_time"], 0.0
    free = list(srng.permutation(len(failures)))
    for p in precs[:n_early]:
        room = [i for i in free if failures[i]["xid_time"] - t0 >= p["lead_s"] + 3600.0]
        i = room[0] if room else max(free, key=lambda j: failures[j]["xid_time"])
        f = failures[i]
        free.remove(i)
        p["lead_s"] = min(p["lead_s"], f["xid_time"] - t0 - 3600.0)
        f.update(role="early", precursor=p, precursor_lead_s=p["lead_s"],
                 precursor_onset=f["xid_time"] - p["lead_s"], gpu=p["gpu"])
        apply_precursor(fx, p, f["node_index"], t, f["precursor_onset"], f["xid_time"],
                        f["xid_time"] + 1200.0, srng)
    for i in free[:silent]:
        failures[i]["role"] = "silent"
