"""The terminal view of ``unbroken learn``: a few rich tables, numbers first."""

from __future__ import annotations

import datetime as dt
import math

from rich.table import Table

__all__ = ["print_summary", "when"]


def when(ts: float | None) -> str:
    if ts is None or not math.isfinite(ts):
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%m-%d %H:%M:%S")


def _dur(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    return f"{s / 3600:.1f} h" if abs(s) >= 5400 else (f"{s / 60:.1f} min" if abs(s) >= 120
                                                       else f"{s:.0f} s")


def print_summary(con, d: dict) -> None:
    n = len(d["failures"])
    con.print(f"[bold]learn[/]: {d['nodes']} nodes, {d['days']:.1f} days at {d['scrape_s']:g} s "
              f"({', '.join(d['sources'])})", highlight=False)
    con.print(f"[bold]1. Precursors[/]: {d['detected']}/{n} failures detected, "
              f"{d['before_xid']} before the XID, {d['false_alarms_per_day']:.2f} false alarms"
              f"/day; detector {d['detector']['reason']}", highlight=False)
    tb = Table(show_edge=False, pad_edge=False)
    for c in ("node", "XID", "xid time", "detected", "lead", "signals"):
        tb.add_column(c)
    for f in d["failures"]:
        lead = f["lead_s"]
        tb.add_row(f["node"], str(f["xid"]), when(f["xid_time"]), when(f["detected_time"]),
                   ("-" if lead is None else ("+" if lead > 0 else "") + _dur(lead)),
                   ", ".join(f["fired"]) or "-")
    con.print(tb)
    crit = [m for m in d["memory_thermal"] if m["severity"] == "critical"]
    warn = [m for m in d["memory_thermal"] if m["severity"] != "critical"]
    con.print(f"[bold]2. Memory and thermal[/]: {len(crit)} critical, {len(warn)} warnings",
              highlight=False)
    for m in d["memory_thermal"][:12]:
        con.print(f"  {m['severity']:<8} {m['node']} gpu {m['gpu']}: {m['rule']} "
                  f"(from {when(m['first'])}) {m['detail']}", highlight=False)
    io = d["checkpoint_io"]
    ph = d["checkpoint_phases"]
    saves = [p for p in ph if p["kind"] == "save"]
    loads = [p for p in ph if p["kind"] == "load"]
    con.print(f"[bold]3. Checkpoint I/O[/]: {len(saves)} saves (median "
              f"{_dur(d['ckpt_save_s'])}), {len(loads)} loads; {io['reason']}",
              highlight=False)
    if io.get("fix"):
        con.print(f"  fix: {io['fix']}", highlight=False)
    ex = d["exclusions"]
    con.print(f"[bold]4. Exclusions[/]: {ex['reason']}; top: "
              f"{', '.join(f'{k} ({v})' for k, v in list(ex['per_node'].items())[:3])}; "
              f"quarantine candidates: {', '.join(ex['quarantine_candidates']) or 'none'}",
              highlight=False)
    con.print(f"[bold]5. Retry chains[/]: {d['retry_chains']['reason']}", highlight=False)
    con.print(f"[bold]6. For the planner[/]: {d['planner']['reason']}  (unbroken plan --from "
              f"LEARN.json)", highlight=False)
    for w in d["warnings"][:10]:
        con.print(f"[yellow]warning[/]: {w}", highlight=False)
    if len(d["warnings"]) > 10:
        con.print(f"[yellow]warning[/]: {len(d['warnings']) - 10} more", highlight=False)
    if d.get("html"):
        con.print(f"HTML report: {d['html']}", highlight=False)
