"""The ``unbroken`` command: parse, call, print. Decisions live in unbroken.core.

Exit codes (``unbroken.protocol.ExitCode``): 0 success, 1 the run could not finish (a worker
error, no survivor left; the reason on stderr), 2 bad input (one line on stderr naming the bad
value, no traceback, nothing started), 5 the members found the supervisor silent and stopped
with a checkpoint, 6 the guard's ladder gave up, 7 ``--resume`` found nothing to resume,
130 / 143 stopped by Ctrl-C / SIGTERM with a checkpoint; ``agent``: 0 told to exit, 2 bad
input (an unreachable coordinator, a node index claimed twice), 5 the coordinator's store went
away, 10 fenced (declared lost by the coordinator). A ``--nodes`` placement that cannot
keep a node loss safe is a warning (the nodes it would take), exit 0; ``--nodes`` above the
number of groups is bad input, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from unbroken.core.units import parse_duration
from unbroken.protocol import ExitCode

EXIT_USAGE = ExitCode.USAGE


class UsageError(Exception):
    """Bad input found after parsing (a conflict, a value out of range)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        sys.stderr.write(f"unbroken: error: {message}\n")
        sys.exit(EXIT_USAGE)


def _number(cast, ok, want: str):
    """An argparse type: ``cast`` the text, accept it when ``ok``, else name it and ``want``."""
    def convert(text: str):
        try:
            v = cast(text)
        except ValueError:
            v = None
        if v is None or not ok(v):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return v
    return convert


_positive_int = _number(int, lambda v: v >= 1, "a positive integer")
_nonneg_int = _number(int, lambda v: v >= 0, "an integer >= 0")
_fraction = _number(float, lambda v: 0 <= v < 1, "a number in [0, 1)")
_positive_float = _number(float, lambda v: 0 < v < float("inf"), "a positive number")
_finite_float = _number(float, lambda v: abs(v) < float("inf"), "a finite number")


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _duration0(text: str) -> float:
    try:
        return parse_duration(text, allow_zero=True)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _ckpt_every(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer or 'auto', got {text!r}") from None


def _scenario_args(p: argparse.ArgumentParser, groups_default: int | None) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--groups", type=_positive_int, default=groups_default,
                   required=groups_default is None, help="data-parallel groups N")
    g.add_argument("--gpus", type=_positive_int, default=600_000, help="total GPUs")
    g.add_argument("--mtbf", type=_duration, help="system MTBF (default 5m)")
    g.add_argument("--gpu-mtbf", type=_duration,
                   help="MTBF of one GPU instead of --mtbf (system MTBF = this / gpus)")
    g.add_argument("--restart", type=_duration0, default=None, help="global restart (60m)")
    g.add_argument("--ckpt-save", type=_duration0, default=None, help="checkpoint save (60s)")
    g.add_argument("--steps", type=_positive_int, default=10_000)
    g.add_argument("--step-time", type=_duration, default=64.0,
                   help="compute per stack (64s)")
    g.add_argument("--allreduce", type=_duration, help="all-reduce time (default N/100 s)")
    g.add_argument("--fail", choices=("weibull", "exponential"), default="weibull")
    g.add_argument("--weibull-shape", type=_positive_float, help="Weibull k (default 0.78)")
    g.add_argument("--jitter", type=_fraction, default=0.05,
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
                       weibull_shape=a.weibull_shape if a.weibull_shape is not None else 0.78)


#: Scenario fields as the flags that set them, for error lines that name what the user typed.
_FLAGS = {"groups": "--groups", "gpus": "--gpus", "steps": "--steps",
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


def _job_args(p: argparse.ArgumentParser, *, steps: int, out: str) -> None:
    """The options ``run`` and its ``demo`` preset share (the fault-tolerance settings)."""
    p.add_argument("--groups", type=_int, default=4, help="data-parallel groups (>= 2)")
    p.add_argument("--redundancy", type=_int, default=2, help="shard types per group r")
    p.add_argument("--steps", type=_int, default=steps)
    p.add_argument("--seed", type=_nonneg_int, default=0)
    p.add_argument("--faults", default=None,
                   help="a fire drill: kind:group@step,... (kill, hang, slow, stall, nan, "
                        "flip, xid[N], update@step) or 'none'; demo default: a kill, a hang "
                        "and two failures close together")
    p.add_argument("--stragglers", default=None, metavar="SPEC",
                   help="slow groups down by a trace: persistent:G@F[,persistent:G@F...] (group "
                        "G F times slower), bursty:SEED, rotating:P[@F], a CSV file of "
                        "step,group,slowdown rows, or 'none'")
    p.add_argument("--sync", default="sync", metavar="MODE",
                   help="sync mode, switchable at a step boundary: sync (default), mask (leave "
                        "a predicted-late group out like a failed one; its types go to their "
                        "other hosts: the synchronous gradient), ksync:K (commit with the K "
                        "predicted fastest groups, the others' samples deferred to later steps, "
                        "each used once), groups (STAR's dynamic groups: clusters by predicted "
                        "step time, the fastest synchronous, the others deliver stale gradients "
                        "computed in the background), async (every group its own cluster), auto "
                        "(choose sync, mask or ksync:K online by predicted time to accuracy)")
    p.add_argument("--selector", default=None, metavar="FILE",
                   help="with --sync auto: choose the mode with STAR's ML selector from this "
                        "model file (unbroken sync train-selector --runtime) instead of the "
                        "time-to-accuracy heuristic")
    p.add_argument("--target-loss", type=_finite_float, default=None, metavar="L",
                   help="report the time the loss (of a whole data step) first reaches L (tta_s)")
    p.add_argument("--chaos", type=_nonneg_int, default=None, metavar="SEED",
                   help="a seeded mix of every fault kind (kill, hang, slow, nan, bit flip, "
                        "XID, bad code update); implies --guard act")
    p.add_argument("--chaos-faults", type=_int, default=None, metavar="K",
                   help="with --chaos: K faults instead of one of each, slots failing again "
                        "and again (a soak)")
    p.add_argument("--spares", type=_int, default=None,
                   help="warm standby processes (default: one per scheduled fault)")
    p.add_argument("--standby-p", type=float, default=None, metavar="P",
                   help="size the warm pool as the P99 of Binomial(groups, P), P = a group's "
                        "failure probability per refill window (instead of --spares)")
    p.add_argument("--staleness", type=_positive_float, default=0.3,
                   help="heartbeat silence that marks a group hung (s)")
    p.add_argument("--supervisor-staleness", type=_positive_float, default=5.0,
                   help="members stop with a checkpoint (exit 5) when the supervisor has been "
                        "silent (stopped, wedged) this long (s)")
    p.add_argument("--local-nodes", type=_int, default=0, metavar="K",
                   help="run the groups under K node agents on this machine, each a process "
                        "tree of its own (unbroken.nodes; a node:I@S fault kills agent I with "
                        "everything it started); K > groups: exit 2")
    p.add_argument("--nodes", type=_int, default=0, metavar="K",
                   help="run the groups under K node agents started on other machines with "
                        "`unbroken agent --coordinator THIS_HOST:PORT` (PORT: --listen); they "
                        "outlive a restart; --out must be on a filesystem every node mounts at "
                        "the same path")
    p.add_argument("--listen", type=_int, default=0, metavar="PORT",
                   help="with --nodes: the port the agents are given (0: any free one, "
                        "printed); one that cannot be listened on: exit 2")
    p.add_argument("--node-staleness", type=_positive_float, default=1.0,
                   help="with node agents: an agent silent this long (cut off) loses its node")
    p.add_argument("--ckpt-every", type=_int, default=None,
                   help="durable checkpoint every K steps (default 50, 10 with --chaos)")
    p.add_argument("--metrics-port", type=_int, default=None,
                   help="serve ETTR and fault metrics for Prometheus on this port (0: any)")
    p.add_argument("--xid-log", default=None,
                   help="kernel-log file to watch for GPU XID lines")
    p.add_argument("--guard", choices=("log", "act"), default=None,
                   help="log (default): detections and ladder decisions are journaled only; "
                        "act: the ladder's decisions are carried out")
    p.add_argument("--ladder", default=None, metavar="SPEC",
                   help="ladder policy overrides: rung attempts and budgets, e.g. "
                        "'retry=1,rollback=0,time_budget=600'")
    p.add_argument("--sdc-every", type=_int, default=None,
                   help="bitwise check of redundant hosts every K steps (0: off; default: "
                        "--ckpt-every when a bit flip is scheduled)")
    p.add_argument("--out", default=out, help="journal, checkpoints, figure")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its newest valid checkpoint (exit 7 "
                        "when there is none)")
    p.add_argument("--json", action="store_true")


def _job_kwargs(a: argparse.Namespace) -> dict:
    """The JobSpec's fields from the flags; ``ft``: the FTConfig from the flags."""
    from unbroken.supervise.spec import FTConfig

    ft = FTConfig(redundancy=a.redundancy, spares=a.spares, standby_p=a.standby_p,
                  staleness=a.staleness, supervisor_staleness=a.supervisor_staleness,
                  ckpt_every=a.ckpt_every, metrics_port=a.metrics_port, xid_log=a.xid_log,
                  sdc_every=a.sdc_every, ladder=a.ladder, node_staleness=a.node_staleness,
                  guard=a.guard or ("act" if a.chaos is not None else "log"))
    return dict(groups=a.groups, steps=a.steps, seed=a.seed, faults=a.faults, chaos=a.chaos,
                chaos_faults=a.chaos_faults, out=a.out, resume=a.resume, ft=ft,
                stragglers=a.stragglers, target_loss=a.target_loss, local_nodes=a.local_nodes,
                nodes=a.nodes, listen=a.listen,
                sync=a.sync, selector=a.selector)


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


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="unbroken", description="Keep LLM pretraining running through failures.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    th = sub.add_parser("theory", help="closed forms for SPARe and replication")
    _scenario_args(th, None)
    th.add_argument("--redundancy", type=_positive_int, required=True)
    th.add_argument("--mc-trials", type=_nonneg_int, default=8,
                    help="Monte-Carlo runs of the real controller for the overhead excess")
    th.add_argument("--budget", type=_duration, default=10.0,
                    help="wall time for that Monte-Carlo (10s); the closed forms are instant, "
                         "a Monte-Carlo cut short says how far it got")
    th.add_argument("--nodes", type=_positive_int, metavar="K",
                    help=_NODES_HELP)
    th.add_argument("--json", action="store_true")

    sim = sub.add_parser("simulate", help="discrete-event simulation of one configuration")
    _scenario_args(sim, None)
    sim.add_argument("--strategy", choices=("ckpt", "rep", "spare", "ladder"), required=True,
                     help="ladder: the recovery ladder (core.ladder) through a fault mix; "
                          "--redundancy is SPARe's r for masking (default 1: no masking)")
    sim.add_argument("--redundancy", type=_positive_int)
    sim.add_argument("--seeds", type=_positive_int, default=1, help="number of seeds")
    sim.add_argument("--seed", type=_nonneg_int, default=0, help="first seed")
    sim.add_argument("--ckpt-every", type=_ckpt_every, default=None,
                     help="checkpoint every K steps, or 'auto' (from T_c*, the default)")
    sim.add_argument("--budget", type=_duration, default=120.0,
                     help="wall time for all seeds together (2m); a seed that runs out stops "
                          "with its TTT as a lower bound and says so")
    sim.add_argument("--json", action="store_true")

    pl = sub.add_parser("plan", help="best redundancy and checkpoint interval per strategy")
    _scenario_args(pl, 600)
    pl.add_argument("--seeds", type=_positive_int, default=5)
    pl.add_argument("--seed", type=_nonneg_int, default=0)
    pl.add_argument("--r-max", type=_positive_int, default=20)
    pl.add_argument("--jobs", type=_positive_int, help="worker processes (default: all cores)")
    pl.add_argument("--png", default="out/plan.png", help="where to write the figure")
    pl.add_argument("--ladder", action="store_true",
                    help="also report the recovery ladder's ETTR at SPARe's best r")
    pl.add_argument("--from", dest="from_learn", metavar="LEARN.json",
                    help="MTBF (per GPU), restart and checkpoint save measured by 'unbroken "
                         "learn --json'; flags given explicitly win")
    pl.add_argument("--nodes", type=_positive_int, metavar="K",
                    help=_NODES_HELP + " (at SPARe's best r; the fewest nodes for every r)")
    pl.add_argument("--json", action="store_true")
    from unbroken.sync import cli as sync_cli

    sync_cli.add_plan_args(pl)

    ru = sub.add_parser("run", help="train your own model through failures (the supervisor)")
    ru.add_argument("--trainer", required=True, metavar="PKG.MOD:FACTORY",
                    help="an importable factory(cfg, **trainer_args) returning a "
                         "unbroken.ModuleTrainer or any TrainerLike; or 'gpt' / 'mlp'")
    ru.add_argument("--trainer-args", default="{}", metavar="JSON",
                    help="the factory's keyword arguments (model hyperparameters), a JSON "
                         "object")
    ru.add_argument("--shard-size", type=_int, default=8,
                    help="samples per shard type per step (each group's micro-batch)")
    _job_args(ru, steps=200, out="out/run")
    ru.add_argument("--fresh", action="store_true",
                    help="start over in an --out that holds a run (it is moved aside, kept)")

    de = sub.add_parser("demo", help="train a small GPT on 4 groups through real faults "
                                     "(a preset of run)")
    _job_args(de, steps=200, out="out/demo")

    ag = sub.add_parser("agent", help="a node agent: start this machine's groups and spares "
                                      "for the coordinator, report their deaths at once")
    from unbroken.nodes.agent import build_parser as agent_args

    agent_args(ag)
    le = sub.add_parser("learn", help="operations analytics over a cluster's metrics and "
                                      "history (precursors, checkpoint I/O, exclusions, "
                                      "retry chains, numbers for plan)")
    _learn_args(le)
    sy = sub.add_parser("sync", help="straggler-tolerant sync modes (STAR): train and evaluate "
                                     "the straggler predictor and the ML mode selector")
    sync_cli.add_args(sy)
    return p


def _learn_args(le: argparse.ArgumentParser) -> None:
    src = le.add_mutually_exclusive_group()
    src.add_argument("--prometheus", metavar="URL", help="a Prometheus server (query_range)")
    src.add_argument("--openmetrics", nargs="+", metavar="FILE",
                     help="OpenMetrics text files with timestamps (plain or gzip)")
    le.add_argument("--kernel-log", nargs="+", metavar="FILE", default=[],
                    help="kernel logs with XID lines (syslog or dmesg --time-format iso)")
    le.add_argument("--sacct", metavar="FILE", help="sacct --parsable2 output")
    le.add_argument("--journal", metavar="DIR", help="an unbroken run directory (journal)")
    le.add_argument("--from", dest="t_from", metavar="T", help="start (ISO time or epoch s)")
    le.add_argument("--to", dest="t_to", metavar="T", help="end (ISO time or epoch s)")
    le.add_argument("--detector", metavar="FILE",
                    help="a detector file from 'learn fit' (default: the one shipped, fitted "
                         "on synthetic clusters; never fitted on this input)")
    le.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    le.add_argument("--json", action="store_true")
    acts = le.add_subparsers(dest="action", parser_class=_Parser)
    sy = acts.add_parser("synth", help="write a synthetic cluster (metrics, kern.log, sacct, "
                                       "truth.json)")
    sy.add_argument("--seed", type=_nonneg_int, default=0)
    sy.add_argument("--out", required=True, metavar="DIR")
    sy.add_argument("--nodes", type=_positive_int, default=63)
    sy.add_argument("--days", type=_positive_float, default=3.0)
    sy.add_argument("--gpus", type=_positive_int, default=2, help="GPUs per node (2, up to 8)")
    sy.add_argument("--failures", type=_nonneg_int, default=10)
    sy.add_argument("--shapes", default="report", metavar="FAMILY",
                    help="early precursors' family: report, step, drift, oscillation, burst, "
                         "single (report)")
    sy.add_argument("--early", type=_nonneg_int, default=2,
                    help="failures with an early precursor (2)")
    sy.add_argument("--silent", type=_nonneg_int, default=0,
                    help="failures with no precursor at all (0)")
    sy.add_argument("--json", action="store_true")
    fi = acts.add_parser("fit", help="fit the precursor detector on synthetic clusters (never "
                                     "the one scored); write the detector file")
    fi.add_argument("--out", required=True, metavar="FILE")
    fi.add_argument("--families", default="report,step,drift,oscillation,burst,single",
                    help="precursor families to fit on (all)")
    fi.add_argument("--seeds", default="1000-1003", help="seeds per family: A-B or a,b,c")
    fi.add_argument("--nodes", type=_positive_int, default=24)
    fi.add_argument("--days", type=_positive_float, default=2.0)
    fi.add_argument("--gpus", type=_positive_int, default=8)
    fi.add_argument("--failures", type=_nonneg_int, default=10)
    fi.add_argument("--early", type=_nonneg_int, default=3)
    fi.add_argument("--silent", type=_nonneg_int, default=2)
    fi.add_argument("--fp-budget", type=_number(float, lambda v: v >= 0, "a number >= 0"),
                    default=1.0, help="false alarms per day (1.0)")
    fi.add_argument("--margin", type=_number(float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
                    default=0.75, help="fit to this share of the budget (0.75)")
    fi.add_argument("--json", action="store_true")
    ru = acts.add_parser("rules", help="the calibrated detector and the memory/thermal rules "
                                       "as Prometheus alerting and recording rules (YAML)")
    ru.add_argument("--from-learn", metavar="LEARN.json",
                    help="take the calibrated detector from a 'learn --json' result")
    ru.add_argument("--out", metavar="FILE", help="write here instead of stdout")
    ru.add_argument("--json", action="store_true")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


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
           "young_s": theory.young(sc.t_save, sp.mu * sc.mtbf),
           "daly_s": theory.daly(sc.t_save, sp.mu * sc.mtbf, sc.t_restart),
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


def _live(a: argparse.Namespace, groups: int, steps: int, go):
    """Run ``go(view, emit_line)`` under the live view (a terminal) or with one line per
    event on stderr (piped), or silently with --json."""
    from rich.console import Console
    from rich.live import Live

    from unbroken.demo_view import LiveView

    err = Console(stderr=True)
    view = LiveView({"groups": groups, "steps": steps})
    if err.is_terminal and not a.json:
        with Live(view, console=err, refresh_per_second=8):
            return go(view, None)
    return go(view, None if a.json else err.print)


def cmd_run(a: argparse.Namespace) -> dict:
    from unbroken.supervise import JobSpec, Supervisor

    try:
        args = json.loads(a.trainer_args)
    except ValueError:
        raise UsageError(f"--trainer-args {a.trainer_args!r}: not JSON") from None
    if not isinstance(args, dict):
        raise UsageError(f"--trainer-args {a.trainer_args!r}: expected a JSON object (the "
                         f"factory's keyword arguments)")
    spec = JobSpec(trainer=a.trainer, trainer_args=args, shard_size=a.shard_size,
                   fresh=a.fresh, **_job_kwargs(a))
    sup = Supervisor(spec)
    sup.check()  # bad input (the trainer included): one line before any process starts
    _node_warning(spec)

    def go(view, emit_line):
        sup.view, sup.emit_line = view, emit_line
        return sup.run()
    res = _live(a, spec.groups, spec.steps, go)
    if res.code != 0:
        raise _Stopped(res.message, int(res.code), res.report)
    return res.report


def cmd_demo(a: argparse.Namespace) -> dict:
    from unbroken.demo import DemoExit, check, demo_spec, run_demo

    spec = demo_spec(**_job_kwargs(a))
    check(spec)  # bad input: one line before any process starts
    _node_warning(spec)
    try:
        return _live(a, spec.groups, spec.steps,
                     lambda view, emit_line: run_demo(spec, view=view, emit_line=emit_line))
    except DemoExit as e:
        raise _Stopped(str(e), e.code, e.report) from None


def _node_warning(spec) -> None:
    """With node agents, a placement that cannot keep a node loss safe is a warning."""
    from unbroken.supervise.spec import node_warning

    if (spec.local_nodes or spec.nodes) and (warn := node_warning(spec)):
        flag = "--local-nodes" if spec.local_nodes else "--nodes"
        sys.stderr.write(f"unbroken: warning: {flag} {warn}\n")


def cmd_agent(a: argparse.Namespace) -> int:
    from unbroken.nodes.agent import AgentError, run

    try:
        return run(a)
    except AgentError as e:
        raise UsageError(str(e)) from None


def cmd_sync(a: argparse.Namespace) -> dict:
    from unbroken.sync import cli as sync_cli

    return sync_cli.run(a)


def cmd_learn(a: argparse.Namespace) -> dict:
    from unbroken.learn import cli as learn_cli

    return learn_cli.run(a)


class _Stopped(Exception):
    """The run ended on purpose with a documented exit code (protocol.ExitCode)."""

    def __init__(self, message: str | None, code: int, report: dict | None) -> None:
        super().__init__(message or f"exit {code}")
        self.code, self.report = code, report


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from unbroken.core.placement import PlacementError
    from unbroken.core.scenario import ScenarioError
    from unbroken.metrics import MetricsError
    from unbroken.supervise.outdir import NoResumePoint
    from unbroken.supervise.outcome import RunError

    a = build_parser().parse_args(argv)
    cmds = {"theory": cmd_theory, "simulate": cmd_simulate, "plan": cmd_plan, "demo": cmd_demo,
            "run": cmd_run, "learn": cmd_learn, "sync": cmd_sync, "agent": cmd_agent}
    try:
        data = cmds[a.command](a)
        if a.command == "agent":  # its exit code: 0 told to exit, 5, 10 (unbroken.nodes.agent)
            return int(data)
    except NoResumePoint as e:
        sys.stderr.write(f"unbroken: error: {e}\n")
        return ExitCode.NO_RESUME_POINT
    except (UsageError, PlacementError, ScenarioError, ValueError, MetricsError) as e:
        sys.stderr.write(f"unbroken: error: {e}\n")
        return ExitCode.USAGE
    except _Stopped as e:  # on purpose: its documented code, the report with --json
        sys.stderr.write(f"unbroken: {a.command} stopped: {e}\n")
        if a.json and e.report is not None:
            print(json.dumps(e.report, indent=None, default=float))
        return e.code
    except RunError as e:  # the run could not finish
        sys.stderr.write(f"unbroken: {a.command} failed: {e}\n")
        return ExitCode.FAILED
    except KeyboardInterrupt:  # a second Ctrl-C, or one outside a run: no traceback
        sys.stderr.write(f"unbroken: {a.command} interrupted\n")
        return ExitCode.INTERRUPTED
    if a.json:
        print(json.dumps(data, indent=None, default=float))
        return 0
    from unbroken import console as view

    con = Console()
    if a.command == "learn":
        from unbroken.learn import cli as learn_cli

        learn_cli.show(con, a, data)
        return 0
    if a.command == "sync" or (a.command == "plan" and "stragglers" in data):
        from unbroken.sync import cli as sync_cli

        if a.command == "sync":
            sync_cli.show(con, a, data)
        else:
            sync_cli.show_plan(con, data)
        return 0
    if a.command in ("demo", "run"):
        from unbroken.demo_report import print_report

        print_report(con, data, title=a.command.capitalize())
        return 0
    if data.get("strategy") == "ladder":  # simulate --strategy ladder
        from unbroken.plan import ladder_lines

        con.print("\n".join(ladder_lines(data)), highlight=False)
        return 0
    {"theory": view.theory_table, "simulate": view.simulate_table,
     "plan": view.plan_tables}[a.command](data, con)
    if "nodes" in data:
        con.print("\n".join(view.node_lines(data["nodes"])), highlight=False)
    if "ladder" in data and a.command == "plan":
        from unbroken.plan import ladder_lines

        con.print("\n".join(ladder_lines(data["ladder"])), highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
