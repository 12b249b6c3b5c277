"""The plan face's commands: ``unbroken theory``, ``simulate`` and ``plan``.

One scenario (``--groups``, ``--mtbf``, ``--step-time``, ...) feeds all three: ``theory`` the
closed forms and a short Monte-Carlo of the real controller, ``simulate`` one strategy over
seeds, ``plan`` the redundancy sweep (``unbroken.plan``; ``plan --stragglers`` hands over to
``sync.cli``). ``--nodes K`` adds the node placement report: K above the groups is bad input
(exit 2), a placement whose node loss is unsafe a warning naming the nodes it takes (exit 0).

``add_*_args(parser)`` adds a command's flags, ``run(a)`` returns plain data (what ``--json``
prints), ``show(console, a, data)`` is the terminal view; ``unbroken.cli`` wires them. Here
rather than in ``unbroken.plan``: that module imports the simulator at its top, and the parser
(this module's top) is built for every ``unbroken`` command, ``--help`` included.
"""

from __future__ import annotations

import argparse
import sys
import time

from unbroken.cliargs import (UsageError, duration, duration0, fraction, nonneg_int,
                              positive_float, positive_int)

__all__ = ["add_theory_args", "add_simulate_args", "add_plan_args", "run", "show"]


def _ckpt_every(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer or 'auto', got {text!r}") from None


def _scenario_args(p: argparse.ArgumentParser, groups_default: int | None) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--groups", type=positive_int, default=groups_default,
                   required=groups_default is None, help="data-parallel groups N")
    g.add_argument("--gpus", type=positive_int, default=600_000, help="total GPUs")
    g.add_argument("--ranks-per-group", type=positive_int, default=1, metavar="R",
                   help="ranks (processes) in one group, the model sharded over them: a "
                        "rank's failure is its whole group's (1)")
    g.add_argument("--mtbf", type=duration, help="system MTBF (default 5m)")
    g.add_argument("--gpu-mtbf", type=duration,
                   help="MTBF of one GPU instead of --mtbf (system MTBF = this / gpus)")
    g.add_argument("--restart", type=duration0, default=None, help="global restart (60m)")
    g.add_argument("--ckpt-save", type=duration0, default=None, help="checkpoint save (60s)")
    g.add_argument("--steps", type=positive_int, default=10_000)
    g.add_argument("--step-time", type=duration, default=64.0,
                   help="compute per stack (64s)")
    g.add_argument("--allreduce", type=duration, help="all-reduce time (default N/100 s)")
    g.add_argument("--fail", choices=("weibull", "exponential"), default="weibull")
    g.add_argument("--weibull-shape", type=positive_float, help="Weibull k (default 0.78)")
    g.add_argument("--jitter", type=fraction, default=0.05,
                   help="compute jitter (std of the N(1, s^2) factor)")
    g.add_argument("--paper-shortcut", action="store_true",
                   help="the SPARe authors' accounting: a step masked without recompute "
                        "commits with no retried all-reduce (reproduces the published table; "
                        "can make failures look faster than none)")


def _scenario(a: argparse.Namespace):
    from unbroken.core.scenario import Scenario

    if a.mtbf is not None and a.gpu_mtbf is not None:
        raise UsageError("--mtbf and --gpu-mtbf conflict: give the system MTBF or the "
                         "per-GPU MTBF, not both")
    if a.fail == "exponential" and a.weibull_shape is not None:
        raise UsageError("--weibull-shape conflicts with --fail exponential")
    mtbf = a.mtbf if a.mtbf is not None else (
        a.gpu_mtbf / a.gpus if a.gpu_mtbf is not None else 300.0)
    flag = "--gpu-mtbf / --gpus" if a.gpu_mtbf is not None else "--mtbf"
    return _with_flags(Scenario, {"mtbf": flag}, groups=a.groups, gpus=a.gpus, steps=a.steps,
                       t_compute=a.step_time, t_allreduce=a.allreduce, mtbf=mtbf,
                       t_restart=3600.0 if a.restart is None else a.restart,
                       t_save=60.0 if a.ckpt_save is None else a.ckpt_save, jitter=a.jitter,
                       fail_dist=a.fail, paper_shortcut=a.paper_shortcut,
                       ranks_per_group=a.ranks_per_group,
                       weibull_shape=a.weibull_shape if a.weibull_shape is not None else 0.78)


#: Scenario fields as the flags that set them, for error lines that name what the user typed.
_FLAGS = {"groups": "--groups", "gpus": "--gpus", "steps": "--steps",
          "ranks_per_group": "--ranks-per-group",
          "t_compute": "--step-time", "t_allreduce": "--allreduce", "t_restart": "--restart",
          "t_save": "--ckpt-save", "jitter": "--jitter", "weibull_shape": "--weibull-shape"}


def _with_flags(build, flags: dict, **kw):
    """``build(**kw)``; a ScenarioError comes back as one line that starts with the flag."""
    from unbroken.core.scenario import ScenarioError

    try:
        return build(**kw)
    except ScenarioError as e:
        field = str(e).split(" ", 1)[0]
        flag = flags.get(field) or _FLAGS.get(field)
        raise UsageError(f"{flag}: {e}" if flag else str(e)) from None


_NODES_HELP = ("place the N groups on K nodes, balanced, and report whether a node loss is "
               "safe (no node holds two groups that share a shard type); K < 1 or K > N: "
               "exit 2; an unsafe placement is a warning naming the nodes it takes, exit 0")


def _check_nodes(groups: int, nodes: int) -> None:
    from unbroken.core.placement import check_nodes

    try:
        check_nodes(groups, nodes)
    except ValueError as e:
        raise UsageError(f"--nodes: {e}") from None


def _nodes(groups: int, redundancy: int, nodes: int) -> dict:
    """The node placement report; an unsafe one is a warning (exit 0), not an error."""
    from unbroken.core import placement

    rep = placement.node_summary(placement.make_layout(groups, redundancy), nodes)
    if not rep["safe"]:
        sys.stderr.write(f"unbroken: warning: --nodes {nodes}: {rep['reason']}; it takes "
                         f"{rep['nodes_needed_reason']}\n")
    return rep


def add_theory_args(p: argparse.ArgumentParser) -> None:
    _scenario_args(p, None)
    p.add_argument("--redundancy", type=positive_int, required=True)
    p.add_argument("--mc-trials", type=nonneg_int, default=8,
                   help="Monte-Carlo runs of the real controller for the overhead excess")
    p.add_argument("--budget", type=duration, default=10.0,
                   help="wall time for that Monte-Carlo (10s); the closed forms are instant, "
                        "a Monte-Carlo cut short says how far it got")
    p.add_argument("--nodes", type=positive_int, metavar="K",
                   help=_NODES_HELP)
    p.add_argument("--json", action="store_true")


def add_simulate_args(p: argparse.ArgumentParser) -> None:
    _scenario_args(p, None)
    p.add_argument("--strategy", choices=("ckpt", "rep", "spare", "ladder"), required=True,
                   help="ladder: the recovery ladder (core.ladder) through a fault mix; "
                        "--redundancy is SPARe's r for masking (default 1: no masking)")
    p.add_argument("--redundancy", type=positive_int)
    p.add_argument("--seeds", type=positive_int, default=1, help="number of seeds")
    p.add_argument("--seed", type=nonneg_int, default=0, help="first seed")
    p.add_argument("--ckpt-every", type=_ckpt_every, default=None,
                   help="checkpoint every K steps, or 'auto' (from T_c*, the default)")
    p.add_argument("--budget", type=duration, default=120.0,
                   help="wall time for all seeds together (2m); a seed that runs out stops "
                        "with its TTT as a lower bound and says so")
    p.add_argument("--json", action="store_true")


def add_plan_args(p: argparse.ArgumentParser) -> None:
    from unbroken.sync import cli as sync_cli

    _scenario_args(p, 600)
    p.add_argument("--seeds", type=positive_int, default=5)
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--r-max", type=positive_int, default=20)
    p.add_argument("--jobs", type=positive_int, help="worker processes (default: all cores)")
    p.add_argument("--png", default="out/plan.png", help="where to write the figure")
    p.add_argument("--ladder", action="store_true",
                   help="also report the recovery ladder's ETTR at SPARe's best r")
    p.add_argument("--from", dest="from_learn", metavar="LEARN.json",
                   help="MTBF (per GPU), restart and checkpoint save measured by 'unbroken "
                        "learn --json'; flags given explicitly win")
    p.add_argument("--nodes", type=positive_int, metavar="K",
                   help=_NODES_HELP + " (at SPARe's best r; the fewest nodes for every r)")
    p.add_argument("--json", action="store_true")
    sync_cli.add_plan_args(p)  # --stragglers: the sync modes' plan instead of the sweep


def run(a: argparse.Namespace) -> dict:
    return {"theory": cmd_theory, "simulate": cmd_simulate, "plan": cmd_plan}[a.command](a)


def cmd_theory(a: argparse.Namespace) -> dict:
    from unbroken.core import placement, theory

    from unbroken.sim.montecarlo import controller_mc

    sc = _scenario(a)
    placement.check(sc.groups, a.redundancy)
    if a.nodes is not None:
        _check_nodes(sc.groups, a.nodes)  # before the Monte-Carlo, not after it
    mc = None
    if a.mc_trials > 0:
        mu = theory.mu(sc.groups, a.redundancy)
        with _progress(f"controller Monte-Carlo, {a.mc_trials} trial(s)",
                       int(a.mc_trials * mu)) as advance:
            mc = controller_mc(sc.groups, a.redundancy, a.mc_trials, budget_s=a.budget,
                               on_progress=lambda trial, k: advance(int(trial * mu) + k))
        if not mc.complete or mc.trials < a.mc_trials:
            sys.stderr.write(f"unbroken: warning: --budget {a.budget:g}s ended the controller "
                             f"Monte-Carlo after {mc.trials}/{a.mc_trials} trial(s) "
                             f"({mc.failures_seen} failures seen); the overhead excess "
                             "averages those\n")
    sp = theory.spare(sc, a.redundancy, excess=mc.excess_over_bound if mc else None,
                      mc_trials=0)
    rep = theory.replication(sc, min(a.redundancy, sc.groups))
    sp_sweep, rep_sweep = theory.spare_sweep(sc), theory.replication_sweep(sc)
    sp_best, rep_best = theory.best(sp_sweep), theory.best(rep_sweep)

    def paper_r(points):
        return min(points, key=lambda p: p.ttt_over_t0_paper).redundancy

    def keys(x, r_star, closed, points):
        return {"mu": x.mu, "overhead_lower_bound": x.overhead_lower_bound,
                "overhead": x.overhead, "r_star": r_star, "r_star_closed_form": closed,
                "r_star_paper": paper_r(points),
                "ckpt_period_s": x.ckpt_period_s, "ckpt_every_steps": x.ckpt_every_steps,
                "availability": x.availability, "ttt_over_t0": x.ttt_over_t0,
                "t_fail_s": x.t_fail_s, "restart_s": x.restart_s,
                "masked_overhead_s": x.masked_overhead_s,
                "availability_paper": x.availability_paper,
                "ttt_over_t0_paper": x.ttt_over_t0_paper}

    caveats = theory.caveats(sc, sp)
    for line in caveats:
        sys.stderr.write(f"unbroken: warning: {line}\n")
    out = {"groups": sc.groups, "redundancy": a.redundancy,
           **keys(sp, sp_best.redundancy, theory.r_star_closed_form(sc.groups), sp_sweep),
           "caveats": caveats,
           "young_s": theory.young(sc.t_save, sp.mu * sc.system_mtbf),
           "daly_s": theory.daly(sc.t_save, sp.mu * sc.system_mtbf, sc.t_restart),
           "mc_trials": a.mc_trials,
           "mc_trials_done": mc.trials if mc else 0,
           "mc_failures_seen": mc.failures_seen if mc else 0,
           "replication": keys(rep, rep_best.redundancy, None, rep_sweep)}
    if a.nodes is not None:
        out["nodes"] = _nodes(sc.groups, a.redundancy, a.nodes)
    return out


def cmd_simulate(a: argparse.Namespace) -> dict:
    from unbroken.sim import engine
    from unbroken.sim.sweep import Job, run_budgeted, summarize

    sc = _scenario(a)
    if a.strategy == "ladder":
        from unbroken.plan import ladder_summary

        return ladder_summary(sc, a.redundancy or 1, a.seeds, a.seed, ckpt_every=a.ckpt_every)
    if a.strategy == "ckpt":
        if a.redundancy not in (None, 1):
            raise UsageError(f"--redundancy {a.redundancy} conflicts with --strategy ckpt "
                             "(checkpoint/restart has no redundancy)")
        r = 1
    elif a.redundancy is None:
        raise UsageError(f"--redundancy is required for --strategy {a.strategy}")
    else:
        r = a.redundancy
    engine.validate(sc, a.strategy, r)
    t0 = time.perf_counter()
    jobs = [Job(a.strategy, r, s, a.ckpt_every) for s in range(a.seed, a.seed + a.seeds)]
    with _progress(f"simulating {a.seeds} seed(s)", a.seeds * sc.steps) as advance:
        results = run_budgeted(sc, jobs, a.budget,
                               lambda i, step: advance(i * sc.steps + step))
    out = {"strategy": a.strategy, "groups": sc.groups, "redundancy": r, **summarize(results),
           "completed": all(x.completed for x in results),
           "stopped": [x.stopped for x in results], "budget_s": a.budget}
    for x in results:
        if x.stopped == "budget":
            sys.stderr.write(f"unbroken: warning: seed {x.seed} ran out of its share of --budget "
                             f"{a.budget:g}s at {x.progress:.1%} of {sc.steps} steps: its "
                             "TTT/T0 is a lower bound (raise --budget or lower --steps)\n")
    out["wall_s"] = time.perf_counter() - t0
    return out


def _progress(what: str, total: int):
    """A rich progress bar on stderr (gone when done); yields ``advance(completed)``."""
    from contextlib import contextmanager

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TimeElapsedColumn

    @contextmanager
    def bar():
        with Progress("[progress.description]{task.description}", BarColumn(),
                      TaskProgressColumn(), TimeElapsedColumn(), console=Console(stderr=True),
                      transient=True) as prog:
            task = prog.add_task(what, total=total)
            yield lambda done: prog.update(task, completed=done)
    return bar()


def cmd_plan(a: argparse.Namespace) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from unbroken.plan import PlanRequest, caps, check, jobs_for, make_plan
    from unbroken.plot import check_writable, plan_figure

    if a.stragglers:  # the sync modes' plan for a straggler profile, not the redundancy sweep
        from unbroken.sync import cli as sync_cli

        return sync_cli.plan(a, _scenario(a))
    learned = None
    if a.from_learn:
        from unbroken.learn.planfrom import apply_learned

        learned = apply_learned(a, a.from_learn)
    req = PlanRequest(_scenario(a), seeds=a.seeds, seed=a.seed, r_max=a.r_max, workers=a.jobs,
                      ladder=a.ladder)
    if req.r_max < 2:
        raise UsageError(f"--r-max {a.r_max} leaves nothing to sweep (need at least 2)")
    check(req)
    if a.nodes is not None:
        _check_nodes(req.scenario.groups, a.nodes)  # before the sweep, not after it
    check_writable(a.png)  # before the sweep, not after it
    for line in caps(req):
        sys.stderr.write(f"unbroken: note: {line}\n")
    err = Console(stderr=True)
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                  transient=a.json) as prog:
        task = prog.add_task("simulating", total=len(jobs_for(req)))
        plan = make_plan(req, on_done=lambda _res: prog.advance(task))
    try:
        plan["png"] = str(plan_figure(plan, a.png))
    except OSError as e:  # checked above; still possible (disk full, a race): one line
        raise UsageError(f"--png {a.png!r} could not be written: {e.strerror or e}") from None
    if learned is not None:
        plan["from_learn"] = learned
    if a.nodes is not None:
        from unbroken.plan import nodes_needed_by_r

        plan["nodes"] = _nodes(req.scenario.groups, plan["spare"]["best"]["redundancy"], a.nodes)
        plan["nodes"]["needed_by_r"] = nodes_needed_by_r(req)
    return plan


def show(con, a: argparse.Namespace, data: dict) -> None:
    from unbroken import console as view

    if a.command == "plan" and "stragglers" in data:
        from unbroken.sync import cli as sync_cli

        sync_cli.show_plan(con, data)
        return
    if data.get("strategy") == "ladder":  # simulate --strategy ladder
        from unbroken.plan import ladder_lines

        con.print("\n".join(ladder_lines(data)), highlight=False)
        return
    {"theory": view.theory_table, "simulate": view.simulate_table,
     "plan": view.plan_tables}[a.command](data, con)
    if "nodes" in data:
        con.print("\n".join(view.node_lines(data["nodes"])), highlight=False)
    if "ladder" in data and a.command == "plan":
        from unbroken.plan import ladder_lines

        con.print("\n".join(ladder_lines(data["ladder"])), highlight=False)
