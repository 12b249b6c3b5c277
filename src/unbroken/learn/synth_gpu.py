"""The dcgm-exporter side of the synthetic cluster: per-GPU gauges and error counters.

Why apart from ``learn.synth``: the GPU metrics are where most precursor shapes land (a GPU
drifting hot, losing power or clock, leaking memory, throwing correctable errors), and they
follow one physical story that is easier to read in one place: utilisation follows the job's
activity; power and SM clock follow utilisation (a stalled GPU idles its power and clock
together); temperature follows the activity with a slow per-GPU noise; memory in use is the
model's footprint while the node is in a running session; ECC and PCIe counters grow by rare
Poisson events, a few GPUs chronically faster, with now and then a healthy burst (so that one
burst is not yet a precursor).

Every per-GPU array is (N, G, T). Deviations (precursors, the failure's own signature) come in
through ``synth_shapes.Effects``; hiccups through the node's ``gpu`` family factor.
"""

from __future__ import annotations

import numpy as np
from scipy.signal import lfilter

from unbroken.learn import names as M
from unbroken.learn.synth_shapes import Effects

__all__ = ["gpu_metrics", "ar1"]

DAY = 86400.0
IDLE_W, BUSY_W = 90.0, 690.0           # H100/B200-like board power, W
IDLE_MHZ, BUSY_MHZ = 345.0, 1980.0
FB_TOTAL = 81559.0                     # MiB


def ar1(rng, shape, phi, sigma):
    e = rng.standard_normal(shape) * sigma * np.sqrt(1 - phi * phi)
    return lfilter([1.0], [1.0, -phi], e, axis=-1)


def _errors(rng, N, G, T, dt, per_day, chronic_share, chronic_per_day, bursts_per_day,
            burst_mean):
    """Increments per scrape of a rare-error counter: background Poisson events, a few GPUs
    chronically faster, and healthy single-scrape bursts."""
    lam = np.full((N, G, 1), per_day * dt / DAY)
    chronic = rng.random((N, G)) < chronic_share
    lam[chronic, 0] = rng.uniform(*chronic_per_day, size=int(chronic.sum())) * dt / DAY
    inc = rng.poisson(np.broadcast_to(lam, (N, G, T))).astype(float)
    n_b = rng.poisson(bursts_per_day * T * dt / DAY, (N, G))
    for (n, g) in zip(*np.nonzero(n_b)):
        at = rng.integers(T, size=n_b[n, g])
        inc[n, g, at] += 1 + rng.geometric(1 / burst_mean, size=len(at))
    return inc


def gpu_metrics(rng, t, a, member_run, diurnal, gpu_fam, fx: Effects, failures, gone, G,
                put) -> tuple[np.ndarray, list[dict]]:
    """Write the dcgm series through ``put(name, gpu_label, (N, T) array)``; returns the
    temperature array (for the findings) and the findings (quiet nodes with a known rule)."""
    N, T = a.shape
    dt = float(t[1] - t[0])
    A = a[:, None, :]
    util = np.clip(97 * A * gpu_fam[:, None, :] + rng.normal(0, 1.5, (N, G, T)) * A, 0, 100)
    util = np.clip(util * fx.mul_of("gpu_util"), 0, 100)
    temp = (38 + 32 * A * diurnal) + rng.normal(0, 1.5, (N, G, 1)) + ar1(rng, (N, G, T), 0.95,
                                                                         1.2)
    temp = temp * (0.6 + 0.4 * gpu_fam[:, None, :]) + fx.add_of("gpu_temp")
    u = util / 100.0
    power = (IDLE_W + (BUSY_W - IDLE_W) * u * np.exp(rng.normal(0, 0.03, (N, G, 1)))) \
        * np.exp(ar1(rng, (N, G, T), 0.9, 0.02)) * fx.mul_of("power")
    sm = (IDLE_MHZ + (BUSY_MHZ - IDLE_MHZ) * np.minimum(u / 0.9, 1.0)
          * np.exp(rng.normal(0, 0.01, (N, G, 1)))) * np.exp(ar1(rng, (N, G, T), 0.8, 0.01)) \
        * fx.mul_of("sm_clock")
    fb = member_run[:, None, :] * (60000 + 11000 * A + rng.normal(0, 400, (N, G, 1))
                                   + ar1(rng, (N, G, T), 0.99, 150)) + fx.add_of("fb_used")
    fb = np.clip(fb, 0, FB_TOTAL)
    sbe = _errors(rng, N, G, T, dt, 0.2, 0.03, (5, 50), 0.03, 4) + fx.burst.get("ecc_sbe", 0)
    pcie = _errors(rng, N, G, T, dt, 1.0, 0.02, (10, 100), 0.05, 6) \
        + fx.burst.get("pcie_replay", 0)
    dbe = np.zeros((N, G, T))
    clock = np.repeat(np.where(A > 0.5, 0.0, 1.0), G, axis=1)
    corr = np.broadcast_to(rng.integers(0, 3, (N, G, 1)).astype(float), (N, G, T)).copy()
    gpu_gone = np.zeros((N, G, T), bool)
    xid_g = np.zeros((N, G, T))
    uncorr = np.zeros((N, G, T))
    pending = np.zeros((N, G, T))
    for f in failures:
        n, g, x = f["node_index"], f["gpu"], f["xid_time"]
        after = t >= x
        xid_g[n, g, after & (t < x + 1200.0)] = f["xid"]
        if f["type"] == "bus":
            gpu_gone[n, g, after] = True
        if f["type"] in ("ecc", "memory"):
            dbe[n, g, np.argmax(after) if after.any() else T - 1] += 1
        if f["type"] == "memory":   # uncorrectable remaps stepping up in the hours before (gpu122)
            for h in sorted(rng.uniform(1, 12, size=3))[::-1]:
                ts = x - h * 3600.0
                uncorr[n, g, t >= ts] += 1
                pending[n, g, (t >= ts) & (t < ts + 600)] = 1
            f["remap_steps"] = 3
    for f in failures:              # a replaced GPU comes back clean
        n, g = f["node_index"], f["gpu"]
        back = t >= f["xid_time"] + 1200.0
        uncorr[n, g, back] = 0
        gpu_gone[n, g, back & ~gone[n]] = False

    failing = {f["node_index"] for f in failures}
    quiet = [n for n in rng.permutation(N) if n not in failing]
    findings = []
    n = int(quiet[0])               # gpu124: correctable remaps growing without an XID
    for ts in np.sort(rng.uniform(t[0], t[-1], size=int(12 * (t[-1] - t[0] + dt) / DAY))):
        corr[n, 0, t >= ts] += 1
    findings.append(dict(node_index=n, gpu=0, rule="correctable_remap_growth", per_day=12.0))
    n = int(quiet[1])               # a hot GPU: bouts above 85 C
    for ts in rng.uniform(t[0], t[-1] - 3600, size=3):
        temp[n, 0, (t >= ts) & (t < ts + 480)] = 90 + rng.normal(0, 0.5)
    findings.append(dict(node_index=n, gpu=0, rule="gpu_temp_high"))
    n = int(quiet[2])               # a fail-slow GPU: HW thermal slowdown for 20-minute bouts
    for ts in rng.uniform(t[0], t[-1] - 3600, size=2):
        clock[n, 1 % G, (t >= ts) & (t < ts + 1200)] = 0x40
    findings.append(dict(node_index=n, gpu=1 % G, rule="clock_events_slowdown"))
    for f in failures:
        if f["type"] == "memory":
            findings.append(dict(node_index=f["node_index"], gpu=f["gpu"],
                                 rule="uncorrectable_remap"))

    counters = {M.ECC_SBE: sbe, M.ECC_DBE: dbe, M.PCIE_REPLAY: pcie}
    start = {M.ECC_SBE: rng.integers(0, 50, (N, G, 1)), M.ECC_DBE: np.zeros((N, G, 1)),
             M.PCIE_REPLAY: rng.integers(0, 500, (N, G, 1))}
    for g in range(G):
        gl = str(g)
        for name, arr in ((M.GPU_TEMP, np.round(temp)), (M.MEM_TEMP, np.round(temp + 8)),
                          (M.GPU_UTIL, np.round(util)), (M.CLOCK_EVENTS, clock),
                          (M.XID, xid_g), (M.REMAP_UNCORR, uncorr), (M.REMAP_CORR, corr),
                          (M.REMAP_FAILURE, np.zeros((N, G, T))), (M.REMAP_PENDING, pending),
                          (M.POWER, np.round(power, 1)), (M.SM_CLOCK, np.round(sm)),
                          (M.FB_USED, np.round(fb)),
                          *((k, np.cumsum(v, axis=-1) + start[k]) for k, v in counters.items())):
            v = np.array(arr[:, g, :], float)
            v[gpu_gone[:, g, :]] = np.nan
            put(name, gl, v)
    return temp, findings
