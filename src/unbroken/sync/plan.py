"""``unbroken plan --stragglers SPEC``: each sync mode's update gap and TTA for a straggler
profile, and what ``auto`` would do on it -- with the selector code ``auto`` runs.

The profile (``sync.trace``) gives every group's slowdown on every step; a group's step
time is compute x slowdown + the all-reduce (a straggler's CPU or NIC contention slows its own
part, not the collective). The trace is cut into windows of 30 steps (the predictor's
horizon); on each window every mode is estimated by ``core.sync.estimates`` from the window's
mean per-group time -- what a perfect predictor would hand the selector -- and ``auto`` is
played through the windows with ``core.sync.decide`` fed that same oracle prediction, paying
each window the TTA of the mode it was in. Sync's real cost on the trace (the mean over steps of
the slowest group, which window means understate when the slow group moves) is reported next
to it. TTA is in seconds of wall time to make the progress of the trace's steps of sync
without stragglers, i.e. sum over windows of 30 x (s per sync-equivalent step). Pure apart
from reading a CSV spec: numpy and ``core`` only, no torch.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from unbroken.core.sync import AutoState, CostModel, decide, estimates, select, tta_of
from unbroken.sync.trace import straggler_frequency
from unbroken.runtime.stragglers import load_trace

__all__ = ["straggler_plan", "WINDOW"]

WINDOW = 30
_FAMILIES = ("sync", "mask", "ksync", "groups", "async")


def straggler_plan(spec: str, groups: int, steps: int, t_compute: float, t_allreduce: float,
                   cm: CostModel, seed: int = 0) -> dict:
    """The plan as plain data (what ``--json`` prints)."""
    t0 = time.perf_counter()
    # the runtime's own parser and trace (``--stragglers`` means the same to run and to plan)
    slow = np.asarray(load_trace(spec, groups).matrix(steps, seed), dtype=float)
    times = t_compute * slow + t_allreduce
    fams: dict[str, dict] = {f: {"tta_s": 0.0, "gap_s": [], "modes": Counter()} for f in _FAMILIES}
    state, auto_s, switches, reasons, used = AutoState(), 0.0, 0, [], Counter()
    ideal = 0.0
    for lo in range(0, steps, WINDOW):
        win = times[lo:lo + WINDOW]
        n = win.shape[0]
        mean = win.mean(axis=0)
        est = estimates(mean, cm)
        for f in _FAMILIES:
            fams[f]["tta_s"] += n * est[f].tta
            fams[f]["gap_s"].append(est[f].gap)
            fams[f]["modes"][est[f].mode] += 1
        d = decide(state, mean, cm, confirm=1)
        state = d.state
        auto_s += n * tta_of(d.mode, mean, cm)
        used[d.mode] += n
        ideal += n * float(cm.stretch(t_compute + t_allreduce, groups))
        if d.switched:
            switches += 1
            reasons.append(f"step {lo}: {d.reason}")
    sync_s = fams["sync"]["tta_s"]
    modes = {}
    for f, v in fams.items():
        label = v["modes"].most_common(1)[0][0]
        modes[f] = {"mode": label if len(v["modes"]) == 1 else f"{label} (most windows)",
                    "gap_s": _finite(np.mean(v["gap_s"])), "tta_s": _finite(v["tta_s"]),
                    "vs_sync": _finite(v["tta_s"] / sync_s)}
    best = min(modes, key=lambda f: (fams[f]["tta_s"], _FAMILIES.index(f)))
    whole = select(times.mean(axis=0), cm)
    return {
        "stragglers": spec, "kind": spec.split(":", 1)[0] if ":" in spec else "csv",
        "groups": groups, "steps": steps,
        "t_compute": t_compute, "t_allreduce": t_allreduce, "noise_scale": cm.noise_scale,
        "shard_batch": cm.shard_batch, "redundancy": cm.redundancy, "cores": cm.cores,
        "staleness_cost": cm.staleness_cost, "window": WINDOW,
        "straggler_frequency": straggler_frequency(times),
        "sync_trace_s": float(cm.stretch(times, groups).max(axis=1).sum()),
        "straggler_free_s": ideal,
        "modes": modes, "best_static": best,
        "auto": {"tta_s": auto_s, "vs_sync": auto_s / sync_s, "switches": switches,
                 "steps_in_mode": dict(used), "reasons": reasons[:20]},
        "selection": {"mode": whole.mode, "reason": whole.reason},
        "wall_s": time.perf_counter() - t0,
    }


def _finite(v: float) -> float | None:
    """None for a mode that cannot run on some window (JSON has no infinity)."""
    return float(v) if np.isfinite(v) else None


def _num(v: float | None, fmt: str, unit: str = "") -> str:
    return "n/a" if v is None else f"{v:{fmt}}{unit}"


def plan_lines(p: dict) -> list[str]:
    """The terminal view (the plan table's style: one row per mode)."""
    lines = [f"Straggler plan: {p['stragglers']} on {p['groups']} groups, {p['steps']} steps "
             f"of {p['t_compute']:g} s compute + {p['t_allreduce']:g} s all-reduce; noise "
             f"scale {p['noise_scale']:g} samples, B = {p['shard_batch']}, r = "
             f"{p['redundancy']}; straggler frequency {p['straggler_frequency']:.0%}"
             + (f"; the groups share {p['cores']} cores" if p.get("cores") else ""),
             f"{'mode':<24}{'update gap':>12}{'TTA':>14}{'vs sync':>9}"]
    for f, m in p["modes"].items():
        mark = "  <- best static" if f == p["best_static"] else ""
        lines.append(f"{m['mode']:<24}{_num(m['gap_s'], '.3f', ' s'):>12}"
                     f"{_num(m['tta_s'], '.1f', ' s'):>14}{_num(m['vs_sync'], '.2f'):>9}{mark}")
    a = p["auto"]
    lines.append(f"{'auto':<24}{'':>12}{a['tta_s']:>12.1f} s{a['vs_sync']:>9.2f}  "
                 f"{a['switches']} switch(es): "
                 + ", ".join(f"{k} {v} steps" for k, v in a["steps_in_mode"].items()))
    lines.append(f"straggler-free: {p['straggler_free_s']:.1f} s; sync on the real trace "
                 f"(slowest group each step): {p['sync_trace_s']:.1f} s")
    lines.append(f"selector on the whole profile: {p['selection']['reason']}")
    return lines
