"""``unbroken learn --html FILE``: one self-contained HTML file (no scripts, no external
resources; the figures are matplotlib PNGs inlined as base64), so it can be mailed, attached to
a ticket or opened offline.

The precursor figures are the report's (backendai.md §2): each metric drawn as the P5-P95 band
of the node's peers, their median, and the failing node overlaid, from two hours before its
XID to one hour after, with the XID and the detector's alert marked.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from unbroken.learn.report import when  # noqa: E402

__all__ = ["write_html"]

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;
font-size:90%;text-align:left}th{background:#f3f3f3}img{max-width:100%;display:block;
margin:.5em 0}.num{font-size:140%;font-weight:600}.warn{color:#a60}"""


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _img(b64: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'


def _unit_band(ctx, s: str, f: dict, w):
    """The peers' P5-P95 band and median of signal ``s`` over the window, and the failing
    node's unit that strays furthest from the median (its GPU, for a per-GPU signal)."""
    import numpy as np

    n = ctx.frame.nodes.index(f["node"])
    nd = ctx.signals.node_of[s]
    x = np.where(ctx.live[nd][:, w], ctx.signals.values[s][:, w], np.nan)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, med, hi = np.nanpercentile(x, [5, 50, 95], axis=0)
        mine = np.flatnonzero(nd == n)
        far = np.nanmax(np.abs(x[mine] - med), axis=1)
    u = mine[int(np.nanargmax(far))] if np.isfinite(far).any() else mine[0]
    lab = ctx.signals.unit[s][u]
    return lo, med, hi, ctx.signals.values[s][u, w], f["node"] + (f" gpu {lab}" if lab else "")


def _failure_figure(ctx, f: dict, signals: list[str]) -> str:
    t = ctx.frame.t
    x = f["xid_time"]
    w = (t >= x - 7200) & (t <= x + 3600)
    hours = (t[w] - x) / 3600.0
    fig, axes = plt.subplots(len(signals), 1, figsize=(8, 1.9 * len(signals)), sharex=True,
                             squeeze=False)
    for ax, s in zip(axes[:, 0], signals):
        lo, med, hi, mine, label = _unit_band(ctx, s, f, w)
        ax.fill_between(hours, lo, hi, color="tab:blue", alpha=0.25,
                        label="peers P5-P95", step="mid")
        ax.plot(hours, med, color="tab:blue", lw=0.8, label="peers median")
        ax.plot(hours, mine, color="tab:red", lw=1.2, label=label)
        ax.axvline(0, color="k", lw=1, ls="--")
        if f["detected_time"] is not None:
            ax.axvline((f["detected_time"] - x) / 3600.0, color="tab:green", lw=1)
        ax.set_ylabel(s, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, loc="upper left", ncol=3)
    axes[0, 0].set_title(f"{f['node']}: XID {f['xid']} (dashed) and alert (green)", fontsize=9)
    axes[-1, 0].set_xlabel("hours from the XID", fontsize=8)
    return _png(fig)


def _ckpt_figure(ctx, data: dict) -> str:
    t = ctx.frame.t
    w = t <= t[0] + 12 * 3600
    hours = (t[w] - t[0]) / 3600.0
    fig, ax = plt.subplots(figsize=(8, 2.6))
    ax.plot(hours, ctx.cluster["write_Bps"][w] / 1e9, lw=0.8, label="NFS write GB/s")
    ax.plot(hours, ctx.cluster["read_Bps"][w] / 1e9, lw=0.8, label="NFS read GB/s")
    for p in data["checkpoint_phases"]:
        if p["start"] <= t[0] + 12 * 3600:
            ax.axvspan((p["start"] - t[0]) / 3600, (p["end"] - t[0]) / 3600, alpha=0.25,
                       color="tab:orange" if p["kind"] == "save" else "tab:green")
    ax.set_xlabel("hours from the start (first 12 h)", fontsize=8)
    ax.legend(fontsize=7)
    ax.tick_params(labelsize=7)
    return _png(fig)


def _exclusion_figure(data: dict) -> str:
    per = list(data["exclusions"]["per_node"].items())[:20]
    fig, ax = plt.subplots(figsize=(8, 2.4))
    ax.bar([k for k, _ in per], [v for _, v in per], color="tab:purple")
    ax.tick_params(axis="x", labelrotation=60, labelsize=7)
    ax.set_ylabel("exclusions", fontsize=8)
    return _png(fig)


def _table(rows: list[list], head: list[str]) -> str:
    h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def _fmt(x, unit="s") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x / 60:.1f} min" if unit == "s" and abs(x) >= 120 else f"{x:.0f} {unit}"


def write_html(path: str | os.PathLike, data: dict, ctx) -> str:
    path = Path(path)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>unbroken learn"
             f"</title><style>{_CSS}</style></head><body>",
             f"<h1>unbroken learn</h1><p>{data['nodes']} nodes, {data['days']:.1f} days at "
             f"{data['scrape_s']:g} s, {when(data['start'])} to {when(data['end'])} UTC</p>"]
    n = len(data["failures"])
    parts.append(f"<h2>1. Failure precursors</h2><p><span class='num'>{data['detected']}/{n}"
                 f"</span> failures detected, <span class='num'>{data['before_xid']}</span> "
                 f"before the XID, <span class='num'>{data['false_alarms_per_day']:.2f}</span>"
                 f" false alarms per day. Detector: "
                 f"{html.escape(data['detector']['reason'])}.</p>")
    parts.append(_table([[f["node"], f["xid"], when(f["xid_time"]), when(f["detected_time"]),
                          _fmt(f["lead_s"]), ", ".join(f["fired"]) or "-"]
                         for f in data["failures"]],
                        ["node", "XID", "XID time", "alert", "lead", "signals"]))
    for f in data["failures"]:
        if f["node"] not in ctx.frame.nodes:
            continue
        sigs = f["fired"] or list(ctx.signals.values)[:3]
        parts.append(_img(_failure_figure(ctx, f, sigs), f"{f['node']} against its peers"))
    parts.append("<h2>2. GPU memory and thermal</h2>")
    parts.append(_table([[m["severity"], m["node"], m["gpu"], m["rule"], when(m["first"]),
                          m["detail"]] for m in data["memory_thermal"]],
                        ["severity", "node", "GPU", "rule", "from", "detail"]))
    io_ = data["checkpoint_io"]
    saves = [p for p in data["checkpoint_phases"] if p["kind"] == "save"]
    loads = [p for p in data["checkpoint_phases"] if p["kind"] == "load"]
    parts.append(f"<h2>3. Checkpoint I/O</h2><p>{len(saves)} saves (median "
                 f"{_fmt(data['ckpt_save_s'])}), {len(loads)} loads. "
                 f"{html.escape(io_['reason'])}.</p>"
                 + (f"<p><b>Fix:</b> {html.escape(io_['fix'])}</p>" if io_["fix"] else ""))
    parts.append(_img(_ckpt_figure(ctx, data), "checkpoint phases"))
    ex = data["exclusions"]
    parts.append(f"<h2>4. Exclusions</h2><p>{html.escape(ex['reason'])}. Quarantine "
                 f"candidates: {html.escape(', '.join(ex['quarantine_candidates']) or 'none')}"
                 f".</p>")
    if ex["per_node"]:
        parts.append(_img(_exclusion_figure(data), "exclusions per node"))
    rc = data["retry_chains"]
    parts.append(f"<h2>5. Retry chains</h2><p>{html.escape(rc['reason'])}.</p>")
    parts.append(_table([[when(c["failed_at"]), c["attempts"], c["success"],
                          c["manual_attempts"], c["manual_success"]] for c in rc["list"]],
                        ["failed", "automatic attempts", "chain success", "manual attempts",
                         "manual success"]))
    p = data["planner"]
    parts.append(f"<h2>6. For the planner</h2><p>{html.escape(p['reason'])}.</p>")
    parts.append(_table([[k, _fmt(p[k])] for k in ("mtbf_s", "gpu_mtbf_s", "restart_s",
                                                   "ckpt_save_s", "ckpt_load_s", "young_s",
                                                   "daly_s", "saxena_s")], ["number", "value"]))
    if data["warnings"]:
        parts.append("<h2>Warnings</h2><ul>" + "".join(
            f"<li class='warn'>{html.escape(w)}</li>" for w in data["warnings"]) + "</ul>")
    parts.append("</body></html>")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("\n".join(parts), encoding="utf-8")
    os.replace(tmp, path)
    return str(path)
