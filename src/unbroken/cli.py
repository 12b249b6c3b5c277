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

from unbroken.cliargs import Parser, UsageError, finite_float, integer, nonneg_int, positive_float
from unbroken.protocol import ExitCode


def _job_args(p: argparse.ArgumentParser, *, steps: int, out: str) -> None:
    """The options ``run`` and its ``demo`` preset share (the fault-tolerance settings)."""
    p.add_argument("--groups", type=integer, default=4, help="data-parallel groups (>= 2)")
    p.add_argument("--redundancy", type=integer, default=2, help="shard types per group r")
    p.add_argument("--steps", type=integer, default=steps)
    p.add_argument("--seed", type=nonneg_int, default=0)
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
    p.add_argument("--target-loss", type=finite_float, default=None, metavar="L",
                   help="report the time the loss (of a whole data step) first reaches L (tta_s)")
    p.add_argument("--chaos", type=nonneg_int, default=None, metavar="SEED",
                   help="a seeded mix of every fault kind (kill, hang, slow, nan, bit flip, "
                        "XID, bad code update); implies --guard act")
    p.add_argument("--chaos-faults", type=integer, default=None, metavar="K",
                   help="with --chaos: K faults instead of one of each, slots failing again "
                        "and again (a soak)")
    p.add_argument("--spares", type=integer, default=None,
                   help="warm standby processes (default: one per scheduled fault)")
    p.add_argument("--standby-p", type=float, default=None, metavar="P",
                   help="size the warm pool as the P99 of Binomial(groups, P), P = a group's "
                        "failure probability per refill window (instead of --spares)")
    p.add_argument("--staleness", type=positive_float, default=0.3,
                   help="heartbeat silence that marks a group hung (s)")
    p.add_argument("--supervisor-staleness", type=positive_float, default=5.0,
                   help="members stop with a checkpoint (exit 5) when the supervisor has been "
                        "silent (stopped, wedged) this long (s)")
    p.add_argument("--local-nodes", type=integer, default=0, metavar="K",
                   help="run the groups under K node agents on this machine, each a process "
                        "tree of its own (unbroken.nodes; a node:I@S fault kills agent I with "
                        "everything it started); K > groups: exit 2")
    p.add_argument("--nodes", type=integer, default=0, metavar="K",
                   help="run the groups under K node agents started on other machines with "
                        "`unbroken agent --coordinator THIS_HOST:PORT` (PORT: --listen); they "
                        "outlive a restart; --out must be on a filesystem every node mounts at "
                        "the same path")
    p.add_argument("--listen", type=integer, default=0, metavar="PORT",
                   help="with --nodes: the port the agents are given (0: any free one, "
                        "printed); one that cannot be listened on: exit 2")
    p.add_argument("--node-staleness", type=positive_float, default=1.0,
                   help="with node agents: an agent silent this long (cut off) loses its node")
    p.add_argument("--ckpt-every", type=integer, default=None,
                   help="durable checkpoint every K steps (default 50, 10 with --chaos)")
    p.add_argument("--metrics-port", type=integer, default=None,
                   help="serve ETTR and fault metrics for Prometheus on this port (0: any)")
    p.add_argument("--xid-log", default=None,
                   help="kernel-log file to watch for GPU XID lines")
    p.add_argument("--guard", choices=("log", "act"), default=None,
                   help="log (default): detections and ladder decisions are journaled only; "
                        "act: the ladder's decisions are carried out")
    p.add_argument("--ladder", default=None, metavar="SPEC",
                   help="ladder policy overrides: rung attempts and budgets, e.g. "
                        "'retry=1,rollback=0,time_budget=600'")
    p.add_argument("--sdc-every", type=integer, default=None,
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


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="unbroken", description="Keep LLM pretraining running through failures.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    from unbroken.sim import cli as plan_cli
    from unbroken.sync import cli as sync_cli

    plan_cli.add_theory_args(sub.add_parser("theory",
                                            help="closed forms for SPARe and replication"))
    plan_cli.add_simulate_args(sub.add_parser(
        "simulate", help="discrete-event simulation of one configuration"))
    plan_cli.add_plan_args(sub.add_parser(
        "plan", help="best redundancy and checkpoint interval per strategy"))

    ru = sub.add_parser("run", help="train your own model through failures (the supervisor)")
    ru.add_argument("--trainer", required=True, metavar="PKG.MOD:FACTORY",
                    help="an importable factory(cfg, **trainer_args) returning a "
                         "unbroken.ModuleTrainer or any TrainerLike; or 'gpt' / 'mlp'")
    ru.add_argument("--trainer-args", default="{}", metavar="JSON",
                    help="the factory's keyword arguments (model hyperparameters), a JSON "
                         "object")
    ru.add_argument("--shard-size", type=integer, default=8,
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
    from unbroken.learn import cli as learn_cli

    learn_cli.add_args(le)
    sy = sub.add_parser("sync", help="straggler-tolerant sync modes (STAR): train and evaluate "
                                     "the straggler predictor and the ML mode selector")
    sync_cli.add_args(sy)
    return p


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


def cmd_plan_face(a: argparse.Namespace) -> dict:
    from unbroken.sim import cli as plan_cli

    return plan_cli.run(a)


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
    cmds = {"theory": cmd_plan_face, "simulate": cmd_plan_face, "plan": cmd_plan_face,
            "demo": cmd_demo, "run": cmd_run, "learn": cmd_learn, "sync": cmd_sync,
            "agent": cmd_agent}
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
    con = Console()
    if a.command == "learn":
        from unbroken.learn import cli as learn_cli

        learn_cli.show(con, a, data)
        return 0
    if a.command == "sync":
        from unbroken.sync import cli as sync_cli

        sync_cli.show(con, a, data)
        return 0
    if a.command in ("demo", "run"):
        from unbroken.demo_report import print_report

        print_report(con, data, title=a.command.capitalize())
        return 0
    from unbroken.sim import cli as plan_cli

    plan_cli.show(con, a, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
