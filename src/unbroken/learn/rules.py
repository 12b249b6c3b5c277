"""``unbroken learn rules``: the calibrated detector, and the report's memory, thermal, NFS and
XID rules, as Prometheus recording and alerting rules an operator loads as they are.

Why rules as well as the offline analysis: the analysis finds precursors in history; the
cluster needs them live. The same detector is written in PromQL, per signal:

* ``unbroken:signal:<s>`` — the signal per instance (a rate over 1m for counters);
* ``unbroken:peer_{median,p05,p95,mad,scale}:<s>`` — the cluster's band and robust scale;
* ``unbroken:peer_outlier:<s>`` — 1 where the instance is outside the band *and* its robust z
  exceeds the calibrated z, with more than ``min_peers`` instances reporting, else 0;
* ``unbroken:peer_firing:<s>`` — the outlier held for ``persist`` evaluations
  (``min_over_time`` over persist x interval);
* ``unbroken:family_firing{family=...}`` — any signal of the family firing;
* alert ``UnbrokenFailurePrecursor`` when at least ``families`` families fire (a warning, never
  a page, as in the report).

One difference from ``core.precursors``: PromQL has no leave-one-out quantile, so the band and
the median include the instance itself. With the report's 63 nodes that moves P5/P95 by less
than one rank; with very few nodes the rules are slightly less sensitive than the analysis.

The evaluation interval is the scrape interval the detector was calibrated at (30 s).
Thresholds of the other rules: backendai.md §4-§5 (Algalon's encoding of the report), the
same as ``core.memrules`` and ``core.ckpt_io``.
"""

from __future__ import annotations

import argparse
import math

from unbroken.core.ckpt_io import CkptPolicy
from unbroken.core.memrules import MemoryThermalPolicy
from unbroken.core.precursors import DetectorPolicy
from unbroken.core.xid import EVICT_AT_ONCE, XID_CATALOG
from unbroken.learn import names as M
from unbroken.learn.signals import BAND_SIGNALS as SIGNALS

__all__ = ["rules_yaml", "rules_command", "show_rules"]

SIGNAL_EXPR = {
    "interrupts": f"sum by (instance) (rate({M.INTR}[1m]))",
    "procs_running": f"sum by (instance) ({M.PROCS})",
    "pageouts": f"sum by (instance) (rate({M.PGPGOUT}[1m]))",
    "nfs_getattr_latency": (f'sum by (instance) (rate({M.NFS_RTT}{{operation="GETATTR"}}[1m]))'
                            f' / sum by (instance) (rate({M.NFS_REQ}{{operation="GETATTR"}}'
                            f'[1m]) > 0)'),
    "gpu_util_min": f"min by (instance) ({M.GPU_UTIL})",
    "gpu_temp_max": f"max by (instance) ({M.GPU_TEMP})",
}


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _num(x: float) -> str:
    return f"{x:.10g}"


def _detector_rules(policy: DetectorPolicy, signals: list[str], interval_s: float) -> list[str]:
    out = []
    for s in signals:
        fam, floor = SIGNALS[s]
        r = f"unbroken:signal:{s}"
        med, lo, hi = f"unbroken:peer_median:{s}", f"unbroken:peer_p05:{s}", \
            f"unbroken:peer_p95:{s}"
        mad, scale = f"unbroken:peer_mad:{s}", f"unbroken:peer_scale:{s}"
        lo_q, hi_q = policy.band[0] / 100, policy.band[1] / 100
        window = max(1, int(policy.persist * interval_s - interval_s / 2))
        rules = [
            (r, SIGNAL_EXPR[s]),
            (med, f"quantile(0.5, {r})"),
            (lo, f"quantile({_num(lo_q)}, {r})"),
            (hi, f"quantile({_num(hi_q)}, {r})"),
            (mad, f"quantile(0.5, abs({r} - on() group_left() {med}))"),
            (scale, f"clamp_min(max(1.4826 * {mad} or label_replace({_num(policy.rel_floor)} * "
                    f"abs({med}), \"unbroken_floor\", \"rel\", \"\", \"\")), {_num(floor)})"),
            (f"unbroken:peer_z:{s}", f"({r} - on() group_left() {med}) / on() group_left() "
                                     f"{scale}"),
            (f"unbroken:peer_outlier:{s}",
             f"(abs(unbroken:peer_z:{s}) > bool {_num(policy.z)}) * (({r} < bool on() "
             f"group_left() {lo}) + ({r} > bool on() group_left() {hi})) and on() "
             f"(count({r}) > {policy.min_peers})"),
            (f"unbroken:peer_firing:{s}",
             f"min_over_time(unbroken:peer_outlier:{s}[{window}s])"),
        ]
        out += [f"      - record: {name}\n        expr: {_q(expr)}" for name, expr in rules]
    fams: dict[str, list[str]] = {}
    for s in signals:
        fams.setdefault(SIGNALS[s][0], []).append(s)
    for fam, sigs in fams.items():
        expr = f'max by (instance) ({{__name__=~"unbroken:peer_firing:({"|".join(sigs)})"}})'
        out.append(f"      - record: unbroken:family_firing\n        expr: {_q(expr)}\n"
                   f"        labels:\n          family: {fam}")
    return out


def _alert(name: str, expr: str, severity: str, summary: str, for_: str | None = None) -> str:
    f = f"\n        for: {for_}" if for_ else ""
    return (f"      - alert: {name}\n        expr: {_q(expr)}{f}\n        labels:\n"
            f"          severity: {severity}\n        annotations:\n"
            f"          summary: {_q(summary)}")


def rules_yaml(policy: DetectorPolicy = DetectorPolicy(), interval_s: float = 30.0,
               signals: list[str] | None = None, mt: MemoryThermalPolicy = MemoryThermalPolicy(),
               io: CkptPolicy = CkptPolicy(), source: str = "default detector") -> str:
    signals = list(SIGNALS) if signals is None else [s for s in signals if s in SIGNALS]
    iv = f"{interval_s:g}s"
    det = _detector_rules(policy, signals, interval_s)
    prec = _alert(
        "UnbrokenFailurePrecursor", f"sum by (instance) (unbroken:family_firing) >= "
        f"{policy.families}", "warning",
        "{{ $labels.instance }}: {{ $value }} metric families outside their peers' P5-P95 band "
        f"(|z| > {policy.z:g}, {policy.persist} scrapes): a failure precursor")
    slow = " or ".join(f"(floor({M.CLOCK_EVENTS} / {b}) % 2 == 1)" for b in (8, 32, 64, 128))
    critical_xids = sorted(c for c, i in XID_CATALOG.items() if i.action in EVICT_AT_ONCE)
    xid_crit = " or ".join(f"{M.XID} == {c}" for c in critical_xids)
    mem = [
        _alert("GpuUncorrectableRemapIncrease", f"increase({M.REMAP_UNCORR}[10m]) > 0",
               "critical", "{{ $labels.instance }} GPU {{ $labels.gpu }}: uncorrectable "
               "remapped rows increased: replace the GPU"),
        _alert("GpuRowRemapFailure", f"{M.REMAP_FAILURE} > 0", "critical",
               "{{ $labels.instance }} GPU {{ $labels.gpu }}: row remap failure"),
        _alert("GpuRowRemapPending", f"{M.REMAP_PENDING} > 0", "warning",
               "{{ $labels.instance }} GPU {{ $labels.gpu }}: remap pending: schedule a reset",
               f"{mt.pending_s:g}s"),
        _alert("GpuCorrectableRemapGrowth",
               f"delta({M.REMAP_CORR}[24h]) > {mt.corr_growth_24h:g}", "warning",
               "{{ $labels.instance }} GPU {{ $labels.gpu }}: correctable remapped rows +"
               "{{ $value }} in 24 h"),
        _alert("GpuTempHigh", f"{M.GPU_TEMP} > {mt.gpu_warn_c:g}", "warning",
               "{{ $labels.instance }} GPU {{ $labels.gpu }} above "
               f"{mt.gpu_warn_c:g} C", f"{mt.gpu_warn_s:g}s"),
        _alert("GpuTempCritical", f"{M.GPU_TEMP} > {mt.gpu_crit_c:g}", "critical",
               "{{ $labels.instance }} GPU {{ $labels.gpu }} above "
               f"{mt.gpu_crit_c:g} C", f"{mt.gpu_crit_s:g}s"),
        _alert("HbmTempHigh", f"{M.MEM_TEMP} > {mt.hbm_warn_c:g}", "warning",
               "{{ $labels.instance }} GPU {{ $labels.gpu }} HBM above "
               f"{mt.hbm_warn_c:g} C", f"{mt.hbm_warn_s:g}s"),
        _alert("GpuClockSlowdown", slow, "warning",
               "{{ $labels.instance }} GPU {{ $labels.gpu }}: HW slowdown / thermal / power "
               "brake clock events: fail-slow", f"{mt.slowdown_s:g}s"),
        _alert("GpuXidCritical", xid_crit, "critical",
               "{{ $labels.instance }} GPU {{ $labels.gpu }}: XID {{ $value }}: evict the node"),
        _alert("GpuXid", f"{M.XID} != 0 unless ({xid_crit})", "warning",
               "{{ $labels.instance }} GPU {{ $labels.gpu }}: XID {{ $value }}"),
    ]
    nfs = [
        "      - record: unbroken:nfs_write_bytes:rate1m\n        expr: " + _q(
            f'sum(rate({M.NFS_SENT}{{operation="WRITE"}}[1m]))'),
        "      - record: unbroken:nfs_read_bytes:rate1m\n        expr: " + _q(
            f'sum(rate({M.NFS_RECV}{{operation="READ"}}[1m]))'),
        "      - record: unbroken:ckpt_saving\n        expr: " + _q(
            f"unbroken:nfs_write_bytes:rate1m > bool {_num(io.save_Bps)}"),
        "      - record: unbroken:nfs_write_queue_share\n        expr: " + _q(
            f'sum by (instance) (rate({M.NFS_QUEUE}{{operation="WRITE"}}[1m])) / sum by '
            f'(instance) (rate({M.NFS_RTT}{{operation="WRITE"}}[1m]) > 0)'),
        _alert("NfsRpcQueueSaturated",
               f'unbroken:nfs_write_queue_share > {io.queue_share_alert:g} and on (instance) '
               f'sum by (instance) (rate({M.NFS_REQ}{{operation="WRITE"}}[1m])) > 10',
               "warning", "{{ $labels.instance }}: {{ $value | humanizePercentage }} of NFS "
               "WRITE latency is client queue time: RPC slots saturated (raise "
               "sunrpc.tcp_max_slot_table_entries or use nconnect)", "15m"),
        _alert("NfsHighLatency",
               f"sum by (instance, operation) (rate({M.NFS_RTT}[1m])) / sum by (instance, "
               f"operation) (rate({M.NFS_REQ}[1m]) > 0) > 0.1", "warning",
               "{{ $labels.instance }}: NFS {{ $labels.operation }} above 100 ms per request",
               "10m"),
        _alert("NfsMajorTimeouts", f"increase({M.NFS_MAJOR_TIMEOUTS}[5m]) > 0", "warning",
               "{{ $labels.instance }}: NFS major timeouts"),
    ]
    head = (f"# unbroken learn rules: {source}\n"
            f"# detector: z {policy.z:g}, persist {policy.persist} x {iv}, {policy.families} "
            f"families, band P{policy.band[0]:g}-P{policy.band[1]:g}, more than "
            f"{policy.min_peers} instances\n")
    return (head + "groups:\n"
            f"  - name: unbroken-precursors\n    interval: {iv}\n    rules:\n"
            + "\n".join(det + [prec]) + "\n"
            f"  - name: unbroken-gpu-memory-thermal\n    interval: {iv}\n    rules:\n"
            + "\n".join(mem) + "\n"
            f"  - name: unbroken-nfs-checkpoint\n    interval: {iv}\n    rules:\n"
            + "\n".join(nfs) + "\n")


def _policy_from(path: str) -> tuple[DetectorPolicy, float, list[str] | None]:
    from unbroken.learn.planfrom import read_learn_json

    d = read_learn_json(path, "--from-learn")
    det = d.get("detector") if isinstance(d, dict) else None
    if isinstance(det, dict) and isinstance(det.get("rules"), dict):
        det = det["rules"]       # the change detector's file carries the peer-band rules
    if not isinstance(det, dict):
        raise ValueError(f"--from-learn {path}: no 'detector' object (expected 'unbroken "
                         f"learn --json' output)")
    try:
        pol = DetectorPolicy(z=float(det["z"]), persist=int(det["persist"]),
                             families=int(det["families"]),
                             min_peers=int(det.get("min_peers", 3)),
                             band=tuple(det.get("band", (5.0, 95.0))),
                             rel_floor=float(det.get("rel_floor", 0.05))).check()
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"--from-learn {path}: bad detector ({e})") from None
    iv = float(det.get("scrape_s", 30.0))
    if not (math.isfinite(iv) and iv > 0):
        raise ValueError(f"--from-learn {path}: bad scrape_s {iv!r}")
    return pol, iv, list(det.get("signals", {})) or None


def rules_command(a: argparse.Namespace) -> dict:
    if a.from_learn:
        pol, iv, sigs = _policy_from(a.from_learn)
        text = rules_yaml(pol, iv, sigs, source=f"calibrated detector from {a.from_learn}")
    else:
        pol, iv = DetectorPolicy(), 30.0
        text = rules_yaml(pol, iv)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    return {"action": "rules", "out": a.out, "yaml": text, "detector": {
        "z": pol.z, "persist": pol.persist, "families": pol.families, "interval_s": iv}}


def show_rules(con, data: dict) -> None:
    if data["out"]:
        con.print(f"rules written to {data['out']} (check with: promtool check rules "
                  f"{data['out']})", highlight=False)
    else:
        print(data["yaml"], end="")
