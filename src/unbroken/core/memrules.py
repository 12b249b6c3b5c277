"""GPU memory and thermal rules: remapped-row trends, temperatures, clock-event reasons.

Why trends and not only events: in the Backend.AI report (backendai.md §4) gpu122's
uncorrectable remapped rows stepped up together with XID 94 until the GPU died, and gpu124
accumulated **254 correctable remaps over 55 days with zero XIDs** before it vanished from the
host — no single sample is alarming, the growth is. The thresholds are Algalon's encoding of
the report (backendai.md §4), kept as they are so the findings match the alert rules that
``unbroken learn rules`` writes:

* any increase of uncorrectable remapped rows — critical (replace the GPU);
* ROW_REMAP_FAILURE > 0 — critical;
* a remap pending for 5 min — warning (schedule a GPU reset);
* correctable remapped rows growing by more than 8 in 24 h — warning;
* GPU above 85 °C for 5 min — warning; above 92 °C for 2 min — critical;
* HBM above 95 °C for 5 min — warning;
* a clock-event reason of HW slowdown, SW/HW thermal or HW power brake (bits 0x08, 0x20, 0x40,
  0x80: the reference's "bitmask >= 0x8") for 10 min — fail-slow warning.

Pure: (N, G, T) arrays and the scrape times in, a list of findings out (one per node, GPU and
rule, with the first time it held and how many separate episodes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unbroken.core.precursors import run_lengths

__all__ = ["Finding", "MemoryThermalPolicy", "memory_thermal_findings", "SLOWDOWN_BITS"]

SLOWDOWN_BITS = 0x08 | 0x20 | 0x40 | 0x80


@dataclass(frozen=True)
class MemoryThermalPolicy:
    corr_growth_24h: float = 8.0
    pending_s: float = 300.0
    gpu_warn_c: float = 85.0
    gpu_warn_s: float = 300.0
    gpu_crit_c: float = 92.0
    gpu_crit_s: float = 120.0
    hbm_warn_c: float = 95.0
    hbm_warn_s: float = 300.0
    slowdown_s: float = 600.0


@dataclass(frozen=True)
class Finding:
    node: int
    gpu: int
    rule: str
    severity: str        # "critical" or "warning"
    first: float         # time the rule first held
    episodes: int
    detail: str


def _held(cond: np.ndarray, need_s: float, dt: float) -> np.ndarray:
    """(N, G, T) bool: ``cond`` has held for ``need_s`` (in whole scrapes, at least one)."""
    k = max(1, int(round(need_s / dt)))
    N, G, T = cond.shape
    return (run_lengths(cond.reshape(N * G, T)) >= k).reshape(N, G, T)


def _collect(out: list, hit: np.ndarray, t: np.ndarray, rule: str, severity: str, detail) -> None:
    N, G, T = hit.shape
    for n, g in zip(*np.nonzero(hit.any(axis=2))):
        row = hit[n, g]
        first = int(np.argmax(row))
        eps = int(np.sum(np.diff(np.concatenate([[0], row.astype(np.int8)])) == 1))
        out.append(Finding(int(n), int(g), rule, severity, float(t[first]), eps,
                           detail(int(n), int(g), first)))


def memory_thermal_findings(t: np.ndarray, *, uncorr=None, corr=None, remap_failure=None,
                            pending=None, gpu_temp=None, mem_temp=None, clock=None,
                            policy: MemoryThermalPolicy = MemoryThermalPolicy()) -> list[Finding]:
    """Every rule that held, on every (node, GPU). Absent inputs are skipped; NaN never
    satisfies a rule."""
    dt = float(t[1] - t[0]) if len(t) > 1 else 30.0
    out: list[Finding] = []
    with np.errstate(invalid="ignore"):
        if uncorr is not None:
            filled = _ffill(uncorr)
            up = np.zeros_like(filled, bool)
            up[..., 1:] = filled[..., 1:] > filled[..., :-1]
            _collect(out, up, t, "uncorrectable_remap", "critical",
                     lambda n, g, i: f"uncorrectable remapped rows rose to {filled[n, g, i]:g}")
        if remap_failure is not None:
            _collect(out, remap_failure > 0, t, "remap_failure", "critical",
                     lambda n, g, i: "row remap failure")
        if pending is not None:
            _collect(out, _held(pending > 0, policy.pending_s, dt), t, "remap_pending",
                     "warning", lambda n, g, i: "remap pending >= 5 min: schedule a GPU reset")
        if corr is not None:
            filled = _ffill(corr)
            lag = max(1, int(round(86400.0 / dt)))
            T = filled.shape[-1]
            base = filled[..., :1] if T <= lag else None
            grow = np.empty_like(filled)
            if T > lag:
                grow[..., lag:] = filled[..., lag:] - filled[..., :-lag]
                grow[..., :lag] = filled[..., :lag] - filled[..., :1]
            else:
                grow[...] = filled - base
            span_d = max((t[-1] - t[0]) / 86400.0, 1e-9)
            total = np.nan_to_num(filled[..., -1] - filled[..., 0])
            _collect(out, grow > policy.corr_growth_24h, t, "correctable_remap_growth",
                     "warning", lambda n, g, i: f"correctable remapped rows +"
                     f"{total[n, g]:g} in {span_d:.1f} days ({total[n, g] / span_d:.1f}/day)")
        if gpu_temp is not None:
            _collect(out, _held(gpu_temp > policy.gpu_crit_c, policy.gpu_crit_s, dt), t,
                     "gpu_temp_critical", "critical",
                     lambda n, g, i: f"GPU above {policy.gpu_crit_c:g} C for 2 min")
            _collect(out, _held(gpu_temp > policy.gpu_warn_c, policy.gpu_warn_s, dt), t,
                     "gpu_temp_high", "warning",
                     lambda n, g, i: f"GPU above {policy.gpu_warn_c:g} C for 5 min")
        if mem_temp is not None:
            _collect(out, _held(mem_temp > policy.hbm_warn_c, policy.hbm_warn_s, dt), t,
                     "hbm_temp_high", "warning",
                     lambda n, g, i: f"HBM above {policy.hbm_warn_c:g} C for 5 min")
        if clock is not None:
            bits = np.where(np.isfinite(clock), clock, 0).astype(np.int64) & SLOWDOWN_BITS
            _collect(out, _held(bits != 0, policy.slowdown_s, dt), t, "clock_events_slowdown",
                     "warning", lambda n, g, i: f"clock-event reasons 0x"
                     f"{int(np.nan_to_num(clock[n, g, i])):x} for 10 min: fail-slow")
    return sorted(out, key=lambda f: (f.severity != "critical", f.first))


def _ffill(x: np.ndarray) -> np.ndarray:
    """Carry the last finite value forward (a counter absent for a scrape has not reset)."""
    x = np.asarray(x, float)
    idx = np.where(np.isfinite(x), np.arange(x.shape[-1]), 0)
    np.maximum.accumulate(idx, axis=-1, out=idx)
    return np.take_along_axis(x, idx, axis=-1)
