"""From raw series to the detector's signals: rates from counters, one value per node.

Why here and not in core: which exporter metric stands for "interrupts" or "NFS latency", and
how a counter becomes a rate, is knowledge of node_exporter and dcgm-exporter, not a decision.
The detector (``core.precursors``) sees only named (N, T) arrays, their families and floors.

Signals (family, floor — the smallest scale a z-score divides by, so a quiet cluster's rounding
is not an anomaly):

* ``interrupts``  — rate of ``node_intr_total`` per second (interrupts; 500/s)
* ``procs_running`` — ``node_procs_running`` (processes; 2)
* ``pageouts`` — rate of ``node_vmstat_pgpgout`` per second (memory; 20/s)
* ``nfs_getattr_latency`` — NFS GETATTR request time per request, s (nfs; 2 ms)
* ``gpu_util_min`` — the node's least busy GPU, % (gpu; 5 %)
* ``gpu_temp_max`` — the node's hottest GPU, °C (gpu; 3 °C)

A counter that goes down (an exporter restart) gives NaN for that scrape, not a negative rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unbroken.learn import names as M
from unbroken.learn.frame import Frame

__all__ = ["SIGNALS", "Signals", "build_signals", "rate"]

# name -> (family, floor)
SIGNALS = {
    "interrupts": ("interrupts", 500.0),
    "procs_running": ("processes", 2.0),
    "pageouts": ("memory", 20.0),
    "nfs_getattr_latency": ("nfs", 0.002),
    "gpu_util_min": ("gpu", 5.0),
    "gpu_temp_max": ("gpu", 3.0),
}


@dataclass
class Signals:
    values: dict[str, np.ndarray]     # name -> (N, T)
    family: dict[str, str]
    floor: dict[str, float]
    present: np.ndarray               # (N, T) bool: the node reported at that scrape


def rate(counter: np.ndarray, dt: float) -> np.ndarray:
    """Per-second increase between consecutive scrapes; NaN at the first scrape, after a gap
    and where the counter went down."""
    d = np.full_like(counter, np.nan, dtype=float)
    with np.errstate(invalid="ignore"):
        d[:, 1:] = np.diff(counter, axis=1) / dt
        d[d < 0] = np.nan
    return d


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def build_signals(frame: Frame) -> Signals:
    dt = frame.dt
    N, T = len(frame.nodes), len(frame.t)
    v: dict[str, np.ndarray] = {}
    if (x := frame.get(M.INTR)) is not None:
        v["interrupts"] = rate(x, dt)
    if (x := frame.get(M.PROCS)) is not None:
        v["procs_running"] = x
    if (x := frame.get(M.PGPGOUT)) is not None:
        v["pageouts"] = rate(x, dt)
    req, rtt = frame.get(M.NFS_REQ, "GETATTR"), frame.get(M.NFS_RTT, "GETATTR")
    if req is not None and rtt is not None:
        v["nfs_getattr_latency"] = _ratio(rate(rtt, dt), rate(req, dt))
    with np.errstate(all="ignore"):
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            if (x := frame.stack(M.GPU_UTIL)) is not None:
                v["gpu_util_min"] = np.nanmin(x, axis=0)
            if (x := frame.stack(M.GPU_TEMP)) is not None:
                v["gpu_temp_max"] = np.nanmax(x, axis=0)
    present = np.zeros((N, T), bool)
    for arr in frame.series.values():
        present |= np.isfinite(arr)
    return Signals(values=v, family={k: SIGNALS[k][0] for k in v},
                   floor={k: SIGNALS[k][1] for k in v}, present=present)
