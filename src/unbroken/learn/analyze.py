"""``unbroken learn``: read the inputs, run the six analyses, return one plain result.

The analyses are ``core``'s (precursors, memrules, ckpt_io, history, measured); this module
only wires inputs to them:

1. precursors — signals (``learn.signals``) against session peers (``learn.sacct``
   membership), the peer-relative change detector (``core.changepoint``) with thresholds
   fitted on *other* clusters (``--detector FILE`` from ``learn fit``, else the file shipped
   with the package) — never on this input; scored against the XIDs (kernel log, else DCGM's
   XID gauge);
2. memory and thermal rules (``core.memrules``);
3. checkpoint phases and the I/O diagnosis (``core.ckpt_io``) from cluster-wide NFS rates;
4. exclusions: sacct's ``exclude=`` notes and the journal's evictions, else the XIDs whose
   action evicts (``core.xid.EVICT_AT_ONCE``);
5. retry chains (``core.history``);
6. the planner's numbers (``core.measured``).
"""

from __future__ import annotations

import argparse
import datetime as dt
from dataclasses import asdict, dataclass, field

import numpy as np

from unbroken.core import changepoint as C
from unbroken.core import ckpt_io, history, measured, memrules
from unbroken.core import precursors as P
from unbroken.core.xid import EVICT_AT_ONCE, action_for
from unbroken.learn import names as M
from unbroken.learn.detector import Detector, default_detector, read_detector
from unbroken.learn.evidence import live_mask
from unbroken.learn.frame import Frame
from unbroken.learn.kernlog import XidRecord
from unbroken.learn.signals import BAND_SIGNALS, Signals, build_signals, rate

__all__ = ["Inputs", "Context", "analyze", "analyze_command", "parse_time"]

XID_MERGE_S = 1800.0      # XIDs of one node this close are one failure


@dataclass
class Inputs:
    frame: Frame
    xids: list[XidRecord] = field(default_factory=list)
    attempts: list[history.Attempt] | None = None
    journal_exclusions: list[history.Exclusion] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sources: dict = field(default_factory=dict)


@dataclass
class Context:
    """What the HTML report draws (arrays, not JSON)."""
    frame: Frame
    signals: Signals
    live: np.ndarray
    evidence: dict            # signal -> (N, T) CUSUM of the node's worst unit
    detection: C.ChangeDetection
    cluster: dict


def parse_time(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected an ISO time (2026-11-01T00:00:00Z) or "
                         f"epoch seconds") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


def _failures_from_xids(xids: list[XidRecord], nodes: list[str]) -> list[dict]:
    out: list[dict] = []
    last: dict[str, float] = {}
    for x in sorted(xids, key=lambda r: r.time):
        if x.code == 0:
            continue
        if x.node in last and x.time - last[x.node] < XID_MERGE_S:
            continue
        last[x.node] = x.time
        out.append({"node": x.node, "xid_time": x.time, "xid": x.code, "action": x.action,
                    "pci": x.pci, "in_metrics": x.node in nodes})
    return out


def _xids_from_gauge(frame: Frame) -> list[XidRecord]:
    out = []
    for lab in frame.labels(M.XID):
        arr = np.nan_to_num(frame.series[(M.XID, lab)])
        prev = np.zeros_like(arr)
        prev[:, 1:] = arr[:, :-1]
        for n, i in zip(*np.nonzero((arr != 0) & (arr != prev))):
            code = int(arr[n, i])
            out.append(XidRecord(frame.nodes[n], float(frame.t[i]), code, f"gpu{lab}",
                                 action_for(code)[0]))
    return out


def _nansum0(x: np.ndarray) -> np.ndarray:
    return np.nansum(x, axis=0)


def _cluster_io(frame: Frame) -> dict:
    """Cluster-wide NFS rates and mean GPU utilisation per scrape (for core.ckpt_io)."""
    dt_ = frame.dt
    T = len(frame.t)
    out = {"write_Bps": np.zeros(T), "read_Bps": np.zeros(T), "util_mean": None,
           "write_queue_share": None, "read_queue_share": None}
    for key, name, op in (("write_Bps", M.NFS_SENT, "WRITE"), ("read_Bps", M.NFS_RECV, "READ")):
        x = frame.get(name, op)
        if x is not None:
            out[key] = _nansum0(rate(x, dt_))
    for key, op in (("write_queue_share", "WRITE"), ("read_queue_share", "READ")):
        q, r = frame.get(M.NFS_QUEUE, op), frame.get(M.NFS_RTT, op)
        if q is not None and r is not None:
            with np.errstate(invalid="ignore", divide="ignore"):
                num, den = _nansum0(rate(q, dt_)), _nansum0(rate(r, dt_))
                out[key] = np.where(den > 0, num / den, np.nan)
    u = frame.stack(M.GPU_UTIL)
    if u is not None:
        with np.errstate(invalid="ignore"):
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                out["util_mean"] = np.nanmean(u.reshape(-1, T), axis=0)
    return out


def _gpu_arrays(frame: Frame, name: str):
    labs = frame.labels(name)
    if not labs and name == M.CLOCK_EVENTS:
        return _gpu_arrays(frame, M.CLOCK_EVENTS_NEW)
    if not labs:
        return None, []
    return np.stack([frame.series[(name, lab)] for lab in labs], axis=1), labs


def _precursors(sig: Signals, live: np.ndarray, t: np.ndarray, dt: float, det_file: Detector,
                failures: list[dict], idx: dict, warnings: list[str]):
    """1. the change detector (thresholds from the file) on the signals both know; scored."""
    pol = det_file.policy
    known = [s for s in sig.values if s in pol.thresholds]
    if not known:
        raise ValueError(f"--detector {det_file.source}: none of its signals "
                         f"({', '.join(sorted(pol.thresholds))}) is in the input")
    missing = sorted(set(pol.thresholds) - set(sig.values))
    if missing:
        warnings.append(f"detector: signals not in the input, left out: {', '.join(missing)}")
    if abs(dt - det_file.scrape_s) > 0.5:
        warnings.append(f"detector fitted at {det_file.scrape_s:g} s scrapes, input at {dt:g} s:"
                        f" its thresholds add up per scrape; refit with 'learn fit' at this "
                        f"interval for comparable false alarms")
    meta = det_file.signals
    det, ev = C.detect_change(
        {s: sig.values[s] for s in known}, sig.node_of, live,
        {s: meta.get(s, {}).get("floor", sig.floor[s]) for s in known},
        {s: meta.get(s, {}).get("sides", sig.sides[s]) for s in known},
        {s: meta.get(s, {}).get("family", sig.family[s]) for s in known}, pol)
    scored = [f for f in failures if f["node"] in idx]
    sc = P.score(det, t, [P.Failure(idx[f["node"]], f["xid_time"]) for f in scored])
    out = []
    for f, d, lead, fired in zip(scored, sc.detected, sc.lead_s, sc.fired):
        out.append({**f, "detected_time": d, "lead_s": lead, "fired": fired,
                    "detected": d is not None, "before_xid": lead is not None and lead > 0})
    out += [{**f, "detected_time": None, "lead_s": None, "fired": [], "detected": False,
             "before_xid": False} for f in failures if f["node"] not in idx]
    fo = det_file.fitted_on
    desc = {"kind": "peer-cusum", "source": det_file.source, "sha256": det_file.sha256,
            "reason": f"fitted out of sample on {len(fo.get('clusters', []))} synthetic "
                      f"clusters ({', '.join(fo.get('families', []))}): "
                      f"{fo.get('reason', '?')}",
            "policy": asdict(pol), "signals_used": known, "signals_missing": missing,
            "scrape_s": det_file.scrape_s,
            "fitted_on": {k: v for k, v in fo.items() if k != "grid"},
            "rules": {**asdict(det_file.rules), "band": list(det_file.rules.band),
                      "scrape_s": dt, "signals": {k: {"family": f, "floor": fl}
                                                   for k, (f, fl) in BAND_SIGNALS.items()}}}
    return det, ev, sc, out, desc


def analyze(inp: Inputs, detector: Detector | None = None) -> tuple[dict, Context]:
    frame = inp.frame
    nodes, t = frame.nodes, frame.t
    warnings = list(inp.warnings) + list(frame.warnings)
    if len(t) < 2:
        raise ValueError("the time range holds fewer than two scrapes: nothing to analyse")
    days = (t[-1] - t[0] + frame.dt) / 86400.0
    sig = build_signals(frame)
    if not sig.values:
        raise ValueError("none of the detector's metrics (node_exporter interrupts, processes, "
                         "page-outs, NFS GETATTR, network; DCGM GPU util/power/clock/"
                         "temperature/memory/ECC/PCIe) is in the input")
    live, w = live_mask(sig, nodes, t, inp.attempts)
    if w:
        warnings.append(w)
    if len(nodes) < 4:
        warnings.append(f"only {len(nodes)} nodes: the detector needs a node and at least 3 "
                        f"live peers; precursor detection skipped")

    xids = inp.xids if inp.xids else _xids_from_gauge(frame)
    failures = _failures_from_xids(xids, nodes)
    idx = {n: i for i, n in enumerate(nodes)}

    # 1. precursors
    det, ev, sc, fail_out, desc = _precursors(sig, live, t, frame.dt,
                                              detector or default_detector(), failures, idx,
                                              warnings)

    # 2. memory and thermal
    arrs = {k: _gpu_arrays(frame, name)[0] for k, name in (
        ("uncorr", M.REMAP_UNCORR), ("corr", M.REMAP_CORR), ("remap_failure", M.REMAP_FAILURE),
        ("pending", M.REMAP_PENDING), ("gpu_temp", M.GPU_TEMP), ("mem_temp", M.MEM_TEMP),
        ("clock", M.CLOCK_EVENTS))}
    labels = {}
    for name in (M.GPU_TEMP, M.REMAP_UNCORR, M.CLOCK_EVENTS, M.GPU_UTIL):
        labels = labels or dict(enumerate(_gpu_arrays(frame, name)[1]))
    mem = memrules.memory_thermal_findings(t, **arrs)
    mem_out = [{"node": nodes[m.node], "gpu": labels.get(m.gpu, str(m.gpu)), "rule": m.rule,
                "severity": m.severity, "first": m.first, "episodes": m.episodes,
                "detail": m.detail} for m in mem]

    # 3. checkpoint I/O
    cl = _cluster_io(frame)
    phases = ckpt_io.segment(t, cl["write_Bps"], cl["read_Bps"], cl["util_mean"],
                             cl["write_queue_share"], cl["read_queue_share"])
    diag = ckpt_io.diagnose(phases, len(nodes))

    # 4. exclusions
    excl: list[history.Exclusion] = list(inp.journal_exclusions)
    if inp.attempts:
        for a in inp.attempts:
            excl += [history.Exclusion(n, a.end if a.end is not None else a.start, "sacct")
                     for n in a.excluded]
    if not excl:
        excl = [history.Exclusion(f["node"], f["xid_time"], "xid") for f in failures
                if f["action"] in EVICT_AT_ONCE]
    exs = history.exclusion_summary(excl, nodes)

    # 5. retry chains
    chains = history.retry_chains(inp.attempts or [])
    cs = history.chain_summary(chains)

    # 6. the planner's numbers
    gpus_per_node = max(len(frame.labels(M.GPU_UTIL)), len(frame.labels(M.GPU_TEMP)), 1)
    n_fail = len(chains) if chains else len(failures)
    recov = [c.recovered_at - c.failed_at for c in chains if c.recovered_at is not None]
    plan = measured.planner_numbers(
        float(t[-1] - t[0] + frame.dt), n_fail, recov,
        [p.duration for p in phases if p.kind == "load"],
        [p.duration for p in phases if p.kind == "save"], len(nodes) * gpus_per_node)

    data = {
        "action": "analyze", "sources": inp.sources,
        "nodes": len(nodes), "gpus_per_node": gpus_per_node, "scrape_s": frame.dt,
        "start": float(t[0]), "end": float(t[-1]), "days": days,
        "failures": fail_out, "detected": sc.n_detected, "before_xid": sc.before_xid,
        "false_alarms": [{"node": nodes[n], "start": a, "end": b} for n, a, b in sc.false_alarms],
        "false_alarms_per_day": sc.false_alarms_per_day,
        "detector": desc,
        "memory_thermal": mem_out,
        "checkpoint_phases": [{"kind": p.kind, "start": p.start, "end": p.end,
                               "duration_s": p.duration, "bytes": p.bytes,
                               "mean_Bps": p.mean_Bps, "peak_Bps": p.peak_Bps,
                               "share_of_max": p.share_of_max,
                               "queue_share": p.queue_share} for p in phases],
        "checkpoint_io": asdict(diag),
        "exclusions": exs, "exclusion_top3_share": exs["top_share"],
        "retry_chains": {**cs, "list": [
            {"failed_at": c.failed_at, "attempts": len(c.attempts), "success": c.success,
             "manual_attempts": len(c.manual), "manual_success": c.manual_success,
             "recovered_at": c.recovered_at} for c in chains]},
        "planner": plan, "mtbf_s": plan["mtbf_s"], "restart_s": plan["restart_s"],
        "ckpt_save_s": plan["ckpt_save_s"],
        "warnings": warnings,
    }
    return data, Context(frame, sig, live, ev, det, cl)


def load_inputs(a: argparse.Namespace) -> Inputs:
    t_from, t_to = parse_time(a.t_from, "--from"), parse_time(a.t_to, "--to")
    if t_from is not None and t_to is not None and t_to <= t_from:
        raise ValueError(f"--from {a.t_from} --to {a.t_to}: empty time range")
    sources: dict = {}
    if a.prometheus:
        from unbroken.learn.promhttp import read_prometheus
        frame = read_prometheus(a.prometheus, t_from, t_to)
        sources["prometheus"] = a.prometheus
    elif a.openmetrics:
        from unbroken.learn.openmetrics import read_openmetrics
        frame = read_openmetrics(a.openmetrics, t_from, t_to)
        sources["openmetrics"] = a.openmetrics
    else:
        raise ValueError("no metrics: give --prometheus URL or --openmetrics FILE...")
    inp = Inputs(frame=frame, sources=sources)
    if a.kernel_log:
        from unbroken.learn.kernlog import read_kernel_logs
        inp.xids, w = read_kernel_logs(a.kernel_log)
        lo, hi = frame.t[0] - 3600, frame.t[-1] + 3600
        inp.xids = [x for x in inp.xids if lo <= x.time <= hi]
        inp.warnings += w
        sources["kernel_log"] = a.kernel_log
    if a.sacct:
        from unbroken.learn.sacct import read_sacct
        inp.attempts, w = read_sacct(a.sacct)
        inp.warnings += w
        sources["sacct"] = a.sacct
    if a.journal:
        from unbroken.learn.journal import read_journal_exclusions
        inp.journal_exclusions, w = read_journal_exclusions(a.journal)
        inp.warnings += w
        sources["journal"] = a.journal
    return inp


def analyze_command(a: argparse.Namespace) -> dict:
    detector = read_detector(a.detector) if a.detector else None
    inp = load_inputs(a)
    data, ctx = analyze(inp, detector=detector)
    if a.html:
        from unbroken.learn.html import write_html
        data["html"] = write_html(a.html, data, ctx)
    return data
