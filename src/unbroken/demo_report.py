"""The demo's summary: what was injected, what was masked, what it cost, and was it correct.

``build_report`` turns the journal events (plus the correctness checks the driver ran: the
parameter difference to a failure-free reference and the exactly-once ledger) into a JSON-ready
dict; ``print_report`` renders it with rich; ``plot_demo`` draws loss per step with the faults
and restarts marked, and the cumulative and windowed ETTR over time. Time accounting is
:mod:`unbroken.core.ettr`'s (its docstring defines every number here).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from unbroken.core.ettr import RESOLVED_BY, ettr_report
from unbroken.events import Event


def _config(events: list[dict]) -> dict:
    for e in events:
        if isinstance(e, dict) and e.get("event") == Event.START:
            return dict(e.get("config") or {})
    return {}


def build_report(events: list[dict], *, max_abs_param_diff: float | None, exactly_once: bool,
                 ledger: dict | None = None) -> dict:
    evs = [e for e in events if isinstance(e, dict)]
    r = ettr_report(evs)
    cfg = _config(evs)
    ends = [e for e in evs if e.get("event") == Event.END and
            isinstance(e.get("wall_s"), (int, float))]
    times = [float(e["t"]) for e in evs if isinstance(e.get("t"), (int, float))]
    # the whole demo (start-up included) when the driver said so, else the journal's span
    wall = float(ends[-1]["wall_s"]) if ends else (max(times) - min(times) if times else 0.0)
    last = max(r.losses) if r.losses else None
    out = {
        "groups": cfg.get("groups"),
        "redundancy": cfg.get("redundancy"),
        "steps_planned": cfg.get("steps"),
        "steps": r.steps,
        "faults_injected": sum(1 for e in evs if e.get("event") == Event.FAULT
                               and not e.get("external")),
        "faults_external": sum(1 for e in evs if e.get("event") == Event.FAULT
                               and e.get("external")),
        "faults_masked": sum(1 for f in r.faults if f.masked),
        "restarts": r.restarts,
        "joins": sum(1 for e in evs if e.get("event") == Event.JOIN),
        "ettr": r.ettr,
        "step_s": r.step_s,
        "train_s": r.wall_s,
        "productive_s": r.productive_s,
        "lost_s": r.lost_s,
        "other_lost_s": r.other_lost_s,
        "wall_s": wall,
        "final_loss": r.losses[last] if last is not None else None,
        "exactly_once": bool(exactly_once),
        "max_abs_param_diff": max_abs_param_diff,
        "time_lost_per_fault": [asdict(f) for f in r.faults],
    }
    if ledger is not None:
        out["ledger"] = ledger
    return out


def straggler_report(events: list[dict], t_start: float,
                     target_loss: float | None = None) -> dict:
    """The run's straggler and time-to-accuracy numbers from the journal's commit events
    (``unbroken.core.stragglers`` computes them): ``tta_s`` (from the run's start, the origin
    of ``wall_s``; null when the target was not reached or not given), ``tta_train_s`` (from
    step 0's commit: start-up left out), ``straggler_frequency`` (from each group's own step
    time ``own_s``), ``sync_modes`` (steps committed per mode) and ``mode_switches``."""
    from unbroken.core.stragglers import (data_step_loss_points, straggler_frequency,
                                          time_to_target)

    own: dict[int, dict[str, float]] = {}
    start: dict[int, float] = {}                # step -> its first commit's time
    mode: dict[int, str] = {}                   # step -> the sync mode it committed under
    switches: set[tuple] = set()                # (step, to): every member journals a switch
    commits = []
    for e in events:
        if isinstance(e, dict) and e.get("event") == Event.MODE_SWITCH:
            switches.add((e.get("step"), e.get("to")))
        if not isinstance(e, dict) or e.get("event") != Event.COMMIT \
                or not isinstance(e.get("t"), (int, float)):
            continue
        commits.append(e)
        k = int(e["step"])
        mode.setdefault(k, str(e.get("sync", "sync")))
        start[k] = min(start.get(k, e["t"]), float(e["t"]))
        if isinstance(e.get("own_s"), (int, float)):
            own.setdefault(k, {})[str(e.get("src", e.get("uid")))] = float(e["own_s"])
    # the loss of every data step over all its shards (a deferring mode's commit has fewer)
    points = list(data_step_loss_points(commits).values())
    tta = tta_train = None
    if target_loss is not None and points:
        tta = time_to_target(points, target_loss, t_start)
        tta_train = time_to_target(points, target_loss, start[min(start)])
    return {"target_loss": target_loss, "tta_s": tta, "tta_train_s": tta_train,
            "straggler_frequency": straggler_frequency(own),
            "sync_modes": {m: sum(1 for k in start if mode.get(k) == m)
                           for m in sorted(set(mode[k] for k in start))},
            "mode_switches": len(switches)}


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"


def print_report(console: Console, report: dict, title: str = "Demo") -> None:
    t = Table(title=f"{title}: {report.get('groups', '?')} groups, "
                    f"r={report.get('redundancy', '?')}")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    diff = report.get("max_abs_param_diff")
    ok = "[green]yes[/]" if report.get("exactly_once") else "[bold red]NO[/]"
    rows = [
        ("steps committed", f"{report['steps']}" + (f" / {report['steps_planned']}"
                                                    if report.get("steps_planned") else "")),
        ("faults injected", str(report["faults_injected"])),
        *([("failures from outside", str(report["faults_external"]))]
          if report.get("faults_external") else []),
        ("masked without restart", str(report["faults_masked"])),
        ("restarts (wipe-outs)", str(report["restarts"])),
        ("spares joined", str(report.get("joins", 0))),
        ("ETTR (productive / elapsed)", f"{100 * report['ettr']:.2f}%"),
        ("failure-free step time", _s(report["step_s"])),
        ("training time (from step 0)", _s(report.get("train_s"))),
        ("time lost to faults", _s(sum(f["lost_s"] for f in report["time_lost_per_fault"]))),
        ("time lost otherwise (degraded steps, jitter)", _s(report.get("other_lost_s"))),
        ("wall time (incl. start-up)", _s(report["wall_s"])),
        ("final loss", "-" if report.get("final_loss") is None
         else f"{report['final_loss']:.4f}"),
        *([(f"time to loss {report['target_loss']:g}",
            "not reached" if report.get("tta_s") is None else _s(report["tta_s"]))]
          if report.get("target_loss") is not None else []),
        *([("straggler frequency (a group > 1.2x the fastest)",
            f"{100 * report['straggler_frequency']:.1f}% of steps")]
          if report.get("straggler_frequency") is not None else []),
        ("every gradient exactly once", ok),
        *([("max |param - failure-free reference|", f"{diff:.3g}")] if diff is not None
          else []),
    ]
    for row in rows:
        t.add_row(*row)
    console.print(t)
    faults = report["time_lost_per_fault"]
    if not faults:
        return
    ft = Table(title="Time lost per fault")
    for col in ("fault", "outcome", "lost", "detect", "decide", "recompute", "restart"):
        ft.add_column(col, justify="left" if col in ("fault", "outcome") else "right")
    for f in faults:
        outcome = f.get("how") or ("masked" if f["masked"] else "restart")
        who = f"group {f['group']}" if f["group"] >= 0 else "(job)"
        ft.add_row(f"{f['kind']} {who} @ step {f['step']}",
                   f"[green]{outcome}[/]" if f["masked"] else f"[red]{outcome}[/]",
                   _s(f["lost_s"]), _s(f["detect_s"]), _s(f["decide_s"]),
                   _s(f["recompute_s"]), _s(f["restart_s"]))
    console.print(ft)


def plot_demo(events: list[dict], path: str | os.PathLike) -> Path:
    """Write the PNG atomically (temp file, then rename) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    evs = [e for e in events if isinstance(e, dict)]
    r = ettr_report(evs)
    fig, (ax_l, ax_e) = plt.subplots(2, 1, figsize=(10, 7))
    steps = sorted(k for k, v in r.losses.items() if math.isfinite(v))
    ax_l.plot(steps, [r.losses[k] for k in steps], "-", color="tab:blue", lw=1.2, label="loss")
    colors = {"kill": "tab:red", "hang": "tab:orange", "nan": "tab:brown", "flip": "tab:pink",
              "xid": "tab:olive", "update": "tab:cyan"}
    for f in r.faults:
        c = colors.get(f.kind, "tab:gray")
        ls = "-" if f.masked else "--"
        ax_l.axvline(f.step, color=c, ls=ls, lw=1, alpha=0.8)
        who = f" g{f.group}" if f.group >= 0 else ""  # an update is job-wide
        ax_l.annotate(f"{f.kind}{who}" + ("" if f.masked else " (rolled back)" if
                                           f.kind in RESOLVED_BY else " (wipe-out)"),
                      xy=(f.step, 1), xycoords=("data", "axes fraction"), rotation=90,
                      va="top", ha="right", fontsize=8, color=c)
        ax_e.axvline(f.t_rel, color=c, ls=ls, lw=1, alpha=0.8)
    for e in evs:
        if e.get("event") == Event.RESTART and isinstance(e.get("step"), int):
            ax_l.axvline(e["step"], color="tab:purple", ls=":", lw=1.5)
            ax_l.annotate(f"restart @{e['step']}", xy=(e["step"], 0.02),
                          xycoords=("data", "axes fraction"), rotation=90, va="bottom",
                          ha="left", fontsize=8, color="tab:purple")
            ready = e.get("t_ready", e.get("t"))
            if isinstance(ready, (int, float)) and r.series:
                ax_e.axvline(ready - r.origin_t, color="tab:purple", ls=":", lw=1.5)
    ax_l.set_xlabel("step")
    ax_l.set_ylabel("loss")
    ax_l.set_title("Training loss (solid: masked or answered in place, dashed: wipe-out or "
                   "rolled back, dotted: restart)", fontsize=10)
    ax_l.grid(True, alpha=0.3)
    if r.series:
        ts = [s[0] for s in r.series]
        ax_e.plot(ts, [100 * s[1] for s in r.series], "-", color="tab:green",
                  label=f"cumulative (final {100 * r.ettr:.1f}%)")
        ax_e.plot(ts, [100 * s[2] for s in r.series], "-", color="tab:gray", alpha=0.7,
                  label=f"last {r.window} steps")
        ax_e.legend(fontsize=8, loc="lower left")
    ax_e.set_ylim(0, 105)
    ax_e.set_xlabel(f"time since step 0 started (s); failure-free step {r.step_s:.3f} s")
    ax_e.set_ylabel("ETTR (%)")
    ax_e.set_title("Effective training time ratio", fontsize=10)
    ax_e.grid(True, alpha=0.3)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path
