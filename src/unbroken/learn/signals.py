"""From raw series to the detector's signals: rates from counters, one value per node or GPU.

Why here and not in core: which exporter metric stands for "interrupts" or "NFS latency", how a
counter becomes a rate, and which way a change is bad, is knowledge of node_exporter and
dcgm-exporter, not a decision. The detector (``core.changepoint``) sees only named (U, T)
arrays of *units* (a node, or one GPU of a node), each unit's node, the signal's family, its
floor and the sides that count.

Signals (family; floor — the smallest scale a z-score divides by, so a quiet cluster's rounding
is not an anomaly; sides):

node units
* ``interrupts``  — rate of ``node_intr_total`` per second (interrupts; 500/s; both)
* ``procs_running`` — ``node_procs_running`` (processes; 2; both)
* ``pageouts`` — rate of ``node_vmstat_pgpgout`` per second (memory; 20/s; both)
* ``nfs_getattr_latency`` — NFS GETATTR request time per request, s (nfs; 2 ms; both)
* ``net_rx`` — rate of ``node_network_receive_bytes_total``, B/s, all devices (network;
  10 MB/s; both): the job's throughput as the node sees it

GPU units (every GPU against every GPU of the peers: a node's 8 GPUs are 8 units, so one GPU
going wrong is not averaged away by its 7 neighbours)
* ``gpu_util`` — % (gpu_load; 5 %; both)
* ``power`` — W (gpu_load; 10 W; both)
* ``sm_clock`` — MHz (gpu_load; 15 MHz; both)
* ``gpu_temp`` / ``mem_temp`` — °C (gpu_thermal; 1 °C; both)
* ``fb_used`` — MiB in use (gpu_memory; 256 MiB; both)
* ``ecc_sbe`` / ``ecc_dbe`` / ``pcie_replay`` — correctable and uncorrectable ECC errors, PCIe
  replays, counted over the last 10 min (gpu_errors; 1; up only): rare events come in bursts
  minutes apart, so a scrape's increase is mostly zero even when the rate has risen

A counter that goes down (an exporter restart) gives NaN for that scrape, not a negative rate.
``BAND_SIGNALS`` are the six node signals of the peer-band rules (``learn rules``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from unbroken.learn import names as M
from unbroken.learn.frame import Frame

__all__ = ["SIGNALS", "BAND_SIGNALS", "Signals", "build_signals", "rate", "window_increase",
           "ERROR_WINDOW_S"]

# name -> (family, floor, sides)
SIGNALS = {
    "interrupts": ("interrupts", 500.0, "both"),
    "procs_running": ("processes", 2.0, "both"),
    "pageouts": ("memory", 20.0, "both"),
    "nfs_getattr_latency": ("nfs", 0.002, "both"),
    "net_rx": ("network", 1e7, "both"),
    "gpu_util": ("gpu_load", 5.0, "both"),
    "power": ("gpu_load", 10.0, "both"),
    "sm_clock": ("gpu_load", 15.0, "both"),
    "gpu_temp": ("gpu_thermal", 1.0, "both"),
    "mem_temp": ("gpu_thermal", 1.0, "both"),
    "fb_used": ("gpu_memory", 256.0, "both"),
    "ecc_sbe": ("gpu_errors", 1.0, "up"),
    "ecc_dbe": ("gpu_errors", 1.0, "up"),
    "pcie_replay": ("gpu_errors", 1.0, "up"),
}
# the peer-band rules' signals: name -> (family, floor)
BAND_SIGNALS = {
    "interrupts": ("interrupts", 500.0),
    "procs_running": ("processes", 2.0),
    "pageouts": ("memory", 20.0),
    "nfs_getattr_latency": ("nfs", 0.002),
    "gpu_util_min": ("gpu", 5.0),
    "gpu_temp_max": ("gpu", 3.0),
}
ERROR_WINDOW_S = 600.0
_GPU = {"gpu_util": M.GPU_UTIL, "power": M.POWER, "sm_clock": M.SM_CLOCK,
        "gpu_temp": M.GPU_TEMP, "mem_temp": M.MEM_TEMP, "fb_used": M.FB_USED}
_GPU_ERRORS = {"ecc_sbe": M.ECC_SBE, "ecc_dbe": M.ECC_DBE, "pcie_replay": M.PCIE_REPLAY}


@dataclass
class Signals:
    values: dict[str, np.ndarray]     # name -> (U, T) per unit
    family: dict[str, str]
    floor: dict[str, float]
    present: np.ndarray               # (N, T) bool: the node reported at that scrape
    sides: dict[str, str]             # "both" or "up"
    node_of: dict[str, np.ndarray]    # name -> (U,) node index of each unit
    unit: dict[str, list[str]]        # name -> the unit's label ('' for a node, else the GPU)


def rate(counter: np.ndarray, dt: float) -> np.ndarray:
    """Per-second increase between consecutive scrapes; NaN at the first scrape, after a gap
    and where the counter went down."""
    d = np.full_like(counter, np.nan, dtype=float)
    with np.errstate(invalid="ignore"):
        d[..., 1:] = np.diff(counter, axis=-1) / dt
        d[d < 0] = np.nan
    return d


def window_increase(counter: np.ndarray, dt: float, window_s: float = ERROR_WINDOW_S
                    ) -> np.ndarray:
    """Increase over the last ``window_s`` (PromQL's ``increase``): the per-scrape increases
    summed, a reset or gap counting as zero; NaN where the counter is absent."""
    inc = np.nan_to_num(rate(counter, dt) * dt, nan=0.0)
    c = np.cumsum(inc, axis=-1)
    w = max(1, int(round(window_s / dt)))
    out = c.copy()
    out[..., w:] -= c[..., :-w]
    out[~np.isfinite(counter)] = np.nan
    return out


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def _gpu_units(frame: Frame, name: str):
    labs = frame.labels(name)
    x = frame.stack(name)                        # (L, N, T)
    L, N, T = x.shape
    units = np.transpose(x, (1, 0, 2)).reshape(N * L, T)
    return units, np.repeat(np.arange(N), L), [lab for _ in range(N) for lab in labs]


def build_signals(frame: Frame, band: bool = False) -> Signals:
    """The detector's signals (``band``: the peer-band rules' six node signals instead)."""
    dt = frame.dt
    N, T = len(frame.nodes), len(frame.t)
    v: dict[str, np.ndarray] = {}
    node_of: dict[str, np.ndarray] = {}
    unit: dict[str, list[str]] = {}
    if (x := frame.get(M.INTR)) is not None:
        v["interrupts"] = rate(x, dt)
    if (x := frame.get(M.PROCS)) is not None:
        v["procs_running"] = x
    if (x := frame.get(M.PGPGOUT)) is not None:
        v["pageouts"] = rate(x, dt)
    req, rtt = frame.get(M.NFS_REQ, "GETATTR"), frame.get(M.NFS_RTT, "GETATTR")
    if req is not None and rtt is not None:
        v["nfs_getattr_latency"] = _ratio(rate(rtt, dt), rate(req, dt))
    if band:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            if (x := frame.stack(M.GPU_UTIL)) is not None:
                v["gpu_util_min"] = np.nanmin(x, axis=0)
            if (x := frame.stack(M.GPU_TEMP)) is not None:
                v["gpu_temp_max"] = np.nanmax(x, axis=0)
        table = {k: (*BAND_SIGNALS[k], "both") for k in v}
    else:
        if (x := frame.get(M.NET_RX)) is not None:
            v["net_rx"] = rate(x, dt)
        for name, metric in (*_GPU.items(), *_GPU_ERRORS.items()):
            if frame.labels(metric):
                units, node_of[name], unit[name] = _gpu_units(frame, metric)
                v[name] = window_increase(units, dt) if name in _GPU_ERRORS else units
        table = {k: SIGNALS[k] for k in v}
    for k in v:
        if k not in node_of:
            node_of[k], unit[k] = np.arange(N), [""] * N
    present = np.zeros((N, T), bool)
    for arr in frame.series.values():
        present |= np.isfinite(arr)
    return Signals(values=v, family={k: table[k][0] for k in v},
                   floor={k: table[k][1] for k in v}, present=present,
                   sides={k: table[k][2] for k in v}, node_of=node_of, unit=unit)
