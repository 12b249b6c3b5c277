"""Terminal rendering (rich) of theory, simulation and plan results. Presentation only."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from unbroken.core.units import format_duration


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _dur(seconds: float) -> str:
    return format_duration(round(seconds)) if math.isfinite(seconds) else "never ends"


def theory_table(data: dict, console: Console) -> None:
    t = Table(title=f"Closed forms at N={data['groups']}, r={data['redundancy']}")
    t.add_column("quantity")
    t.add_column("SPARe+CKPT", justify="right")
    t.add_column("Rep+CKPT", justify="right")
    s, rep = data, data["replication"]
    rows = [
        ("mu (failures to wipe-out)", f"{s['mu']:.1f}", f"{rep['mu']:.1f}"),
        ("overhead lower bound (stacks/step)", f"{s['overhead_lower_bound']:.3f}",
         f"{rep['overhead_lower_bound']:.3f}"),
        ("overhead incl. controller excess", f"{s['overhead']:.3f}", f"{rep['overhead']:.3f}"),
        ("checkpoint period T_c*", _dur(s["ckpt_period_s"]), _dur(rep["ckpt_period_s"])),
        ("checkpoint every (steps)", str(s["ckpt_every_steps"]), str(rep["ckpt_every_steps"])),
        ("time to wipe-out T_f (masked groups stop failing)",
         _dur(s["t_fail_s"]), _dur(rep["t_fail_s"])),
        ("expected restart (slowest of N, with resets)", _dur(s["restart_s"]),
         _dur(rep["restart_s"])),
        ("masked failures' cost per epoch", _dur(s["masked_overhead_s"]),
         _dur(rep["masked_overhead_s"])),
        ("availability A*", _pct(s["availability"]), _pct(rep["availability"])),
        ("TTT / T0", f"{s['ttt_over_t0']:.3f}", f"{rep['ttt_over_t0']:.3f}"),
        ("TTT / T0, the paper's J (T_f = mu MTBF, T_r)", f"{s['ttt_over_t0_paper']:.3f}",
         f"{rep['ttt_over_t0_paper']:.3f}"),
        ("r* (exact minimiser of J)", str(s["r_star"]), str(rep["r_star"])),
        ("r* closed form floor(log2 N + 0.833)", str(s["r_star_closed_form"]), "-"),
    ]
    for row in rows:
        t.add_row(*row)
    console.print(t)


def simulate_table(data: dict, console: Console) -> None:
    t = Table(title=f"{data['strategy']} at N={data['groups']}, r={data['redundancy']}, "
                    f"checkpoint every {data['ckpt_every']} steps")
    for col in ("seed", "TTT/T0", "availability", "wipe-outs", "masked", "mean depth"):
        t.add_column(col, justify="right")
    for p in data["per_seed"]:
        t.add_row(str(p["seed"]), f"{p['ttt_over_t0']:.3f}", _pct(p["availability"]),
                  str(p["wipeouts"]), str(p["masked_failures"]),
                  f"{p['mean_stack_depth']:.3f}")
    t.add_row("mean", f"{data['ttt_over_t0']:.3f}", _pct(data["availability"]),
              f"{data['wipeouts']:.1f}", f"{data['masked_failures']:.1f}",
              f"{data['mean_stack_depth']:.3f}", style="bold")
    console.print(t)
    console.print(f"wall time {data['wall_s']:.2f} s")


def plan_tables(plan: dict, console: Console) -> None:
    sc = plan["scenario"]
    console.print(
        f"[bold]Plan[/] for {sc['gpus']:,} GPUs in {sc['groups']} groups "
        f"({sc['gpus_per_group']:g} GPUs each): MTBF {format_duration(sc['mtbf'])}, restart "
        f"{format_duration(sc['t_restart'])}, checkpoint save {format_duration(sc['t_save'])}, "
        f"{sc['steps']:,} steps, {plan['seeds']} seeds per point")
    t = Table(title="Best configuration per strategy (simulation | theory)")
    for col in ("strategy", "r", "ckpt every", "TTT/T0 sim", "TTT/T0 theory", "avail. sim",
                "avail. theory", "theory's own r*"):
        t.add_column(col, justify="right")
    for strategy in ("spare", "rep"):
        b, tb = plan[strategy]["best"], plan[strategy]["theory_best"]
        t.add_row(plan[strategy]["name"], str(b["redundancy"]), str(b["ckpt_every"]),
                  f"{b['ttt_over_t0']:.2f}", f"{b['theory_ttt_over_t0']:.2f}",
                  _pct(b["availability"]), _pct(b["theory_availability"]),
                  f"{tb['redundancy']} ({tb['ttt_over_t0']:.2f})")
    ck = plan["ckpt"]
    t.add_row(ck["name"], "-", "-",
              (f"{ck['sim_ttt_over_t0']:.2f}" if ck["sim_completed"]
               else f"> {ck['sim_ttt_over_t0']:.0f}"),
              "-", _pct(ck["sim_availability"]), _pct(ck["theory_availability"]), "-")
    console.print(t)
    sw = Table(title="Sweep: TTT/T0 (simulated mean ± std | theory)")
    sw.add_column("r", justify="right")
    for strategy in ("spare", "rep"):
        sw.add_column(plan[strategy]["name"], justify="right")
    rows = {s: {row["redundancy"]: row for row in plan[s]["sweep"]} for s in ("spare", "rep")}
    for r in sorted(set(rows["spare"]) | set(rows["rep"])):
        cells = []
        for s in ("spare", "rep"):
            row = rows[s].get(r)
            cells.append("-" if row is None else
                         f"{row['sim']['ttt_over_t0']:.2f} ± {row['sim']['ttt_over_t0_std']:.2f}"
                         f" | {row['theory']['ttt_over_t0']:.2f}")
        sw.add_row(str(r), *cells)
    console.print(sw)
    rec = plan["recommendation"]
    console.print(f"[bold green]Recommendation:[/] {rec['reason']}")
    console.print(f"closed-form r* = floor(log2 N + 0.833) = {plan['r_star_closed_form']}; "
                  f"figure: {plan.get('png', '-')}; wall time {plan['wall_s']:.1f} s")


def node_lines(nodes: dict, show: int = 8) -> list[str]:
    """The node placement as a few lines: safe or not, the first nodes' groups, the fewest
    nodes that keep a node loss safe (for plan, per redundancy)."""
    head = (f"Nodes: {nodes['groups']} groups (r={nodes['redundancy']}) on {nodes['nodes']} "
            f"nodes: {nodes['reason']}")
    lines = [head]
    for k, ws in enumerate(nodes["groups_on"][:show]):
        lines.append(f"  node {k}: groups {' '.join(map(str, ws))}")
    if len(nodes["groups_on"]) > show:
        lines.append(f"  ... {len(nodes['groups_on']) - show} more node(s) (--json lists all)")
    lines.append(f"  fewest nodes for a safe node loss: {nodes['nodes_needed_reason']}")
    by_r = nodes.get("needed_by_r")
    if by_r:
        lines.append("  fewest nodes per r: " + ", ".join(
            f"r={r}: {'-' if k is None else k}" for r, k in by_r.items()))
    return lines
